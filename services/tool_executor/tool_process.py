"""A python tool's own process: `python -I -S -c "…tool_process import main; main()"`,
or, by default, a child forked for the call from a fork server (`serve`, below) that
started the same way.

The executor starts one per call (`tools.run_tool`) with a clean environment and
writes the call to its stdin as one JSON object; this process answers on its
stdout with one JSON object, `{"output": …}` or `{"error": "…"}`. It holds nothing
of the executor's: no broker, database or Redis URL, password or key, no SIGNOFF_*
setting, no open descriptor, no memory; only the variables the tool declares
(`env:` in the catalogue), which come on stdin, not in the process's environment.

Run by root (as the executor is in CI and under `signoff up` as root), it becomes
the tool's user before it imports the tool: the tool then cannot read the keys,
passwords or ledger file that belong to root. Standard library only at module
level: the start-up of this process is part of every call's latency.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

# What a tool writes to its stdout goes to stderr: stdout carries the result alone.
# Past this many bytes the result is refused rather than held in the executor's memory.
RESULT_BYTES = 64 << 20


class ToolContext(NamedTuple):
    """What a python tool gets besides its arguments."""

    call_id: str
    session_id: str
    # The same on every retry of this call: pass it to any API that deduplicates.
    idempotency_key: str
    attempt: int
    # The tool's own folder, which is also its working directory.
    data_dir: Path


class Call(NamedTuple):
    """Everything the tool's process is told, on its stdin."""

    function: str
    arguments: dict[str, Any]
    context: ToolContext
    # The variables the tool declares, with the executor's values.
    env: dict[str, str]
    # Where the executor imports from, so the tool imports what it would have.
    import_path: list[str]
    # (uid, gid) to become before the tool is imported; None: stay who we are.
    run_as: tuple[int, int] | None

    def encode(self) -> bytes:
        context = self.context
        return json.dumps(
            {
                "function": self.function,
                "arguments": self.arguments,
                "context": {
                    "call_id": context.call_id,
                    "session_id": context.session_id,
                    "idempotency_key": context.idempotency_key,
                    "attempt": context.attempt,
                    "data_dir": str(context.data_dir),
                },
                "env": self.env,
                "import_path": self.import_path,
                "run_as": self.run_as,
            }
        ).encode()


class NoResult(Exception):
    """The tool's process answered with something that is not a result."""


def result_of(stdout: bytes) -> tuple[Any, str | None]:
    """(output, error) from what the tool's process wrote; NoResult for anything else."""
    try:
        answer = json.loads(stdout)
    except (ValueError, RecursionError):
        raise NoResult(f"answered something that is not JSON ({len(stdout)} bytes)") from None
    if isinstance(answer, dict) and set(answer) == {"output"}:
        return answer["output"], None
    if isinstance(answer, dict) and set(answer) == {"error"} and isinstance(answer["error"], str):
        return None, answer["error"]
    raise NoResult("answered neither an output nor an error")


def as_json(value: Any) -> Any:
    """The output as JSON values: it is recorded in the claim row and reported, and a
    value neither can hold (a datetime, a set) would fail the call after it ran."""
    try:
        # NaN and infinities are not JSON (PostgreSQL refuses them): null, as pydantic writes them.
        return json.loads(json.dumps(value, default=repr), parse_constant=lambda _: None)
    except (TypeError, ValueError, RecursionError):  # keys that are not strings, cycles, depth
        return repr(value)[:10_000]


