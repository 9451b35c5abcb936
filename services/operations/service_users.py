"""`signoff up` run as root: each service as its own system user, holding only its own files.

The services trust one another only as far as docs/design.md's "Trust boundaries"
say: the model-step and the executor (and whatever tool runs inside it) are on
the agent's side. On one host, that holds only if no service process can read
another's keys, passwords or tool secrets. So, run as root, `signoff up` gives
each service

- its own system user, `signoff-<service>` (made if missing), with the shared
  group `signoff` for the data the services legitimately share: the data folder
  and, on SQLite, the ledger's file;
- its own copy of the files of the keys folder it holds (`keyring.HELD_BY`),
  owned by that user, mode 0600 in a folder of mode 0700; the keys folder itself
  stays root's (0700);
- an environment holding only its own settings: no administrator's URL or
  password, no other service's secrets (a provider's key only for the model-step,
  the tools' `${env:…}` only for the executor, the hooks' only for the publisher);
- a fresh interpreter started as that user (not a fork of root's supervisor, whose
  memory holds the whole environment it was started with): its warm server
  (`start_warm`), which imports the service once and forks it at each start and
  restart, so a restart after a crash costs a fork, not a new interpreter. Python itself may be
  installed where only root may enter (pyenv under /root, mode 0700): the
  supervisor opens the interpreter, its library folders and the code's folders,
  read-only, and hands the child those descriptors (`Interpreter`), so the child
  reads the install through them and nothing else of root's.

Run as an ordinary user, `signoff up` is a single-user development deployment and
says so at start.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from services.operations.warm_start import dying_with_this_process
from shared import keyring
from shared.catalogue import env_references, load_catalogue
from shared.settings import Settings, without_password

# The group of the data the services share (the data folder; on SQLite the ledger's file).
SHARED_GROUP = "signoff"
# Not a secret, needed to start and run Python and to reach the network as configured.
PLAIN_ENVIRONMENT = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "VIRTUAL_ENV",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)
# Settings only `signoff setup` uses: the administrator's.
ADMIN_SETTINGS = ("SIGNOFF_RABBITMQ_ADMIN_URL",)


def user_of(service: str) -> str:
    return f"signoff-{service}"


def single_user_warning() -> str:
    who = pwd.getpwuid(os.geteuid()).pw_name
    why = "SIGNOFF_SINGLE_USER is set" if os.geteuid() == 0 else "not root"
    return (
        f"signoff: running as {who}, {why}: this is a single-user development deployment. Every service "
        "runs as this user with one keys folder and one environment, so any of them (the model-step, a tool) "
        "can read every other's keys and passwords. Run `signoff up` as root to give each service its own "
        "system user and only its own files, or deploy with compose or Kubernetes (docs/deploying.md)."
    )


@dataclass(frozen=True)
class Account:
    service: str
    user: str
    uid: int
    gid: int
    shared_gid: int


def accounts(services: list[str]) -> dict[str, Account]:
    """Each service's system user, made if missing, in the shared group."""
    shared_gid = _group(SHARED_GROUP)
    made = {}
    for service in services:
        user = user_of(service)
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--home-dir",
                    "/nonexistent",
                    "--shell",
                    "/usr/sbin/nologin",
                    "--user-group",
                    "--groups",
                    SHARED_GROUP,
                    user,
                ],
                check=False,
                capture_output=True,
            )
            entry = pwd.getpwnam(user)  # made here, or at the same moment by another setup
        if user not in grp.getgrgid(shared_gid).gr_mem:
            subprocess.run(["usermod", "--append", "--groups", SHARED_GROUP, user], check=True, capture_output=True)
        made[service] = Account(service, user, entry.pw_uid, entry.pw_gid, shared_gid)
    return made


def _group(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", name], check=False, capture_output=True)
        return grp.getgrnam(name).gr_gid


def sqlite_files(settings: Settings) -> list[Path]:
    """The ledger's SQLite file and the files SQLite and the publisher keep beside it, on SQLite."""
    database = settings.sqlite_file
    if database is None:
        return []
    # With the publisher's relay lock beside it (services/publisher/leadership.py `only_relay`).
    tails = ("-wal", "-shm", ".publisher.lock")
    return [database, *(database.with_name(database.name + tail) for tail in tails)]


def share_data(settings: Settings, shared_gid: int) -> None:
    """The data folder (and the SQLite file's folder) shared by the group: it may
    create files there (SQLite's -wal and -shm), and the sticky bit keeps any one
    service from renaming or deleting what another owns (the keys folder, the logs);
    new files take the group (setgid). The keys folder stays root's alone."""
    folders = {settings.data_dir.resolve(), *(f.parent for f in sqlite_files(settings))}
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, 0, shared_gid)
        os.chmod(folder, 0o3770)
    keys = settings.keys_path.resolve()
    os.chown(keys, 0, 0)
    os.chmod(keys, 0o700)
    # On SQLite the file is every service's to open: each still reaches it only as
    # itself, but the file is shared (docs/design.md, "Not yet").
    for path in sqlite_files(settings):
        if path.exists():
            os.chown(path, 0, shared_gid)
            os.chmod(path, 0o660)


def hand_out_keys(settings: Settings, account: Account) -> Path:
    """A copy of the files `account`'s service holds, owned by its user alone:
    <data dir>/service-keys/<service>/, made anew at each start."""
    source = settings.keys_path.resolve()
    parent = settings.data_dir.resolve() / "service-keys"
    parent.mkdir(exist_ok=True)
    os.chown(parent, 0, 0)
    os.chmod(parent, 0o755)
    folder = parent / account.service
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(mode=0o700)
    for target in keyring.hand_out(source, account.service, folder):
        for owned in [target, *(p for p in target.parents if folder in p.parents)]:
            os.chown(owned, account.uid, account.gid)
    os.chown(folder, account.uid, account.gid)
    return folder


