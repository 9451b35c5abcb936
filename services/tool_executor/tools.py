"""Tool implementations: `python` (an import path, run in a process of its own),
`http` (a request template) and `mcp` (a tool of an MCP server, on a connection kept open)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from shared.catalogue import (
    HttpImplementation,
    McpImplementation,
    McpServer,
    MissingSecret,
    PythonImplementation,
    ToolCatalogue,
    ToolSpec,
    http_request,
    shown_request,
)
from shared.catalogue import resolve_secrets as resolve
from shared.messages import Outcome
from shared.redaction import redact_text, redact_url, redact_value
from shared.tool_launch import (
    MESSAGE_BYTES,
    PASSED_ENVIRONMENT,
    TOOLS_USER,
    Answer,
    Exited,
    LaunchRequest,
    Refused,
    ToolUserMissing,
    tool_data_dir,
    tools_account,
)

from .tool_process import RESULT_BYTES, Call, NoResult, ToolContext, result_of

__all__ = [
    "TOOLS_USER",
    "McpConnections",
    "ToolContext",
    "ToolResult",
    "ToolUserMissing",
    "run_tool",
    "tool_data_dir",
    "tools_user",
]

# A call's error as reported, recorded and said to the model: enough to say why.
ERROR_CHARS = 1000
# What is kept of a tool process's stderr, to say why it died.
STDERR_KEPT = 4096


@dataclass(frozen=True)
class ToolResult:
    outcome: Outcome
    output: Any = None
    error: str | None = None


_tools_user: tuple[int, int] | None = None


async def tools_user() -> tuple[int, int] | None:
    """(uid, gid) python tools run as when this executor starts them itself: None when
    the executor is not root (a tool then runs as the executor's user, unless a tool
    launcher is configured: docs/design.md says what that leaves open); as root,
    TOOLS_USER, made if missing (a system user with no home and no shell). Never root."""
    global _tools_user
    if os.geteuid() != 0:
        return None
    if _tools_user is None:
        _tools_user = await asyncio.to_thread(tools_account)
    return _tools_user


async def run_tool(
    spec: ToolSpec,
    arguments: dict[str, Any],
    context: ToolContext,
    http: httpx.AsyncClient,
    launcher: Path | None = None,
    mcp: McpConnections | None = None,
) -> ToolResult:
    """Run the call; what it returns has this call's secrets hidden (its declared
    secret arguments, the `${env:…}` values it used, credential shapes in errors):
    the result is recorded, reported, put in the transcript and sent to hooks.
    `launcher`: the tool launcher's socket (SIGNOFF_TOOL_LAUNCHER), through which
    every python tool is then started. `mcp`: the executor's kept connections to MCP servers."""
    implementation = spec.implementation
    if isinstance(implementation, PythonImplementation):
        result = await _run_python(implementation, spec, arguments, context, launcher)
    elif isinstance(implementation, HttpImplementation):
        result = await _run_http(implementation, spec, arguments, context, http)
    elif isinstance(implementation, McpImplementation):
        result = await _run_mcp(implementation, spec, arguments, mcp)
    else:
        result = ToolResult("error", error=f"the tool {spec.name!r} has no implementation")
    secrets = spec.secret_values(arguments)
    return ToolResult(
        result.outcome,
        redact_value(result.output, secrets) if result.output is not None else None,
        # Cut after hiding: a secret cut in two would no longer be found.
        redact_text(result.error, secrets)[:ERROR_CHARS] if result.error is not None else None,
    )