def _private() -> None:
    """No other process of the same user may read this one's memory or environment
    (/proc/<pid>/environ, /proc/<pid>/mem, ptrace): another tool's call runs as the
    same user. Linux only; elsewhere the tool's user is the boundary."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def _become(uid: int, gid: int, import_path: list[str]) -> list[str]:
    """Become the tool's user, keeping the import path reachable: the interpreter and
    its libraries may live where only root may enter (pyenv under /root), so a folder
    the new user cannot reach is kept open first and imported from through
    /proc/self/fd (which a process may always use for itself). Returns the import path."""
    folders = [p for p in dict.fromkeys([*import_path, *sys.path]) if os.path.isdir(p)]
    opened = {p: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in folders}
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("the tool's process could not become its user")
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise SystemExit("the tool's process could become root again")
    moved: dict[str, str] = {}
    for folder, descriptor in opened.items():
        if os.access(folder, os.R_OK | os.X_OK):
            os.close(descriptor)
        else:
            moved[folder] = f"/proc/self/fd/{descriptor}"

    def reachable(path: str) -> str:
        for old, new in moved.items():
            if path == old or path.startswith(old + os.sep):
                return new + path[len(old) :]
        return path

    # Packages already imported find their submodules by their own __path__.
    for module in list(sys.modules.values()):
        package_path = getattr(module, "__path__", None)
        if isinstance(package_path, list):
            package_path[:] = [reachable(p) for p in package_path]
    sys.path[:] = [reachable(p) for p in sys.path]
    sys.path_importer_cache.clear()
    return [reachable(p) for p in import_path]


def _load(path: str) -> Any:
    import importlib

    module, _, name = path.partition(":")
    try:
        found = importlib.import_module(module)
    except ImportError:
        if sys.flags.no_site and "site" not in sys.modules:
            # Started without `site` (-S, `tools._interpreter`): a module that only a `.pth`
            # file makes importable (an editable install's finder) is found once it has run.
            import site

            site.main()
            importlib.invalidate_caches()
            found = importlib.import_module(module)
        else:
            raise
    return getattr(found, name)


def _run(call: dict[str, Any]) -> dict[str, Any]:
    given = call["context"]
    data_dir = Path(given["data_dir"])
    # Out of this user's reach by its name (a parent only root may enter): the tool
    # reaches it as its working directory, which it is.
    if not os.access(data_dir, os.R_OK | os.W_OK | os.X_OK):
        data_dir = Path(os.curdir)
    context = ToolContext(given["call_id"], given["session_id"], given["idempotency_key"], given["attempt"], data_dir)
    try:
        value = _load(call["function"])(call["arguments"], context)
        if hasattr(value, "__await__"):  # an `async def` tool, or one that returns an awaitable
            import asyncio

            async def awaited() -> Any:
                return await value

            value = asyncio.run(awaited())
    except BaseException as error:  # SystemExit too: whatever the tool raises is its result
        return {"error": f"{type(error).__name__}: {error}"}
    return {"output": as_json(value)}


def main() -> None:
    _private()
    call = json.loads(sys.stdin.buffer.read())
    # The result goes out on a copy of stdout; the tool's own prints go to stderr.
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    import_path = call["import_path"]
    if call["run_as"] is not None:
        uid, gid = call["run_as"]
        import_path = _become(uid, gid, import_path)
    if sys.flags.no_site:
        # Started without `site`: the executor's path in the executor's order (its
        # site-packages after the standard library, as `site` would have put them).
        sys.path[:] = [*import_path, *(p for p in sys.path if p not in import_path)]
    else:
        sys.path[:0] = [p for p in import_path if p not in sys.path]
    os.environ.update(call["env"])
    result = _run(call)
    try:
        data = json.dumps(result).encode()
    except (TypeError, ValueError):
        data = json.dumps({"error": "the tool's output could not be written as JSON"}).encode()
    answer.write(data)
    answer.flush()


def serve_calls() -> None:
    """A warm worker of one tool marked `reuse_process` (tools.py `WarmWorkers`): what
    `main` is, for one call after another. Each call is one line of JSON on stdin, each
    answer one line on stdout (JSON escapes every newline inside it); the end of stdin
    ends the process. The tool's module is imported by the first call and kept."""
    _private()
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    calls = os.fdopen(os.dup(0), "rb")
    for line in calls:
        call = json.loads(line)
        os.environ.update(call["env"])
        result = _run(call)
        try:
            data = json.dumps(result).encode()
        except (TypeError, ValueError):
            data = json.dumps({"error": "the tool's output could not be written as JSON"}).encode()
        answer.write(data + b"\n")
        answer.flush()


# The fork server (docs/design.md, "A process per python call costs time"). It starts like
# a tool's process (the same interpreter, user, folder and plain environment) but imports
# no tool: it reads its setup on stdin, becomes the tools' user, imports what every call
# imports, and then forks one child per call. A child is what `main` is in a process of
# its own: a copy of this clean process, which has never run a tool, never read a call and
# never held a secret (a call and its variables reach only the child, on its stdin).
#
# Its starter (the executor, or the tool launcher) sends on the control socket one
# message per call: the child's environment (JSON; or `{"environment": {…}, "calls":
# "many"}` from the executor for a warm worker, `serve_calls`) with five descriptors: a connection
# to answer on, the child's stdin, stdout and stderr, and its folder (entered with
# fchdir: its parent may be a folder the tools' user cannot enter). On that connection
# the server answers as the launcher does (shared/tool_launch.py): `{"started": true}`,
# later `{"exited": code}` after killing what the child left in its group; anything
# read on it (or its end) kills the child's group.
FORKED_DESCRIPTORS = 5


