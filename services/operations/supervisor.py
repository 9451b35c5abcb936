"""`signoff up`: the four services as child processes of one supervisor, each
restarted at once when it dies. Run as root, each runs as its own system user
with only its own files and settings (services/operations/service_users.py); run as an
ordinary user, it is a single-user development deployment and says so."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.operations import service_users, tool_launcher
from services.operations.warm_start import (
    SERVICES,
    Child,
    ForkedChild,
    WarmServer,
    dying_with_this_process,
    fork_service,
    preload,
)
from shared.observability import CANNOT_START
from shared.settings import Settings


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


class CannotStart(Exception):
    """A service cannot start as configured (it exited with CANNOT_START): `signoff up` stops."""


# How long a service has to stop after SIGTERM (its in-flight message finished) before it is killed.
STOP_SECONDS = 15
# What `signoff reload` reads to find the `signoff up` of a data folder: its pid and log folder.
RUNNING_FILE = "signoff-up.json"
# The services that read files again on SIGHUP, and the line each logs when it has.
RELOADING = {
    "approval-ledger": "tools file",
    "tool-executor": "tools file",
    "gateway": "tools file",
    "model-step": "providers",
}


def ask_to_reload(settings: Settings, timeout: float = 10.0) -> int:
    """`signoff reload`: check the tools file (refused whole, naming the tool, and nothing
    asked of anyone), then ask this data folder's `signoff up` to have each service read
    its files again (SIGHUP), and say what each did."""
    from shared.catalogue import CatalogueRefused, read_catalogue

    try:
        catalogue = read_catalogue(settings.tools_file)
    except CatalogueRefused as refused:
        print(f"signoff reload: {refused}; nothing was reloaded, every service keeps its catalogue", file=sys.stderr)
        return 1
    try:
        running = json.loads((settings.data_dir / RUNNING_FILE).read_text())
        os.kill(running["pid"], 0)
    except (OSError, ValueError, KeyError):
        print(
            f"signoff reload: no `signoff up` runs for {settings.data_dir.resolve()}; elsewhere, send SIGHUP to each "
            "service (`docker kill -s HUP`, `kill -HUP PID`)",
            file=sys.stderr,
        )
        return 1
    logs = Path(running["log_dir"])
    offsets = {s: (logs / f"{s}.log").stat().st_size if (logs / f"{s}.log").exists() else 0 for s in RELOADING}
    os.kill(running["pid"], signal.SIGHUP)
    print(f"signoff reload: the tools file holds {len(catalogue.tools)} tools; asked signoff up (pid {running['pid']})")
    said: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while len(said) < len(RELOADING) and time.monotonic() < deadline:
        for service, what in RELOADING.items():
            if service not in said:
                line = _reload_line(logs / f"{service}.log", offsets[service], what)
                if line is not None:
                    said[service] = line
        time.sleep(0.05)
    for service in RELOADING:
        print(f"  {service}: {said.get(service, f'said nothing within {timeout:.0f} s')}")
    reloaded = [s for s, line in said.items() if line.startswith(f"{RELOADING[s]} reloaded")]
    return 0 if len(reloaded) == len(RELOADING) else 1


def _reload_line(log: Path, offset: int, what: str) -> str | None:
    """The first line about reloading `what` the service logged after `offset`, its message only."""
    with contextlib.suppress(FileNotFoundError), open(log, "rb") as lines:
        lines.seek(offset)
        for raw in lines.read().decode("utf-8", "replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                message = str(json.loads(raw).get("message", ""))
                if message.startswith((f"{what} reloaded", f"{what} not reloaded")):
                    return message
    return None


class Supervisor:
    """Runs the four services as child processes and restarts any that dies.

    Each child is a fork of an interpreter that has imported its service
    (`services.operations.warm_start`): a restart after a crash is a fork and a connect, not a
    new interpreter. As an ordinary user, that is this process; as root, the service's
    own warm server, run as the service's user with only its environment."""

    # How often a dead child is looked for: a crash costs at most this before the restart.
    WATCH_SECONDS = 0.05
    # A child that dies before it became ready is crash-looping (bad settings, a
    # dependency away): each further restart waits twice as long as the last, up
    # to BACKOFF_LIMIT, instead of spinning. One that was ready and working is
    # restarted at once, however soon after its last start it died.
    BACKOFF_LIMIT = 30.0

    def __init__(self, settings: Settings, log_dir: Path | None = None, isolated: bool | None = None) -> None:
        self.settings = settings
        # Root: each service as its own user, holding only its own files; else one user for all.
        self.isolated = (os.geteuid() == 0 and not settings.single_user) if isolated is None else isolated
        self.accounts: dict[str, service_users.Account] = {}
        self.environments: dict[str, dict[str, str]] = {}
        self.log_dir = log_dir or settings.data_dir / "logs"
        self.children: dict[str, Child | ForkedChild | subprocess.Popen] = {}
        # Run as root: each service's warm server, under its own user (`_warm_server`).
        self.warm: dict[str, WarmServer] = {}
        # Where each child's log stood when it was started: what it logged since says whether it became ready.
        self.log_offset: dict[str, int] = {}
        self.backoff: dict[str, float] = {}
        self.restart_at: dict[str, float] = {}
        self.stopping = False
        self.reload_asked = False

    def start(self) -> None:
        from shared.runtime import check_reachable

        # SIGTERM (docker stop, timeout) must stop the children too, as Ctrl-C does.
        signal.signal(signal.SIGTERM, _interrupt)
        # And SIGINT always does: a shell without job control starts a background command
        # with SIGINT ignored, Python then leaves it ignored, and `kill -INT` did nothing
        # (the supervisor and every service it started ran on).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # SIGHUP (`signoff reload`): each service reads its files again (`forward_reload`).
        signal.signal(signal.SIGHUP, self._reload_asked)
        check_reachable(self.settings)
        if not self.isolated:
            print(service_users.single_user_warning(), file=sys.stderr, flush=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.settings.broker_identities:  # setup makes the broker users through it
            from shared.provisioning import wait_for_management_api

            wait_for_management_api(self.settings, lambda line: print(line, file=sys.stderr, flush=True))
        # Keys (made once) and the schema before any service starts: four services
        # need not race to create them. Each says itself why it failed.
        for step in ("setup", "migrate"):
            if subprocess.run([sys.executable, "-m", "services.operations.cli", step]).returncode != 0:
                raise SystemExit(f"signoff up: `signoff {step}` failed (its error is above); no service was started")
        if self.isolated:
            self._give_each_service_its_own_user()
            self._give_the_executor_a_tool_launcher()
            for service in SERVICES:  # their imports at once, before the first of them is asked for a fork
                self._warm_server(service)
        else:
            preload()
        # Said before the starts: each start as root waits for its warm server's answer.
        for service, url in self.metrics_addresses().items():
            print(f"signoff: {service} metrics {url}/metrics, health {url}/readyz", flush=True)
        for service in SERVICES:
            self._spawn(service)

    def _give_each_service_its_own_user(self) -> None:
        """Each service's user (made if missing), its own copy of its own key files and
        its own environment; the data folder shared by their group. Refuses to start
        when a service's user could not reach what it needs (a data folder under a
        folder only root may enter), rather than run the services as root."""
        accounts = service_users.accounts(list(SERVICES))
        shared_gid = next(iter(accounts.values())).shared_gid
        service_users.share_data(self.settings, shared_gid)
        for service, account in accounts.items():
            keys = service_users.hand_out_keys(self.settings, account)
            self.environments[service] = service_users.environment_of(service, self.settings, keys, dict(os.environ))
        needed = [self.settings.data_dir.resolve(), self.settings.tools_file, self.settings.script_file]
        needed += [self.settings.hooks_file] if self.settings.hooks_file else []
        self.python = service_users.Interpreter()
        missing = service_users.unreachable(self.python, accounts["model-step"], needed)
        if missing:
            raise SystemExit(
                f"signoff up: running as root, each service runs as its own user (signoff-<service>), and they "
                f"cannot reach {', '.join(missing)}: let others enter the folders above them (chmod o+x) or use "
                "a data folder and settings files they can reach (SIGNOFF_DATA_DIR, SIGNOFF_TOOLS_FILE, …); or, "
                "for a single-user development deployment (every service able to read every key), run it as an "
                "ordinary user or set SIGNOFF_SINGLE_USER=true"
            )
        self.accounts = accounts

    def _give_the_executor_a_tool_launcher(self) -> None:
        """The executor is not root, so it cannot start a tool as anyone but itself: a root
        launcher starts each python tool as `signoff-tools` for it (a tool run as the
        executor's user could read the executor's passwords). Started, and ready, before
        the executor: its first python call goes through it."""
        self.launcher_socket = tool_launcher.socket_path(self.settings.data_dir.resolve())
        self.environments["tool-executor"]["SIGNOFF_TOOL_LAUNCHER"] = str(self.launcher_socket)
        self._spawn(tool_launcher.SERVICE)
        self._wait_for_launcher()

    def _spawn_launcher(self) -> None:
        """The tool launcher as root, a fresh interpreter with a plain environment: it
        holds no setting, password or secret of Signoff's (services/operations/tool_launcher.py)."""
        from shared.settings import PROJECT_ROOT
        from shared.tool_launch import tool_data_dir

        log = self.log_dir / f"{tool_launcher.SERVICE}.log"
        self.log_offset[tool_launcher.SERVICE] = log.stat().st_size if log.exists() else 0
        plain = {k: v for k, v in os.environ.items() if k in service_users.PLAIN_ENVIRONMENT or k.startswith("LC_")}
        # How it logs, as every service does (no secret in these).
        plain |= {k: v for k, v in os.environ.items() if k in ("SIGNOFF_LOG_FORMAT", "SIGNOFF_LOG_LEVEL")}
        with open(log, "ab") as output:
            self.children[tool_launcher.SERVICE] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.operations.tool_launcher",
                    "--socket",
                    str(self.launcher_socket),
                    "--client",
                    self.accounts["tool-executor"].user,
                    "--tools-dir",
                    str(tool_data_dir(self.settings.data_dir.resolve())),
                ],
                env={**plain, "PYTHONDONTWRITEBYTECODE": "1"},
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=dying_with_this_process(),
            )

    def _wait_for_launcher(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        child = self.children[tool_launcher.SERVICE]
        while not self.became_ready(tool_launcher.SERVICE):
            if child.poll() is not None or time.monotonic() > deadline:
                log = self.log_dir / f"{tool_launcher.SERVICE}.log"
                raise SystemExit(f"signoff up: the tool launcher did not start (log: {log})")
            time.sleep(0.02)

    def _spawn(self, service: str) -> None:
        if service == tool_launcher.SERVICE:
            self._spawn_launcher()
            return
        # Its own session, as before: Ctrl-C reaches the supervisor, which stops the children in order.
        log = self.log_dir / f"{service}.log"
        self.log_offset[service] = log.stat().st_size if log.exists() else 0
        if self.isolated:
            self.children[service] = self._warm_server(service).fork(service)
            return
        env = None
        if self.settings.metrics_port:
            env = {**os.environ, "SIGNOFF_METRICS_PORT": str(self.metrics_port(service))}
        self.children[service] = Child(
            fork_service(service, log=str(log), env=env, new_session=True, die_with_parent=True)
        )

    def _warm_server(self, service: str) -> WarmServer:
        """The service's warm server, as its own user with its own environment (started
        again if it died): every start and restart of the service is a fork of it."""
        server = self.warm.get(service)
        if server is None or not server.alive():
            own = dict(self.environments[service])
            if self.settings.metrics_port:
                own["SIGNOFF_METRICS_PORT"] = str(self.metrics_port(service))
            log = self.log_dir / f"{service}.log"
            process = service_users.start_warm(
                self.python, self.accounts[service], own, log, cwd=self.settings.data_dir.resolve()
            )
            server = self.warm[service] = WarmServer(process)
        return server

    def metrics_port(self, service: str) -> int:
        """One port per child: SIGNOFF_METRICS_PORT plus the service's place in SERVICES."""
        return self.settings.metrics_port + list(SERVICES).index(service)

    def metrics_addresses(self) -> dict[str, str]:
        if not self.settings.metrics_port:
            return {}
        return {s: f"http://{self.settings.metrics_host}:{self.metrics_port(s)}" for s in SERVICES}

    def became_ready(self, service: str) -> bool:
        """Whether the child last started logged that it was ready (or, a publisher, standing by)."""
        with open(self.log_dir / f"{service}.log", "rb") as log:
            log.seek(self.log_offset[service])
            since = log.read().decode("utf-8", "replace")
        return f"{service} ready" in since or f"{service} standing by" in since

    def last_words(self, service: str) -> str:
        """The last line the child last started logged (its message, if a JSON line): why it stopped."""
        with open(self.log_dir / f"{service}.log", "rb") as log:
            log.seek(self.log_offset[service])
            lines = log.read().decode("utf-8", "replace").strip().splitlines()
        last = lines[-1] if lines else f"{service} stopped and said nothing"
        with contextlib.suppress(ValueError, AttributeError):
            last = str(json.loads(last).get("message", last))
        return last

    def _reload_asked(self, *_: object) -> None:
        self.reload_asked = True

    def forward_reload(self) -> None:
        """SIGHUP to every service (not the tool launcher, which reads no file of Signoff's)."""
        self.reload_asked = False
        for service, child in self.children.items():
            if service != tool_launcher.SERVICE:
                child.send_signal(signal.SIGHUP)

    def watch(self) -> None:
        """Restart every child that died: at once after a crash, with backoff while it keeps dying at start."""
        if self.stopping:
            return
        if self.reload_asked:
            self.forward_reload()
        now = time.monotonic()
        for service, child in list(self.children.items()):
            if service in self.restart_at:
                if now >= self.restart_at[service]:
                    del self.restart_at[service]
                    self._spawn(service)
                continue
            if child.poll() is None:
                continue
            if child.returncode == CANNOT_START:
                raise CannotStart(f"signoff up: {self.last_words(service)}; every service stopped")
            if self.became_ready(service):
                self.backoff.pop(service, None)
            else:
                self.backoff[service] = min(self.BACKOFF_LIMIT, 2 * self.backoff.get(service, 0.25))
            delay = self.backoff.get(service, 0.0)
            print(
                f"signoff: {service} exited with {child.returncode}; restarting"
                f"{f' in {delay:.1f} s' if delay else ''} (log: {self.log_dir / (service + '.log')})",
                file=sys.stderr,
                flush=True,
            )
            if delay:
                self.restart_at[service] = now + delay
            else:
                self._spawn(service)

    def stop(self) -> None:
        self.stopping = True
        # The services first, then the tool launcher: a tool the executor is finishing as
        # it stops is not killed under it (the launcher kills every tool when it stops).
        services = {name: child for name, child in self.children.items() if name != tool_launcher.SERVICE}
        launcher = {name: child for name, child in self.children.items() if name == tool_launcher.SERVICE}
        for group in (services, launcher):
            for child in group.values():
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_SECONDS
            for name, child in group.items():
                try:
                    child.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    # Said, so an operator (and a test) knows which one hung on its way out.
                    print(f"signoff: {name} did not stop within {STOP_SECONDS} s of SIGTERM; killed", flush=True)
                    child.kill()
            if group is services:  # the warm servers once their services have stopped
                # All asked at once, then waited for: a slow one does not hold up the others' ends.
                for server in self.warm.values():
                    server.ask_to_close()
                for server in self.warm.values():
                    server.wait_closed()

    def run_until_interrupted(self) -> int:
        running = self.settings.data_dir / RUNNING_FILE
        try:
            self.start()
            running.write_text(json.dumps({"pid": os.getpid(), "log_dir": str(self.log_dir.resolve())}))
            print(
                f"signoff: services running (logs in {self.log_dir}); Ctrl-C stops them, `signoff reload` "
                "has them read the tools file again",
                flush=True,
            )
            while True:
                time.sleep(self.WATCH_SECONDS)
                self.watch()
        except KeyboardInterrupt:
            print("\nsignoff: stopping", flush=True)
        except CannotStart as why:
            # Once, and no restart: it would fail the same way (a port another deployment holds).
            print(why, file=sys.stderr, flush=True)
            return CANNOT_START
        finally:
            self.stop()
            with contextlib.suppress(OSError, ValueError):
                if json.loads(running.read_text())["pid"] == os.getpid():
                    running.unlink()
        return 0
