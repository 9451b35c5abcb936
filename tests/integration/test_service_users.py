"""`signoff up` run as root (as CI runs it): each service is its own system user,
holding only its own key files and settings. The model-step
(on the agent's side) must not be able to read the CLI channel's key, the
ledger's keys, or any other service's password or secret; and a session still
goes through an approval end to end."""

import asyncio
import os
import pwd
import signal
import subprocess
import sys

import pytest

from services.operations.service_users import Interpreter, user_of
from shared import keyring
from shared.messages import mint
from shared.settings import PROJECT_ROOT
from tests.harness import SERVICES, next_event, start_and_wait_for_approval
from tests.integration.test_supervisor import Output, ready_pids, wait_until

# Secrets each service alone may see in its environment (the harness's tools read SINK_TOKEN).
PROVIDER_KEY = "sk-ant-model-steps-own-key-0123456789"
TOOL_SECRET = "sink-token-the-executors-own-secret"
OPEN = """
import sys
for path in sys.argv[1:]:
    try:
        open(path, "rb").read(1)
    except OSError:
        continue
    print(path)
"""


def readable_by(user: str, paths: list[str]) -> list[str]:
    """Which of `paths` the user can open, asked by a process running as that user."""
    entry = pwd.getpwnam(user)
    python = Interpreter()  # Python under /root (0700) too, as `signoff up` starts it
    run = subprocess.run(
        python.command("-S", "-c", OPEN, *paths), env=python.environment(), pass_fds=python.descriptors,
        user=entry.pw_uid, group=entry.pw_gid, extra_groups=os.getgrouplist(user, entry.pw_gid),
        capture_output=True, text=True, check=True, cwd="/")
    return run.stdout.split()


def uids(pid: int) -> set[int]:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Uid:"):
            return {int(v) for v in line.split()[1:]}
    raise AssertionError(f"no Uid line for {pid}")