async def _run_python(
    implementation: PythonImplementation,
    spec: ToolSpec,
    arguments: dict[str, Any],
    context: ToolContext,
    launcher: Path | None,
) -> ToolResult:
    """The call runs in a process of its own (`tool_process`) that holds only the
    variables the tool declares and runs as TOOLS_USER: started by the tool launcher
    when one is configured (an executor that is not root cannot switch users itself),
    otherwise here when the executor is root. Only an executor that is neither runs
    the tool as its own user. A tool cannot read the executor's keys, passwords,
    settings or memory, nor another tool's secrets, nor speak to the broker as the
    executor. The loop stays free meanwhile, so the claim's heartbeat keeps beating
    however long the tool takes. Past the declared timeout the process group is
    killed and the call ends: an outward one as outcome-unknown (it may have had its
    effect), a read or idempotent one as an error. A process that dies or answers
    garbage is an error result."""
    try:
        env = {name: resolve(f"${{env:{name}}}") for name in implementation.env}
    except MissingSecret as missing:
        return ToolResult("error", error=f"the executor cannot make this call: {missing}")
    if launcher is None:
        try:
            run_as = await tools_user()
        except ToolUserMissing as missing:
            return ToolResult("error", error=str(missing))
        try:
            folder = _own_folder(context.data_dir, run_as)
        except OSError as error:
            return ToolResult("error", error=f"the tools' folder cannot be prepared: {type(error).__name__}: {error}")
        call = Call(implementation.function, arguments, context, env, _import_path(), run_as)
    else:
        # The launcher chooses the user and the folder; the process starts as TOOLS_USER.
        # This process's descriptors mean nothing in it: its import path is the launcher's.
        import_path = [p for p in _import_path() if not p.startswith(_HANDED)]
        call = Call(implementation.function, arguments, context, env, import_path, None)
    timeout = implementation.timeout_seconds
    deadline = asyncio.timeout(timeout)
    process: _Here | _Launched | None = None
    forked = launcher is None and fork_server_wanted()
    if forked:
        # The fork server already is the tools' user and has the import path: the child
        # needs neither (nor could it switch users again).
        call = call._replace(import_path=[], run_as=None)
        if implementation.reuse_process:
            return await _warm_workers.run(spec, call, folder, run_as)
    try:
        async with deadline:
            if forked:
                process = await _fork(folder, run_as)
            else:
                process = await (_start_here(folder) if launcher is None else _launch(launcher))
            stdout, stderr = await _exchange(process, call.encode())
    except LauncherUnavailable as unavailable:
        # Never run here instead, as the executor's own user: nothing ran.
        return ToolResult("error", error=str(unavailable))
    except OSError as error:
        if isinstance(error, TimeoutError) and deadline.expired():
            late = f"the tool did not finish within {timeout:g} s"
            # It may have had its effect, or have it yet: say so rather than guess (invariant 4).
            return ToolResult("outcome_unknown" if spec.effect == "outward" else "error", error=late)
        # No process to run it in: nothing ran.
        return ToolResult("error", error=f"the tool's process could not start: {type(error).__name__}: {error}")
    finally:
        if process is not None:
            if process.returncode is None:
                process.kill()
                await process.ended()
            process.close()
    if stdout is None:
        return ToolResult("error", error=f"the tool's process answered more than {RESULT_BYTES >> 20} MiB")
    try:
        output, failure = result_of(stdout)
    except NoResult as garbage:
        said = stderr.decode(errors="replace").strip()
        why = f"exited with {process.returncode}" if process.returncode else str(garbage)
        return ToolResult("error", error=f"the tool's process {why}" + (f": {said}" if said else ""))
    return ToolResult("output", output) if failure is None else ToolResult("error", error=failure)


class _Here:
    """A tool's process this executor started itself (it is root, or runs tools as itself)."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        transports: list[asyncio.BaseTransport],
    ) -> None:
        self.process = process
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.transports = transports

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        """The whole group: whatever the tool started too."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    async def ended(self) -> None:
        """Until the process has exited (and is reaped). Not `wait()`: it also waits for
        every process that holds one of its pipes, and a tool may leave one behind."""
        while self.process.poll() is None:
            await asyncio.sleep(0.005)

    def end_leftovers(self) -> None:
        self.kill()

    def close(self) -> None:
        for transport in self.transports:
            transport.close()