def serve() -> None:
    import selectors
    import signal
    import socket

    setup = json.loads(_read_everything(0))
    control = socket.socket(fileno=setup["control"])
    import_path = setup["import_path"]
    if setup["run_as"] is not None:
        uid, gid = setup["run_as"]
        import_path = _become(uid, gid, import_path)
    if sys.flags.no_site:
        sys.path[:] = [*import_path, *(p for p in sys.path if p not in import_path)]
    else:
        sys.path[:0] = [p for p in import_path if p not in sys.path]
    _private()
    _die_with(setup["parent"])
    # What calls import anyway, once here rather than once per call. Never a tool's module.
    import asyncio  # noqa: F401
    import importlib  # noqa: F401
    import traceback  # noqa: F401

    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, None)
    # A running child by its pidfd: (pid, its connection).
    children: dict[int, tuple[int, socket.socket]] = {}

    def kill_group(pid: int) -> None:
        # Not yet reaped (we reap only after this), so the group is still the child's.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def say(connection: socket.socket, answer: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the starter let go: nobody left to tell
            connection.send(json.dumps(answer).encode())

    while True:
        for key, _ in selector.select():
            if key.data is None:
                try:
                    data, descriptors, _, _ = socket.recv_fds(control, 16 * 1024, FORKED_DESCRIPTORS)
                except (BlockingIOError, InterruptedError):
                    continue
                if not data and not descriptors:
                    # The starter is gone: so are its calls.
                    for pid, _connection in children.values():
                        kill_group(pid)
                    os._exit(0)
                if len(descriptors) != FORKED_DESCRIPTORS:
                    for descriptor in descriptors:
                        os.close(descriptor)
                    continue
                private = [control.fileno(), selector.fileno(), *children, *(c.fileno() for _, c in children.values())]
                message = json.loads(data)
                many = isinstance(message.get("environment"), dict)  # a plain environment's values are strings
                environment = message["environment"] if many else message
                pid = _fork_child(environment, descriptors, private, many)
                connection = socket.socket(fileno=descriptors[0])
                for descriptor in descriptors[1:]:
                    os.close(descriptor)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, connection)
                selector.register(pidfd, selectors.EVENT_READ, ("exited", pidfd))
                selector.register(connection, selectors.EVENT_READ, ("let go", pidfd))
                say(connection, {"started": True})
            elif key.data[0] == "let go":
                # Anything from the starter after the start (data, or its end) means stop.
                pid, connection = children[key.data[1]]
                with contextlib.suppress(OSError):
                    connection.recv(1)
                selector.unregister(connection)
                kill_group(pid)
            else:
                pidfd = key.data[1]
                pid, connection = children.pop(pidfd)
                kill_group(pid)
                _, status = os.waitpid(pid, 0)
                say(connection, {"exited": os.waitstatus_to_exitcode(status)})
                selector.unregister(pidfd)
                os.close(pidfd)
                with contextlib.suppress(KeyError, ValueError):
                    selector.unregister(connection)
                connection.close()


def _fork_child(environment: dict[str, str], descriptors: list[int], private: list[int], many: bool = False) -> int:
    """Fork the call's process; in it, become what `main` is in a fresh interpreter
    (`many`: what `serve_calls` is, a warm worker of one reusable tool)."""
    server = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        connection, stdin, stdout, stderr, folder = descriptors
        # A group of its own: a timeout kills whatever the tool started too.
        os.setsid()
        for descriptor, standard in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(descriptor, standard)
        os.fchdir(folder)
        # Nothing of the server's or of another call's: not the control socket, no
        # connection, no pidfd (another call's pipes are never open here: the server
        # closes a call's descriptors as soon as its child is forked).
        for descriptor in {connection, stdin, stdout, stderr, folder, *private} - {0, 1, 2}:
            with contextlib.suppress(OSError):
                os.close(descriptor)
        _die_with(server)
        os.environ.clear()
        os.environ.update(environment)
        serve_calls() if many else main()
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            # What a finished interpreter would do: wait for the tool's threads, run its atexit.
            import threading

            threading._shutdown()  # type: ignore[attr-defined]
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    raise AssertionError("unreachable")


def _die_with(parent: int) -> None:
    """SIGKILL when `parent` dies (asked again after a change of user, which clears it):
    no call outlives its fork server, no fork server outlives its starter."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(1)


def _read_everything(descriptor: int) -> bytes:
    data = b""
    while chunk := os.read(descriptor, 1 << 16):
        data += chunk
    return data