def environment_of(service: str, settings: Settings, keys: Path, environ: dict[str, str]) -> dict[str, str]:
    """The environment `service` is started with: the plain variables, the settings
    (without the administrator's URLs or passwords), its own secrets and no other's."""
    from services.model_step.settings import ModelStepSettings
    from services.publisher.settings import PublisherSettings

    own_only = {
        "model-step": _settings_of(ModelStepSettings),
        "publisher": _settings_of(PublisherSettings),
    }
    secrets_files = {"tool-executor": settings.tools_file, "publisher": settings.hooks_file}
    for owner, path in secrets_files.items():
        if path is not None and path.exists():
            own_only[owner] = own_only.get(owner, set()) | set(env_references(path.read_text()))
    if settings.tools_file.exists():
        # A python tool's declared `env:` names too: they are no `${env:…}` in the text.
        with contextlib.suppress(Exception):  # a catalogue that does not load stops the executor, saying why
            own_only["tool-executor"] |= load_catalogue(settings.tools_file).env_references()
    others = set().union(*(names for owner, names in own_only.items() if owner != service))
    env = {k: v for k, v in environ.items() if k in PLAIN_ENVIRONMENT or k.startswith("LC_")}
    for name, value in environ.items():
        if name.startswith("SIGNOFF_") and name not in others and name not in ADMIN_SETTINGS:
            env[name] = value
    # The stores' URLs without the administrator's password: each logs in as itself.
    for name, own_login in (
        ("SIGNOFF_RABBITMQ_URL", settings.broker_identities),
        ("SIGNOFF_REDIS_URL", settings.redis_identities),
        ("SIGNOFF_DATABASE_URL", settings.database_identities),
    ):
        if name in env and own_login:
            env[name] = without_password(env[name])
    env.update({n: environ[n] for n in own_only.get(service, ()) if n in environ})
    if settings.tools_file.exists():
        # Where the tools' calls go (`shown_env`): every service, so the ledger's cards show it.
        with contextlib.suppress(Exception):
            env.update({n: environ[n] for n in load_catalogue(settings.tools_file).shown_env if n in environ})
    env.update(
        SIGNOFF_KEYS_DIR=str(keys),
        SIGNOFF_DATA_DIR=str(settings.data_dir.resolve()),
        HOME="/nonexistent",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def _settings_of(model: type[Settings]) -> set[str]:
    return {f"SIGNOFF_{name.upper()}" for name in set(model.model_fields) - set(Settings.model_fields)}


REACH = """
import os, sys
for path in sys.argv[1:]:
    mode = os.R_OK | (os.X_OK if os.path.isdir(path) else 0)
    if not os.access(path, mode):
        print(path)
"""


class Interpreter:
    """This Python, startable by a user who may not enter the folders it is installed
    in: its binary, its home (the standard library), its shared library's folder and
    the code's folders (site-packages, the project), each opened here, read-only, and
    passed to the child as a descriptor it names as /proc/self/fd/<n>."""

    def __init__(self) -> None:
        from shared.settings import PROJECT_ROOT

        self.binary = os.open(os.path.realpath(sys.executable), os.O_RDONLY | os.O_CLOEXEC)
        self.home = _folder(sys.base_prefix)
        self.libraries = _folder(os.path.join(sys.base_prefix, "lib"))
        code = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)] + [str(PROJECT_ROOT)]
        self.code = [_folder(p) for p in dict.fromkeys(code)]
        self.descriptors = (self.binary, self.home, self.libraries, *self.code)

    def command(self, *arguments: str) -> list[str]:
        return [f"/proc/self/fd/{self.binary}", *arguments]

    def environment(self) -> dict[str, str]:
        return {
            "PYTHONHOME": f"/proc/self/fd/{self.home}",
            "LD_LIBRARY_PATH": f"/proc/self/fd/{self.libraries}",
            "PYTHONPATH": ":".join(f"/proc/self/fd/{d}" for d in self.code),
        }


def _folder(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def unreachable(python: Interpreter, account: Account, paths: list[Path]) -> list[str]:
    """The paths `account`'s user cannot read (a folder: read and enter)."""
    checked = subprocess.run(
        python.command("-S", "-c", REACH, *map(str, paths)),
        env=python.environment(),
        pass_fds=python.descriptors,
        user=account.uid,
        group=account.gid,
        extra_groups=[account.shared_gid],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    if checked.returncode != 0:
        return [f"(could not start Python as {account.user}: {checked.stderr.strip()[-300:]})"]
    return checked.stdout.split()


def start_warm(python: Interpreter, account: Account, env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    """The service's warm server (services/operations/warm_start.py `serve`) as its own user, in a new
    interpreter and session, with the service's own environment: it imports the service
    once, then forks it on each request on its stdin (`WarmServer`). Its stderr is the
    service's log, opened here as root, which the forked service writes too."""
    with open(log, "ab") as output:
        return subprocess.Popen(
            python.command("-m", "services.operations.warm_start", account.service),
            env={**env, **python.environment()},
            pass_fds=python.descriptors,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=output,
            user=account.uid,
            group=account.gid,
            extra_groups=[account.shared_gid],
            umask=0o007,
            start_new_session=True,
            preexec_fn=dying_with_this_process(),
        )