async def _start_here(folder: Path) -> _Here:
    """Started with `subprocess.Popen`, not the event loop's `subprocess_exec`: Popen
    starts the process with vfork, which costs the executor ~0.2 ms of CPU; uvloop's
    spawn forks the whole executor (its page tables), ~4.8 ms of CPU and ~14 ms of
    the loop's time per call, measured (docs/benchmarks.md)."""
    python, handed, descriptors = _interpreter()
    process = subprocess.Popen(
        [
            *python,
            "-c",
            # Not `-m`: the tool gets the very ToolContext class that `tool_process` names.
            _START if python[1:] == ["-I", "-S"] else "from services.tool_executor.tool_process import main; main()",
        ],
        # Unbuffered: the loop reads and writes the descriptors, never these file objects.
        bufsize=0,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=folder,
        env={**_basic_environment(folder), **handed},
        pass_fds=descriptors,
        # A group of its own: a timeout kills whatever the tool started too.
        start_new_session=True,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    try:
        stdin, stdout, stderr, transports = await _streams(process.stdin, process.stdout, process.stderr)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        for pipe in (process.stdin, process.stdout, process.stderr):
            pipe.close()
        process.wait()
        raise
    return _Here(process, stdin, stdout, stderr, transports)


async def _streams(
    stdin_pipe: Any, stdout_pipe: Any, stderr_pipe: Any
) -> tuple[asyncio.StreamWriter, asyncio.StreamReader, asyncio.StreamReader, list[asyncio.BaseTransport]]:
    """Our ends of a tool process's three pipes (file objects, which the transports
    own from here) as the loop's streams: its stdin to write, its stdout and stderr to read."""
    loop = asyncio.get_running_loop()
    stdout = asyncio.StreamReader(limit=1 << 16)
    stderr = asyncio.StreamReader(limit=1 << 16)
    transports: list[asyncio.BaseTransport] = []
    try:
        for pipe, reader in ((stdout_pipe, stdout), (stderr_pipe, stderr)):
            reading, _ = await loop.connect_read_pipe(
                lambda r=reader: asyncio.StreamReaderProtocol(r),  # type: ignore[misc]
                pipe,
            )
            transports.append(reading)
        writing, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, stdin_pipe)
        transports.append(writing)
    except BaseException:
        for opened in transports:
            opened.close()
        raise
    return asyncio.StreamWriter(writing, protocol, None, loop), stdout, stderr, transports


class LauncherUnavailable(Exception):
    """The tool launcher could not be reached, is not root, or refused: nothing ran."""


# SO_PEERCRED's answer: pid, uid, gid.
_PEER = struct.Struct("3i")


def _peer_uid(connection: socket.socket) -> int:
    return _PEER.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size))[1]


class _Launched:
    """A tool's process the tool launcher started (shared/tool_launch.py): its pipes are
    this executor's, its process is the launcher's to signal. Shutting down our end of
    the connection is how we ask it to kill the process's group."""

    def __init__(
        self,
        connection: socket.socket,
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        transports: list[asyncio.BaseTransport],
    ) -> None:
        self.connection = connection
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.transports = transports
        self.returncode: int | None = None
        self.watch = asyncio.ensure_future(self._until_exited())

    async def _until_exited(self) -> None:
        """The launcher's `Exited`; or its end of the connection closing (it stopped):
        the exit status is then unknown, and the call's answer, if whole, still counts."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError, ValueError):
            answer = Answer.validate_json(await loop.sock_recv(self.connection, MESSAGE_BYTES))
            if isinstance(answer, Exited):
                self.returncode = answer.exited

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)

    async def ended(self) -> None:
        # The launcher kills with SIGKILL and answers at once; bounded all the same.
        await asyncio.wait({self.watch}, timeout=10.0)

    def end_leftovers(self) -> None:
        """The launcher ended them before it said the process exited."""

    def close(self) -> None:
        self.watch.cancel()
        for transport in self.transports:
            transport.close()
        self.connection.close()


async def _launch(path: Path) -> _Launched:
    """Ask the tool launcher at `path` to start the tool's process, handing it the
    process's end of three pipes; LauncherUnavailable when it cannot or will not."""
    loop = asyncio.get_running_loop()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    connection.setblocking(False)
    try:
        await loop.sock_connect(connection, str(path))
    except OSError as error:
        connection.close()
        raise LauncherUnavailable(
            f"python tools run only through the tool launcher at {path}, which cannot be reached "
            f"({type(error).__name__}: {error.strerror or error}); nothing ran"
        ) from None
    if _peer_uid(connection) != 0:
        connection.close()
        # Only root can start a process as TOOLS_USER: anything else there is not the launcher.
        raise LauncherUnavailable(f"the tool launcher at {path} is not root's; nothing ran")
    request = LaunchRequest(launch="python-tool", environment=_plain_environment())

    def send(theirs: list[int]) -> None:
        socket.send_fds(connection, [request.model_dump_json().encode()], theirs)

    return await _started(connection, send, f"the tool launcher at {path}")