def environment(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.skipif(os.geteuid() != 0, reason="`signoff up` drops privileges only when run as root (CI is root)")
async def test_signoff_up_as_root_runs_each_service_as_its_own_user_holding_only_its_own_keys_and_secrets(
        up_sqlite_deployment, sink):
    deployment = up_sqlite_deployment
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN=TOOL_SECRET, SIGNOFF_ANTHROPIC_API_KEY=PROVIDER_KEY)
    logs = deployment.data_dir / "up-logs"
    deployment.setup()  # the tests' people registered for the CLI's channel before the ledger reads channels.yaml
    up = subprocess.Popen([sys.executable, "-m", "services.operations.cli", "up", "--log-dir", str(logs)], env=deployment.env(),
                          cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(up)
    try:
        await asyncio.to_thread(wait_until, lambda: all(ready_pids(logs, s) for s in SERVICES), 150, "all four ready")
        keys = deployment.data_dir / "keys"
        every_secret = sorted(str(p) for p in keys.rglob("*") if p.is_file() and p.suffix in (".key", ".password"))
        assert str(keys / "channels" / "cli.key") in every_secret and str(keys / keyring.LEDGER_KEY) in every_secret
        assert str(keys / "redis" / "tool-executor.password") in every_secret
        copies = deployment.data_dir / "service-keys"
        for service in SERVICES:
            [pid] = ready_pids(logs, service)
            user = user_of(service)
            assert uids(pid) == {pwd.getpwnam(user).pw_uid}, f"{service} runs as {user}"
            own = {str(copies / service / name) for name in keyring.HELD_BY[service]
                   if (copies / service / name).exists()}
            assert own and readable_by(user, sorted(own)) == sorted(own), f"{service} reads its own keys"
            others = [str(p) for p in copies.rglob("*") if p.is_file() and str(p) not in own]
            assert readable_by(user, every_secret + others) == [], f"{service} reads no other key or password"
            env = environment(pid)
            assert "SIGNOFF_RABBITMQ_ADMIN_URL" not in env
            assert not [v for v in env.values() if "guest:guest@" in v], "no administrator's password"
            assert (PROVIDER_KEY in env.values()) == (service == "model-step"), "the provider's key: model-step's"
            assert (TOOL_SECRET in env.values()) == (service == "tool-executor"), "the tools' secrets: executor's"
            assert env["SIGNOFF_KEYS_DIR"] == str(copies / service)
        # In particular: the model-step (the agent's side) reads neither the CLI channel's key nor the ledger's.
        model = user_of("model-step")
        forbidden = [keys / "channels" / "cli.key", keys / keyring.LEDGER_KEY, keys / keyring.DIGEST_KEY,
                     copies / "approval-ledger" / keyring.LEDGER_KEY, copies / "approval-ledger" / keyring.DIGEST_KEY]
        assert readable_by(model, [str(p) for p in forbidden]) == []
        # And the approval still goes through, end to end.
        async with deployment.console() as console:
            events, requested = await start_and_wait_for_approval(console, mint("ses"))
            await console.respond(requested.request_id, "approve", "", "", "tester")
            completed = await next_event(events, "turn.completed", timeout=30)
            assert completed.text == "Posted."
        assert sink.counts["/sink"] == 1
    finally:
        up.send_signal(signal.SIGINT)
        assert output.exit_code() == 0, output.text
    assert "single-user development deployment" not in output.text


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become an ordinary user")
def test_signoff_up_as_an_ordinary_user_runs_one_user_and_says_it_is_a_single_user_development_deployment():
    from services.operations.service_users import single_user_warning
    from services.operations.supervisor import Supervisor
    from shared.settings import Settings

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # as `nobody`: what an ordinary user's `signoff up` decides and says
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            said = f"{Supervisor(Settings()).isolated}|{single_user_warning()}"
            os.write(write, said.encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    isolated, warning = os.read(read, 65536).decode().split("|", 1)
    assert isolated == "False", "an ordinary user's services all run as that user"
    assert warning.startswith("signoff: running as nobody, not root: this is a single-user development deployment")
    assert "Run `signoff up` as root" in warning
    assert Supervisor(Settings()).isolated, "as root, each service its own user"
    assert not Supervisor(Settings(single_user=True)).isolated, "unless told to be a single-user deployment"


def parent_of(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def command_line(pid: int) -> list[str]:
    return open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")


@pytest.mark.skipif(os.geteuid() != 0, reason="`signoff up` drops privileges only when run as root (CI is root)")
def test_signoff_up_as_root_restarts_a_killed_service_as_a_fork_of_a_warm_interpreter_of_its_own_user(
    up_sqlite_deployment,
):
    deployment = up_sqlite_deployment
    deployment.extra_env["SIGNOFF_METRICS_PORT"] = "0"
    logs = deployment.data_dir / "up-logs"
    deployment.setup()
    up = subprocess.Popen(
        [sys.executable, "-m", "services.operations.cli", "up", "--log-dir", str(logs)],
        env=deployment.env(),
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = Output(up)
    try:
        wait_until(lambda: all(ready_pids(logs, s) for s in SERVICES) or up.poll() is not None, 150, "all four ready")
        assert up.poll() is None, output.text
        for service in SERVICES:
            [first] = ready_pids(logs, service)
            server = parent_of(first)
            os.kill(first, signal.SIGKILL)
            wait_until(lambda s=service: len(ready_pids(logs, s)) == 2, 30, f"{service} restarted")
            again = ready_pids(logs, service)[-1]
            user = pwd.getpwnam(user_of(service)).pw_uid
            # Not a new interpreter: a fork of the service's warm server, which runs as its user too
            # and holds only its environment (no administrator's URL).
            assert parent_of(again) == server != up.pid, f"{service} forked from its warm server"
            assert "services.operations.warm_start" in command_line(server) and service in command_line(server)
            assert uids(again) == uids(server) == {user}, f"{service} and its warm server run as {user_of(service)}"
            assert "SIGNOFF_RABBITMQ_ADMIN_URL" not in environment(server)
    finally:
        up.send_signal(signal.SIGINT)
        assert output.exit_code() == 0, output.text
