"""Warm starts: a service process forked from an interpreter that has already
imported every service, so that a (re)start costs a fork plus the service's own
connect-and-declare, not the 1.5-2 s of interpreter start and imports.

Why: after a crash, the time to the first pending approval being applied and
its tool run is mostly process start-up (docs/benchmarks.md, "recovery").
A container restart still pays the cold start; `signoff up` and the test
harness do not have to.

Forking is safe here because the parent is kept simple: it has imported
modules (which open no connections: settings, engines and brokers are built at
start-up) and holds no threads, event loops or sockets. The child takes its
environment, working directory and log file from the request, resets signal
handling, and runs the service exactly as `signoff run <service>` does.

Two users:
- `signoff up` preloads and forks its children itself (`Child`).
- `python -m services.operations.warm_start` serves start requests as JSON lines on
  stdin for the test harness: `{"service", "env", "log", "cwd"}` is answered
  with `{"id", "pid"}`, and every exit with `{"id", "code"}` (code as
  `subprocess` gives it: negative for a signal). Stdin closed: every child it
  started is killed, then it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

from shared import logs
from shared.settings import Settings

SERVICES = {
    "approval-ledger": "services.approval_ledger.main",
    "publisher": "services.publisher.main",
    "model-step": "services.model_step.main",
    "tool-executor": "services.tool_executor.main",
    "gateway": "services.gateway.main",
}


def preload(services: list[str] | None = None) -> None:
    """Import these services (default: every one), and the event loop they run on."""
    for service in services or list(SERVICES):
        importlib.import_module(SERVICES[service])
    _event_loop_factory()


def run_service(service: str) -> int:
    """Run one service in this process until it stops, with settings from the environment."""
    module = importlib.import_module(SERVICES[service])
    try:
        with asyncio.Runner(loop_factory=_event_loop_factory()) as runner:
            runner.run(module.run(Settings()))
    except (SystemExit, Exception) as stop:
        # Once its logging is set up, why a service stops (a dependency unreachable, a
        # key missing, a crash) is a log line like the others: JSON where JSON is read.
        # A process that cannot start as configured (a port taken) exits with its own code,
        # which tells `signoff up` not to restart it (shared/observability.py CANNOT_START).
        code = getattr(stop, "exit_code", 1)
        if isinstance(stop, SystemExit) and isinstance(stop.code, str) and not logs.configured():
            print(stop.code, file=sys.stderr, flush=True)
            raise SystemExit(code) from None
        if not logs.configured() or (isinstance(stop, SystemExit) and not isinstance(stop.code, str)):
            raise
        if isinstance(stop, SystemExit):
            logging.getLogger("signoff").critical("%s", stop.code)
        else:
            logging.getLogger("signoff").critical("%s stopped: %r", service, stop, exc_info=stop)
        raise SystemExit(code) from None
    return 0


def _event_loop_factory():
    """uvloop where it is installed: every message costs less of the loop's CPU."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def dying_with_this_process() -> Callable[[], None]:
    """What a child calls to end (SIGTERM, a clean stop) when this process dies, however
    it dies, so a supervisor that is SIGKILLed leaves no service behind relaying or
    running tools unwatched. Prepared here, in the parent: a child that has already
    become another user may not load anything from this Python's folders. Linux only
    (prctl PR_SET_PDEATHSIG); elsewhere a no-op."""
    import ctypes

    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def die_with_parent() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before the signal was asked for
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent


def fork_service(
    service: str,
    *,
    log: str | int,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    new_session: bool = False,
    die_with_parent: bool = False,
) -> int:
    """Start `service` in a forked child; return its pid. The child never returns.
    `log`: a path, or a descriptor of this process already open on the log.
    `die_with_parent`: the child ends when this process dies (`dying_with_this_process`)."""
    ending = dying_with_this_process() if die_with_parent else None
    if service not in SERVICES:
        raise ValueError(f"no service {service!r}; services are: {', '.join(SERVICES)}")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        if new_session:
            os.setsid()
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)
        # Ignored, as a new interpreter has it: a write to a socket whose peer is gone (a
        # PostgreSQL primary or a RabbitMQ node lost) is then an error the service handles,
        # not a signal that kills it (make chaos --cluster: a ledger died of SIGPIPE).
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if ending is not None:
            ending()
        output = os.dup(log) if isinstance(log, int) else os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        nothing = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nothing, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.close(nothing)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        code = run_service(service)
    except SystemExit as stop:
        if isinstance(stop.code, int):
            code = stop.code
        elif stop.code is not None:
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Child:
    """A forked service child of this process, with the part of `subprocess.Popen` callers use."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def serve(services: list[str] | None = None) -> None:
    """Start services on request (stdin), report pids and exits (stdout); see the module's text.
    Only `services` are preloaded (default: every one)."""
    preload(services)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    # On fd 1 itself: a child's log replaces it, so no child holds the reply pipe open.
    replies = open(1, "w", buffering=1, closefd=False)
    started: dict[int, int] = {}  # pid -> request id
    pending = b""
    count = 0

    def reap() -> None:
        while started:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in started:
                print(json.dumps({"id": started.pop(pid), "code": os.waitstatus_to_exitcode(status)}), file=replies)

    print(json.dumps({"ready": os.getpid()}), file=replies)
    try:
        while True:
            for key, _ in selector.select():
                if key.fd == wake_read:
                    os.read(wake_read, 4096)
                    continue
                data = os.read(0, 65536)
                if not data:
                    return
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    request = json.loads(line)
                    count += 1
                    try:
                        pid = fork_service(
                            request["service"],
                            log=request["log"],
                            env=request.get("env"),
                            cwd=request.get("cwd"),
                            new_session=request.get("new_session", False),
                            die_with_parent=request.get("die_with_parent", False),
                        )
                    except Exception as error:  # a bad request must not end every other service's parent
                        print(json.dumps({"id": count, "error": repr(error)}), file=replies)
                        continue
                    started[pid] = count
                    print(json.dumps({"id": count, "pid": pid}), file=replies)
            reap()
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class WarmServer:
    """`signoff up`'s side of one `python -m services.operations.warm_start SERVICE` it started as
    the service's own user (services/operations/service_users.py `start_warm`), with the log as its
    stderr: each (re)start of the service is a fork of it (`fork`), a few tens of
    milliseconds, where a new interpreter under that user costs one to several seconds.
    Read without blocking: the supervisor is one thread that looks every few milliseconds."""

    # How long a start waits for the server's answer (its imports, on its first start).
    ANSWER_SECONDS = 60.0

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.requests = 0
        self.pids: dict[int, int] = {}
        self.exits: dict[int, int] = {}
        self.unread = b""
        assert process.stdout is not None and process.stdin is not None
        os.set_blocking(process.stdout.fileno(), False)

    def alive(self) -> bool:
        return self.process.poll() is None

    def read(self) -> None:
        """Every answer written so far: pids started, exits, refusals."""
        assert self.process.stdout is not None
        while True:
            try:
                data = os.read(self.process.stdout.fileno(), 65536)
            except BlockingIOError:
                break
            if not data:
                break
            self.unread += data
        *lines, self.unread = self.unread.split(b"\n")
        for line in filter(None, (raw.strip() for raw in lines)):
            answer = json.loads(line)
            if "pid" in answer:
                self.pids[answer["id"]] = answer["pid"]
            elif "code" in answer:
                self.exits[answer["id"]] = answer["code"]
            elif "error" in answer:
                self.exits[answer["id"]] = 1

    def fork(self, service: str) -> ForkedChild:
        """The service, forked by the server in a session of its own, ending when the server ends."""
        assert self.process.stdin is not None
        self.requests += 1
        request = {"service": service, "log": 2, "new_session": True, "die_with_parent": True}
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        child = ForkedChild(self, self.requests)
        deadline = time.monotonic() + self.ANSWER_SECONDS
        while child.pid is None and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return child

    def close(self, timeout: float = 5.0) -> None:
        """Stdin closed: the server kills what it still runs, then exits."""
        self.ask_to_close()
        self.wait_closed(timeout)

    def ask_to_close(self) -> None:
        """Close its stdin without waiting: several servers then end side by side."""
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()

    def wait_closed(self, timeout: float = 5.0) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)


class ForkedChild:
    """A service forked by a `WarmServer`, with the part of `subprocess.Popen` the supervisor uses."""

    def __init__(self, server: WarmServer, request: int) -> None:
        self.server = server
        self.request = request
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        return self.server.pids.get(self.request)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        self.server.read()
        if self.request in self.server.exits:
            self.returncode = self.server.exits[self.request]
        elif not self.server.alive():
            # The server died (it would have said how its child ended): the child ends with
            # it (SIGTERM), if it was started at all.
            pid = self.pid
            if pid is None or not _exists(pid):
                self.returncode = -signal.SIGTERM if pid is not None else self.server.process.returncode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, number: int) -> None:
        pid = self.pid
        if pid is not None and self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # gone, and its exit not read yet
                os.kill(pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    serve(sys.argv[1:] or None)