async def _started(connection: socket.socket, send: Any, starter: str) -> _Launched:
    """Hand `send` the process's end of three pipes, then read the starter's answer on
    `connection` (the launcher's, or one to the fork server); LauncherUnavailable when
    it cannot or will not start the process."""
    loop = asyncio.get_running_loop()
    ours: list[int] = []
    theirs: list[int] = []
    try:
        pipes = [os.pipe() for _ in range(3)]
        # The process reads its stdin and writes its stdout and stderr; we, the other ends.
        (stdin_read, stdin_write), (stdout_read, stdout_write), (stderr_read, stderr_write) = pipes
        ours += [stdin_write, stdout_read, stderr_read]
        theirs += [stdin_read, stdout_write, stderr_write]
        try:
            send(theirs)
            for descriptor in theirs:
                os.close(descriptor)
            theirs.clear()
            said = await loop.sock_recv(connection, MESSAGE_BYTES)
        except OSError as error:
            raise LauncherUnavailable(f"{starter} ended the connection ({type(error).__name__}); nothing ran") from None
        try:
            answer = Answer.validate_json(said)
        except ValueError:
            raise LauncherUnavailable(f"{starter} answered no start; nothing ran") from None
        if isinstance(answer, Refused):
            raise LauncherUnavailable(f"the tool launcher refused to start the tool: {answer.refused}")
        if isinstance(answer, Exited):
            raise LauncherUnavailable(f"{starter} answered no start; nothing ran")
        for descriptor in (stdin_write, stdout_read, stderr_read):
            ours.remove(descriptor)  # the pipe objects own them from here
        stdin, stdout, stderr, transports = await _streams(
            os.fdopen(stdin_write, "wb", buffering=0),
            os.fdopen(stdout_read, "rb", buffering=0),
            os.fdopen(stderr_read, "rb", buffering=0),
        )
        return _Launched(connection, stdin, stdout, stderr, transports)
    except BaseException:
        for descriptor in ours + theirs:
            with contextlib.suppress(OSError):
                os.close(descriptor)
        connection.close()
        raise


def fork_server_wanted() -> bool:
    """SIGNOFF_TOOL_FORK_SERVER (shared/settings.py `tool_fork_server`): python tools
    forked from a fork server (the default), or off: a fresh interpreter per call."""
    return os.environ.get("SIGNOFF_TOOL_FORK_SERVER", "true").strip().lower() not in ("0", "false", "no", "off")


# How long a fork server may take to answer a start before it is taken for stuck (a tool
# of the same user may stop it with SIGSTOP), killed and started again.
FORK_ANSWER_SECONDS = 5.0


