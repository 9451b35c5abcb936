"""docker-compose.yml checked offline: each service container mounts
only its own keys volume, read-only, shares no volume with another service, and its
environment holds no password and no administrator's URL; the setup job alone holds
every key and the administrators' URLs, and hands each service its own files."""

import re
from urllib.parse import urlsplit

import yaml

from services.operations.warm_start import SERVICES
from shared.keyring import CHANNEL_ADAPTERS, HELD_BY, adapter_files
from shared.settings import PROJECT_ROOT

COMPOSE = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (PROJECT_ROOT / "deploy" / "Dockerfile").read_text()
ADMIN_SETTINGS = {"SIGNOFF_RABBITMQ_ADMIN_URL"}
SECRET_NAMES = re.compile(r"KEY$|PASSWORD|TOKEN|SECRET|AUTH")


def mounts(service: dict) -> list[tuple[str, str, str]]:
    """(source, target, mode) of each of a service's volumes (short syntax)."""
    found = []
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        found.append((source, target, mode[0] if mode else "rw"))
    return found


# Besides its keys: the executor reaches the tool launcher's socket (read-only; shared with the launcher alone).
LAUNCHER_SOCKET = ("tool-launcher", "/run/signoff-launcher", "ro")


def test_each_service_mounts_only_its_own_keys_read_only_and_shares_no_volume():
    services = COMPOSE["services"]
    seen: dict[str, str] = {}
    for name in SERVICES:
        service = services[name]
        expected = [(f"keys-{name}", "/keys", "ro")] + ([LAUNCHER_SOCKET] if name == "tool-executor" else [])
        assert mounts(service) == expected, f"{name} mounts only its own keys, read-only"
        assert service["environment"]["SIGNOFF_KEYS_DIR"] == "/keys"
        for source, _, _ in mounts(service):
            assert source not in seen, f"{name} shares {source} with {seen.get(source)}"
            seen[source] = name
    assert "signoff-keys" not in seen, "the folder of every key is no service's"


def test_no_service_is_told_a_password_or_an_administrators_url():
    for name in SERVICES:
        environment = COMPOSE["services"][name]["environment"]
        assert not ADMIN_SETTINGS & set(environment), name
        for variable, value in environment.items():
            assert not SECRET_NAMES.search(variable), f"{name} is given {variable}"
            for word in str(value).replace(",", " ").split():
                if "://" in word:
                    assert urlsplit(word).password is None, f"{name}'s {variable} holds a password"


def test_the_setup_job_alone_holds_every_key_and_hands_each_service_exactly_its_own_folder():
    setup = COMPOSE["services"]["setup"]
    assert ("signoff-keys", "/data", "rw") in mounts(setup)
    handed = {target: source for source, target, _ in mounts(setup) if target.startswith("/handout/")}
    adapters = [f"channel-{name}" for name in CHANNEL_ADAPTERS]
    assert handed == {f"/handout/{name}": f"keys-{name}" for name in [*SERVICES, *adapters]}
    assert setup["command"] == ["setup", "--hand-out", "/handout"]
    assert set(HELD_BY) == set(SERVICES)
    # The administrators' URLs: here, and in no service.
    assert urlsplit(setup["environment"]["SIGNOFF_REDIS_URL"]).password, "setup logs in to Redis as its administrator"
    for name, service in COMPOSE["services"].items():
        if name != "setup":
            assert "signoff-keys" not in [s for s, _, _ in mounts(service)], name


def test_redis_requires_a_password():
    redis = COMPOSE["services"]["redis"]
    assert "--requirepass" in redis["command"]


def test_the_executor_starts_python_tools_through_a_root_launcher_that_holds_nothing_else():
    """A python tool never runs as the executor's user (docs/design.md, "Trust boundaries"):
    the executor is told the launcher's socket, which is in a volume only the two mount;
    the launcher, root so that it can start a process as `signoff-tools`, mounts no key,
    is told no setting, may only switch users, kill and chown, and serves the image's
    user (the executor's) alone."""
    services = COMPOSE["services"]
    executor, launcher = services["tool-executor"], services["tool-launcher"]
    socket = executor["environment"]["SIGNOFF_TOOL_LAUNCHER"]
    volume, folder, _ = LAUNCHER_SOCKET
    assert socket.startswith(folder + "/")
    assert mounts(launcher) == [(volume, folder, "rw")], "the launcher mounts its socket's folder and no key"
    assert [name for name, service in services.items() if volume in [s for s, _, _ in mounts(service)]] == [
        "tool-executor",
        "tool-launcher",
    ], "no other container reaches the launcher"
    assert "environment" not in launcher and "env_file" not in launcher, "the launcher is told nothing"
    command = launcher["command"]
    assert command[0] == "tool-launcher"
    options = dict(zip(command[1::2], command[2::2], strict=True))
    image_user = re.search(r"useradd --create-home --uid (\d+) (\S+)", DOCKERFILE)
    assert options["--socket"] == socket and options["--client"] == image_user[2], "it serves the executor's user"
    assert re.search(r"useradd .*--uid (\d+) signoff-tools", DOCKERFILE.replace("\\\n", " ")), "the tools' user"
    assert launcher["user"] == "root" and launcher["cap_drop"] == ["ALL"]
    assert set(launcher["cap_add"]) <= {"SETUID", "SETGID", "KILL", "CHOWN"}
    assert "no-new-privileges:true" in launcher["security_opt"]
    assert executor["depends_on"]["tool-launcher"] == {"condition": "service_healthy"}
    # Everything else the executor depends on, as every service does.
    assert executor["depends_on"].items() >= services["approval-ledger"]["depends_on"].items()
    assert "user" not in executor, "the executor runs as the image's user"


def test_each_channel_adapter_mounts_only_its_own_keys_and_its_own_record_and_is_told_no_password():
    """`signoff channel run slack|email`: its channel's key and broker password, the console's
    read-only role (the cards it catches up on), nothing of any service."""
    for name in CHANNEL_ADAPTERS:
        service = COMPOSE["services"][name]
        assert service["command"] == ["channel", "run", name]
        assert mounts(service)[:2] == [(f"keys-channel-{name}", "/keys", "ro"), (f"{name}-state", "/state", "rw")]
        assert service["environment"]["SIGNOFF_KEYS_DIR"] == "/keys"
        assert service["profiles"] == [name], "started only when asked for"
        for variable, value in service["environment"].items():
            # A token or password is passed through from the operator's shell, never written here.
            if SECRET_NAMES.search(variable):
                assert re.fullmatch(r"\$\{[A-Z_]+:-\}", str(value)), f"{name}'s {variable} is written down"
        assert adapter_files(name) == (
            f"channels/{name}.key",
            f"rabbitmq/channel.{name}.password",
            "postgres/console.password",
        )