class ForkServer:
    """A long-lived process of the tools' user that forks one child per python call
    (`tool_process.serve`): started like a tool's process (this Python, a plain
    environment, the tools' folder, as the tools' user, a process group of its own) and
    holding nothing else. Started on the first call; started again when it has died or
    does not answer (the calls it was running then end as processes that died)."""

    def __init__(self, run_as: tuple[int, int] | None) -> None:
        self.run_as = run_as
        self.process: subprocess.Popen[bytes] | None = None
        self.control: socket.socket | None = None
        self.starts = 0

    def _start(self, folder: Path) -> None:
        python, handed, descriptors = _interpreter()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(
                [*python, "-c", _SERVE if python[1:] == ["-I", "-S"] else _SERVE_WITH_SITE],
                bufsize=0,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=folder,
                env={**_basic_environment(folder), **handed},
                pass_fds=(*descriptors, theirs.fileno()),
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs_number = theirs.fileno()
            theirs.close()
        assert process.stdin is not None
        setup = {
            "control": theirs_number,
            "import_path": _import_path(),
            "run_as": self.run_as,
            "parent": os.getpid(),
        }
        try:
            process.stdin.write(json.dumps(setup).encode())
            process.stdin.close()
        except OSError:
            pass  # it died at once: the first start finds out
        ours.setblocking(False)
        self.process, self.control = process, ours
        self.starts += 1

    def stop(self) -> None:
        """Kill it (its calls die with it: their death signal) and reap it."""
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None

    async def fork(self, folder: Path, many: bool = False) -> _Launched:
        """A child of the fork server for one call, in `folder`, answered like a launched
        process (`many`: a warm worker, `tool_process.serve_calls`)."""
        try:
            return await self._ask(folder, many)
        except (LauncherUnavailable, TimeoutError):
            # Dead or stuck before it started the call: nothing ran, so start it again
            # and ask once more.
            self.stop()
        try:
            return await self._ask(folder, many)
        except (LauncherUnavailable, TimeoutError):
            self.stop()
            raise LauncherUnavailable("the python tools' fork server did not start the call; nothing ran") from None

    async def _ask(self, folder: Path, many: bool) -> _Launched:
        if self.process is None or self.process.poll() is not None:
            self.stop()
            self._start(folder)
        control = self.control
        assert control is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        # Entered by descriptor: the tools' user may not pass the folders above it.
        entered = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        basic = _basic_environment(folder)
        environment = json.dumps({"environment": basic, "calls": "many"} if many else basic).encode()

        def send(pipes: list[int]) -> None:
            # Non-blocking: a server that stopped reading is stuck, not waited for.
            socket.send_fds(control, [environment], [theirs.fileno(), *pipes, entered])

        try:
            async with asyncio.timeout(FORK_ANSWER_SECONDS):
                return await _started(ours, send, "the python tools' fork server")
        finally:
            theirs.close()
            os.close(entered)


# One per user the calls run as (always one but in tests): each call names its own folder.
_fork_servers: dict[tuple[int, int] | None, ForkServer] = {}


async def _fork(folder: Path, run_as: tuple[int, int] | None, many: bool = False) -> _Launched:
    server = _fork_servers.get(run_as)
    if server is None:
        server = _fork_servers[run_as] = ForkServer(run_as)
    return await server.fork(folder, many)


class _Worker:
    """A warm worker (`tool_process.serve_calls`): one tool's process, forked from the
    fork server, serving that tool's calls one at a time over its stdin and stdout."""

    def __init__(self, process: _Launched) -> None:
        self.process = process
        self.loop = asyncio.get_running_loop()
        self.calls = 0
        self.stderr_tail = bytearray()
        # Drained all along: a tool that prints must never block on a full pipe.
        self.draining = asyncio.ensure_future(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := await self.process.stderr.read(1 << 16):
                self.stderr_tail[:] = (self.stderr_tail + chunk)[-STDERR_KEPT:]

    @property
    def alive(self) -> bool:
        return (
            self.process.returncode is None
            and not self.process.watch.done()
            and self.loop is asyncio.get_running_loop()
        )

    async def call(self, call: bytes) -> bytes | None:
        """Write one call, read its one line of answer; None past RESULT_BYTES; b"" when
        the process ended without answering."""
        self.calls += 1
        self.stderr_tail.clear()
        self.process.stdin.write(call + b"\n")
        await self.process.stdin.drain()
        answer = bytearray()
        while not answer.endswith(b"\n"):
            more = await self.process.stdout.read(1 << 20)
            if not more:
                return b""
            answer += more
            if len(answer) > RESULT_BYTES:
                return None
        return bytes(answer)

    def retire(self) -> None:
        """Its group killed by the fork server (our end of the connection closes), its pipes closed."""
        if self.loop.is_closed():  # its loop's transports are gone; the connection is what the server watches
            self.process.connection.close()
            return
        self.draining.cancel()
        self.process.kill()
        self.process.close()


class WarmWorkers:
    """The warm workers of the tools marked `reuse_process`, kept per tool (and per user
    and folder): a call takes an idle one or has a new one forked, and gives it back when
    it answered. A worker serves one tool only, so what one call leaves in it (its module,
    its variables) is seen by a later call of the same tool alone; one whose call timed
    out, died or answered garbage is killed with its group, never reused."""

    # Idle workers kept per tool: the rest retire when their call is answered.
    IDLE_KEPT = 16
    # A worker retires after this many calls (what a tool's module accumulates stays bounded).
    CALLS_PER_WORKER = 10_000

    def __init__(self) -> None:
        self.idle: dict[tuple[Any, ...], list[_Worker]] = {}
        self.forks = 0

    async def run(self, spec: ToolSpec, call: Call, folder: Path, run_as: tuple[int, int] | None) -> ToolResult:
        implementation = spec.implementation
        assert isinstance(implementation, PythonImplementation)
        key = (run_as, str(folder), implementation.function, tuple(sorted(call.env.items())))
        idle = self.idle.setdefault(key, [])
        timeout = implementation.timeout_seconds
        deadline = asyncio.timeout(timeout)
        worker: _Worker | None = None
        answer: bytes | None = None
        try:
            async with deadline:
                while idle and worker is None:
                    candidate = idle.pop()
                    if candidate.alive:
                        worker = candidate
                    else:
                        candidate.retire()
                if worker is None:
                    worker = _Worker(await _fork(folder, run_as, many=True))
                    self.forks += 1
                answer = await worker.call(call.encode())
        except LauncherUnavailable as unavailable:
            return ToolResult("error", error=str(unavailable))
        except OSError as error:
            if isinstance(error, TimeoutError) and deadline.expired():
                late = f"the tool did not finish within {timeout:g} s"
                return ToolResult("outcome_unknown" if spec.effect == "outward" else "error", error=late)
            if worker is None:
                return ToolResult("error", error=f"the tool's process could not start: {type(error).__name__}: {error}")
            return ToolResult("error", error=f"the tool's process ended the call: {type(error).__name__}: {error}")
        finally:
            if worker is not None:
                whole = answer is not None and answer.endswith(b"\n")
                if whole and worker.alive and worker.calls < self.CALLS_PER_WORKER and len(idle) < self.IDLE_KEPT:
                    idle.append(worker)
                else:
                    worker.retire()
        assert worker is not None
        if answer is None:
            return ToolResult("error", error=f"the tool's process answered more than {RESULT_BYTES >> 20} MiB")
        try:
            output, failure = result_of(answer)
        except NoResult as garbage:
            if not answer:
                # Ended mid-call: what it said on stderr, once the pipe has drained.
                await asyncio.wait({worker.draining}, timeout=1.0)
            said = worker.stderr_tail.decode(errors="replace").strip()
            return ToolResult("error", error=f"the tool's process {garbage}" + (f": {said}" if said else ""))
        return ToolResult("output", output) if failure is None else ToolResult("error", error=failure)

    def stop(self) -> None:
        for workers in self.idle.values():
            for worker in workers:
                worker.retire()
        self.idle.clear()


_warm_workers = WarmWorkers()


async def _exchange(process: _Here | _Launched, call: bytes) -> tuple[bytes | None, bytes]:
    """Write the call; read the answer (past RESULT_BYTES the process is killed and the
    answer dropped) and the end of stderr; wait for the process to end, then end what
    it left behind in its group."""
    stdin, stdout, stderr = process.stdin, process.stdout, process.stderr

    async def write() -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(call)
            await stdin.drain()
            stdin.close()

    async def read_answer() -> bytes | None:
        answer = b""
        while len(answer) <= RESULT_BYTES and (more := await stdout.read(1 << 20)):
            answer += more
        if len(answer) > RESULT_BYTES:
            process.kill()
            return None
        return answer

    kept = bytearray()

    async def read_tail() -> None:
        while chunk := await stderr.read(1 << 16):
            kept[:] = (kept + chunk)[-STDERR_KEPT:]

    tail = asyncio.create_task(read_tail())
    try:
        _, answer = await asyncio.gather(write(), read_answer())
        await process.ended()
        # Whatever the tool left running in its group ends with its call (and lets go of stderr).
        process.end_leftovers()
        await asyncio.wait({tail}, timeout=1.0)
    finally:
        tail.cancel()
    return answer, bytes(kept)


def _plain_environment() -> dict[str, str]:
    basics = {name: os.environ[name] for name in PASSED_ENVIRONMENT if name in os.environ}
    basics.setdefault("PATH", os.defpath)
    return basics


def _basic_environment(folder: Path) -> dict[str, str]:
    """What any program expects to find, and nothing of the executor's (the tool's
    declared variables come on stdin, `Call.env`, out of /proc/<pid>/environ)."""
    return {**_plain_environment(), "HOME": str(folder)}


def _interpreter() -> tuple[list[str], dict[str, str], tuple[int, ...]]:
    """How the tool's process starts this Python: (command, environment, descriptors).
    Usually `-I`: no PYTHON* variables, no user site, nothing imported from its working
    directory. But `signoff up` as root starts the executor as a user who may not enter
    the folders this Python lives in, handing it those folders as descriptors named
    `/proc/self/fd/<n>` in PYTHONHOME, PYTHONPATH and LD_LIBRARY_PATH
    (services/operations/service_users.py, `Interpreter`): the tool's process is handed the same
    ones, and takes exactly those three variables (paths, no secret) with `-s -P`."""
    handed = {
        name: os.environ[name]
        for name in ("PYTHONHOME", "PYTHONPATH", "LD_LIBRARY_PATH")
        if os.environ.get(name, "").startswith(_HANDED)
    }
    if not handed and not sys.executable.startswith(_HANDED):
        # -S: no `site` either. Its `.pth` files cost more than the rest of the start
        # (an editable install's import finder alone ~11 ms of CPU per call, ~20 of ~33
        # in all, measured); the tool's process takes the executor's import path on its
        # stdin, and runs `site` itself only for a tool that cannot be imported without
        # it (`tool_process._load`). Its own module is found through `_PACKAGE_ROOT`.
        return [sys.executable, "-I", "-S"], {}, ()
    named = [sys.executable, *(part for value in handed.values() for part in value.split(":"))]
    descriptors = sorted({int(path[len(_HANDED) :].split("/")[0]) for path in named if path.startswith(_HANDED)})
    return [sys.executable, "-s", "-P"], handed, tuple(descriptors)


_HANDED = "/proc/self/fd/"
# Where `services` is imported from (a source tree or site-packages): without `site`, the
# tool's process finds `tool_process` there (and with it only the standard library).
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_START = (
    f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); from services.tool_executor.tool_process import main; main()"
)


_SERVE = (
    f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); from services.tool_executor.tool_process import serve; serve()"
)
_SERVE_WITH_SITE = "from services.tool_executor.tool_process import serve; serve()"


def _import_path() -> list[str]:
    """The executor's import path, its working directory by name: the tool imports what it did."""
    return [entry or os.getcwd() for entry in sys.path]


def _own_folder(folder: Path, run_as: tuple[int, int] | None) -> Path:
    """The tools' folder, made if missing; the tools' user's alone when there is one."""
    folder.mkdir(parents=True, exist_ok=True)
    if run_as is not None:
        status = folder.stat()
        if (status.st_uid, status.st_gid) != run_as:
            os.chown(folder, *run_as)
        folder.chmod(0o700)
    return folder


async def _run_http(
    implementation: HttpImplementation,
    spec: ToolSpec,
    arguments: dict[str, Any],
    context: ToolContext,
    http: httpx.AsyncClient,
) -> ToolResult:
    try:
        request = http_request(implementation, arguments, env=lambda name: resolve(f"${{env:{name}}}"))
    except MissingSecret as missing:
        return ToolResult("error", error=f"the executor cannot make this call: {missing}")
    # Errors name the request as the card shows it: never the URL with its secrets filled in.
    shown = shown_request(implementation, spec.shown_arguments(arguments))
    url, method, headers = request.url, request.method, {**request.headers}
    headers["Idempotency-Key"] = context.idempotency_key
    try:
        response = await http.request(
            method,
            url,
            headers=headers,
            params=request.params,
            json=request.json,
            timeout=implementation.timeout_seconds,
        )
    except (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.LocalProtocolError,
        httpx.UnsupportedProtocol,
        httpx.InvalidURL,
    ) as error:
        # Nothing reached the server: an honest error, not an unknown outcome.
        return ToolResult("error", error=f"could not connect for {shown}: {_why(error, url)}")
    except (httpx.TimeoutException, httpx.TransportError) as error:
        if spec.effect == "outward":
            # The request may have arrived: say so rather than guess (invariant 4).
            return ToolResult("outcome_unknown", error=f"{shown} failed after sending: {_why(error, url)}")
        return ToolResult("error", error=f"{shown} failed: {_why(error, url)}")
    try:
        body: Any = response.json()
    except ValueError:
        # Hidden before it is cut: a secret cut in two would no longer be found.
        body = redact_text(response.text, spec.secret_values(arguments))[:10_000]
    if response.is_success:
        return ToolResult("output", {"status": response.status_code, "body": body})
    # The receiver's answer, its secrets hidden and cut short by `run_tool`: enough to say why.
    return ToolResult("error", error=f"HTTP {response.status_code} from {shown}: {body}")


# Said when an `mcp` tool is approved on an executor installed without the MCP SDK.
MCP_MISSING = "this executor cannot run MCP tools: the MCP SDK is not installed (pip install 'signoff[mcp]')"


class McpConnections:
    """The executor's connections to the MCP servers its `mcp` tools name: one kept open
    per server (shared/mcp_upstream.py `Upstream`, as the proxy keeps its upstreams),
    opened on the server's first call and again after it broke or stopped answering. A
    stdio server's process is started as it always was, with its declared variables
    alone, and now serves the calls that follow. The SDK is imported on the first `mcp`
    call, never before."""

    # How long `close` lets the calls still running on a connection end before closing it.
    CLOSE_SECONDS = 10.0

    def __init__(self) -> None:
        # By the server's declaration: a catalogue that changes it gets a new connection.
        self._served: dict[str, tuple[Any, asyncio.Task[None]]] = {}

    def upstream(self, mcp_upstream: Any, server: McpServer) -> Any:
        key = server.model_dump_json()
        served = self._served.get(key)
        if served is None or served[1].done():
            # Credentials come from the executor's environment (`${env:…}`): the keys
            # folder's files are each service's own, and none of them is a tool's.
            upstream = mcp_upstream.Upstream(server.shown, server, None)
            served = self._served[key] = (upstream, asyncio.create_task(upstream.serve(), name=f"mcp {server.shown}"))
        return served[0]

    def keep_only(self, catalogue: ToolCatalogue) -> None:
        """After a reload: a server no tool names any more is let go (the calls running
        on it finish there, then its connection closes)."""
        named = {
            spec.implementation.server.model_dump_json()
            for spec in catalogue.tools
            if isinstance(spec.implementation, McpImplementation)
        }
        for key in set(self._served) - named:
            self._served.pop(key)[1].cancel()

    async def close(self, seconds: float = CLOSE_SECONDS) -> None:
        served = list(self._served.values())
        self._served.clear()
        for _, serving in served:
            serving.cancel()
        await asyncio.gather(*(serving for _, serving in served), return_exceptions=True)
        await asyncio.gather(*(upstream.closed(seconds) for upstream, _ in served))


async def _run_mcp(
    implementation: McpImplementation, spec: ToolSpec, arguments: dict[str, Any], connections: McpConnections | None
) -> ToolResult:
    """One `tools/call` on the server's kept connection (`connections`; without them, on
    one opened for this call alone). The SDK is an optional extra, imported here, when an
    `mcp` tool runs: an executor without it refuses the call, saying so, and nothing was sent."""
    try:
        mcp_upstream = importlib.import_module("shared.mcp_upstream")
    except ImportError:
        return ToolResult("error", error=MCP_MISSING)
    own = connections is None
    if connections is None:
        connections = McpConnections()
    server = implementation.server
    # The longest a call can take there: waiting behind a start that fails, its own start,
    # then the call. Past it (which `Upstream` should never let happen), it may have run.
    bound = 2 * server.connect_timeout_seconds + server.timeout_seconds + 5
    try:
        async with asyncio.timeout(bound):
            result = await connections.upstream(mcp_upstream, server).call_tool(implementation.tool, arguments)
    except TimeoutError:
        failure = mcp_upstream.UpstreamFailure("no_answer", f"{server.shown} did not answer within {bound:g}s")
    except mcp_upstream.UpstreamFailure as failed:
        failure = failed
    else:
        failure = None
    finally:
        if own:
            await connections.close()
    if failure is not None:
        if failure.may_have_run and spec.effect == "outward":
            # The call was sent: whether it ran is unknown, and it is never sent again (invariant 4).
            return ToolResult("outcome_unknown", error=f"MCP tool {implementation.tool}: {failure} ({failure.kind})")
        return ToolResult("error", error=f"MCP tool {implementation.tool}: {failure} ({failure.kind})")
    if result.is_error:
        # The tool ran and said it failed: its own words.
        said = " ".join(getattr(block, "text", "") for block in result.content).strip()
        return ToolResult("error", error=f"MCP tool {implementation.tool} failed: {said or '(no text)'}")
    return ToolResult("output", result.model_dump(mode="json", by_alias=True, exclude_none=True))


def _why(error: Exception, url: str) -> str:
    """An httpx error without the URL it may quote (the real one, secrets filled in)."""
    return f"{type(error).__name__}: {str(error).replace(url, redact_url(url))}"
