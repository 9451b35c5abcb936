"""The tool launcher: a small root process that starts python tools as `signoff-tools`
for an executor that is not root (shared/tool_launch.py has the protocol).

Why: a tool run as the executor's own user could read the executor's passwords,
publish as the executor and finish its claims (docs/design.md, "Trust boundaries").
The executor runs as its own unprivileged user (`signoff up` as root, the image), so
something else must be able to switch users. This process can, and holds nothing
else: no setting, password, key or tool secret (it is started with a plain
environment and never sees a call's arguments or a tool's variables, which the
executor writes on the tool's stdin itself).

What it does, and nothing more:
- listens on a Unix socket in a folder only root and the executor's group may
  enter (0750), and serves only the executor's uid (SO_PEERCRED);
- for a valid `LaunchRequest` with the tool's three pipe ends, starts
  `tool_process` as TOOLS_USER (no supplementary groups, its own process group, in
  its own folder, the interpreter handed as descriptors like every service under
  `signoff up`, `services/operations/service_users.py` `Interpreter`), dying with the launcher;
- kills the tool's whole process group when the process ends (what it left behind),
  when the executor closes or shuts down its end (a timeout), or when the launcher
  stops; and says how the process ended.

One thread, one `selectors` loop: no lock, and `preexec_fn` is safe.

    python -m services.operations.tool_launcher --socket PATH --client USER [--tools-dir PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import pwd
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from shared import logs
from shared.tool_launch import MESSAGE_BYTES, LaunchRequest, Refused, Started, ToolUserMissing, tools_account
from shared.tool_launch import Exited as ExitedAnswer

# Its name among `signoff up`'s children (its log: <log dir>/tool-launcher.log).
SERVICE = "tool-launcher"
log = logging.getLogger("signoff.tool_launcher")


def logs_format(said: str) -> logs.LogFormat:
    """SIGNOFF_LOG_FORMAT, the one setting it reads (it takes no other of Signoff's)."""
    if said == "json":
        return "json"
    return "text" if said == "text" else "auto"


# The tool's own process (services/tool_executor/tool_process.py), as the executor starts it.
TOOL_PROCESS = "from services.tool_executor.tool_process import main; main()"
# Its fork server (tool_process.serve), unless SIGNOFF_TOOL_FORK_SERVER is off.
FORK_SERVER = "from services.tool_executor.tool_process import serve; serve()"
# SO_PEERCRED's answer: pid, uid, gid.
PEER = struct.Struct("3i")


def socket_path(data_dir: Path) -> Path:
    """Where `signoff up` puts the launcher's socket: a folder of its own in the data folder."""
    return data_dir / "tool-launcher" / "launcher.sock"


def peer_uid(connection: socket.socket) -> int:
    return PEER.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER.size))[1]


def pipe_ends_problem(descriptors: list[int]) -> str | None:
    """Exactly three pipe ends: the tool's stdin to read, its stdout and stderr to write."""
    if len(descriptors) != 3:
        return f"expected 3 descriptors (stdin, stdout, stderr), got {len(descriptors)}"
    for name, descriptor, mode in zip(
        ("stdin", "stdout", "stderr"), descriptors, (os.O_RDONLY, os.O_WRONLY, os.O_WRONLY), strict=True
    ):
        if not stat.S_ISFIFO(os.fstat(descriptor).st_mode):
            return f"the tool's {name} is not a pipe"
        if fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_ACCMODE != mode:
            return f"the tool's {name} is not a pipe's {'read' if mode == os.O_RDONLY else 'write'} end"
    return None


def dying_with_the_launcher() -> Callable[[], None]:
    """What the tool's process calls after it became TOOLS_USER (a change of user clears
    the setting): SIGKILL when the launcher dies, so no tool outlives the process that
    watches it. Prepared here: a process that has already become TOOLS_USER may not load
    anything from this Python's folders (pyenv under /root)."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    launcher = os.getpid()

    def die_with_launcher() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != launcher:  # it died before the signal was asked for
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_launcher


def fork_server_wanted() -> bool:
    """SIGNOFF_TOOL_FORK_SERVER, as the executor reads it (services/tool_executor/tools.py)."""
    return os.environ.get("SIGNOFF_TOOL_FORK_SERVER", "true").strip().lower() not in ("0", "false", "no", "off")


class ToolsForkServer:
    """The launcher's fork server (`tool_process.serve`): started as TOOLS_USER exactly as
    a tool's process would be, dying with the launcher; a valid request's connection and
    descriptors are handed to it, and it forks the call's process, answers `Started` and
    later `Exited` on the executor's connection, and kills the call's group when the
    executor lets go. Started again when it has died or stopped reading."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self.process: subprocess.Popen | None = None
        self.control: socket.socket | None = None

    def _start(self, environment: dict[str, str]) -> None:
        launcher = self.launcher
        uid, gid = launcher.tools
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(
                launcher.python.command("-s", "-P", "-c", FORK_SERVER),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=launcher.tools_dir,
                env=self._environment(environment),
                pass_fds=(*launcher.python.descriptors, theirs.fileno()),
                user=uid,
                group=gid,
                extra_groups=[],
                umask=0o077,
                start_new_session=True,
                preexec_fn=launcher.die_with_launcher,
            )
            setup = {"control": theirs.fileno(), "import_path": [], "run_as": None, "parent": os.getpid()}
        finally:
            theirs.close()
        assert process.stdin is not None
        with contextlib.suppress(OSError):  # it died at once: the hand-over finds out
            process.stdin.write(json.dumps(setup).encode())
            process.stdin.close()
        ours.setblocking(False)
        self.process, self.control = process, ours

    def _environment(self, environment: dict[str, str]) -> dict[str, str]:
        return {**environment, "HOME": str(self.launcher.tools_dir), **self.launcher.python.environment()}

    def hand(self, connection: socket.socket, environment: dict[str, str], descriptors: list[int]) -> bool:
        """Hand the call to the fork server; False if it cannot take it even after a restart."""
        folder = os.open(self.launcher.tools_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            message = json.dumps(self._environment(environment)).encode()
            for _ in range(2):
                if self.process is None or self.process.poll() is not None:
                    self.stop()
                    self._start(environment)
                assert self.control is not None
                try:
                    socket.send_fds(self.control, [message], [connection.fileno(), *descriptors, folder])
                    return True
                except OSError:  # dead, or stuck (not reading): nothing ran
                    self.stop(wait=0)
            return False
        finally:
            os.close(folder)

    def stop(self, wait: float = 5.0) -> None:
        """Its end of the control socket closed, it kills its calls' groups and exits;
        killed past `wait` seconds (at once when it is stuck: the launcher has one thread)."""
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.process is not None:
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


@dataclass
class Connection:
    socket: socket.socket
    # Who connected, as the kernel says (SO_PEERCRED): not what the peer claims.
    uid: int
    process: subprocess.Popen | None = None
    pidfd: int | None = None


class Launcher:
    def __init__(self, path: Path, client: str, tools_dir: Path) -> None:
        if os.geteuid() != 0:
            raise SystemExit("the tool launcher must run as root: it starts each python tool as its own user")
        try:
            self.tools = tools_account()
        except ToolUserMissing as missing:
            raise SystemExit(str(missing)) from None
        entry = pwd.getpwuid(int(client)) if client.isdigit() else pwd.getpwnam(client)
        if entry.pw_uid == self.tools[0]:
            raise SystemExit(f"the launcher's client is the executor's user, never the tools' own ({entry.pw_name})")
        self.client_uid = entry.pw_uid
        self.path = path
        self.tools_dir = tools_dir
        # The tools' folder: theirs alone; they reach it as their working directory.
        # Changed only if it differs: in a container the launcher holds CAP_CHOWN but not
        # CAP_FOWNER, so it cannot chmod a folder the image already gave the tools' user.
        tools_dir.mkdir(parents=True, exist_ok=True)
        if stat.S_IMODE(tools_dir.stat().st_mode) != 0o700:
            tools_dir.chmod(0o700)
        if (tools_dir.stat().st_uid, tools_dir.stat().st_gid) != self.tools:
            os.chown(tools_dir, *self.tools)
        # Only root and the executor's group may enter the socket's folder: no tool can
        # reach, replace or squat the socket (and the launcher checks who connects anyway).
        folder = path.parent
        folder.mkdir(parents=True, exist_ok=True)
        if (folder.stat().st_uid, folder.stat().st_gid) != (0, entry.pw_gid):
            os.chown(folder, 0, entry.pw_gid)
        folder.chmod(0o750)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(str(path))
        os.chown(path, 0, entry.pw_gid)
        path.chmod(0o660)
        self.listener.listen(64)
        self.listener.setblocking(False)
        from services.operations.service_users import Interpreter

        self.python = Interpreter()
        self.die_with_launcher = dying_with_the_launcher()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.connections: dict[int, Connection] = {}
        self.fork_server = ToolsForkServer(self) if fork_server_wanted() else None

    def serve(self, stop: list[bool] | None = None) -> None:
        stop = stop if stop is not None else [False]
        try:
            while not stop[0]:
                for key, _ in self.selector.select(timeout=0.5):
                    if key.data is None:
                        self._accept()
                    else:
                        kind, connection = key.data
                        if kind == "socket":
                            self._readable(connection)
                        else:
                            self._exited(connection)
        finally:
            self.close()

    def close(self) -> None:
        if self.fork_server is not None:
            self.fork_server.stop()
        for connection in list(self.connections.values()):
            self._kill(connection)
            if connection.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    connection.process.wait(5)
            self._forget(connection)
        with contextlib.suppress(OSError):
            self.selector.unregister(self.listener)
        self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        client.setblocking(False)
        connection = Connection(client, peer_uid(client))
        self.connections[client.fileno()] = connection
        self.selector.register(client, selectors.EVENT_READ, ("socket", connection))

    def _readable(self, connection: Connection) -> None:
        if connection.process is None:
            self._request(connection)
            return
        # Anything after the request (data, or the end of the connection) means stop.
        with contextlib.suppress(OSError):
            connection.socket.recv(1)
        self.selector.unregister(connection.socket)
        self._kill(connection)

    def _request(self, connection: Connection) -> None:
        try:
            data, descriptors, flags, _ = socket.recv_fds(connection.socket, MESSAGE_BYTES, 4)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._forget(connection)
            return
        try:
            if not data and not descriptors:
                self._forget(connection)  # gone before asking
                return
            if connection.uid != self.client_uid:
                # Anyone else (a tool, another service) starts nothing; its request is not looked at.
                self._refuse(connection, f"only uid {self.client_uid} may start tools, not {connection.uid}")
                return
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                self._refuse(connection, "the request is too long or carries too many descriptors")
                return
            problem = pipe_ends_problem(descriptors)
            if problem:
                self._refuse(connection, problem)
                return
            try:
                request = LaunchRequest.model_validate_json(data)
            except ValidationError as invalid:
                # What was wrong, by place and rule: never the value sent.
                why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in invalid.errors())
                self._refuse(connection, f"not a launch request: {why}"[:900])
                return
            self._start(connection, request, descriptors)
        finally:
            for descriptor in descriptors:
                with contextlib.suppress(OSError):
                    os.close(descriptor)

    def _start(self, connection: Connection, request: LaunchRequest, descriptors: list[int]) -> None:
        if self.fork_server is not None:
            if self.fork_server.hand(connection.socket, request.environment, descriptors):
                # The fork server answers on the connection from here: ours is let go.
                self._forget(connection)
            else:
                self._refuse(connection, "the python tools' fork server could not be started")
            return
        uid, gid = self.tools
        stdin, stdout, stderr = descriptors
        try:
            process = subprocess.Popen(
                self.python.command("-s", "-P", "-c", TOOL_PROCESS),
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                # Its folder by descriptor-free path: entered before the switch of user (chdir
                # comes first), so a folder above it only root may enter does not matter.
                cwd=self.tools_dir,
                env={**request.environment, "HOME": str(self.tools_dir), **self.python.environment()},
                pass_fds=self.python.descriptors,
                user=uid,
                group=gid,
                extra_groups=[],
                umask=0o077,
                # A group of its own: whatever the tool starts is killed with it.
                start_new_session=True,
                preexec_fn=self.die_with_launcher,
            )
        except (OSError, subprocess.SubprocessError) as error:  # SubprocessError: preexec_fn failed
            self._refuse(connection, f"the tool's process could not start: {type(error).__name__}: {error}")
            return
        connection.process = process
        connection.pidfd = os.pidfd_open(process.pid)
        self.selector.register(connection.pidfd, selectors.EVENT_READ, ("process", connection))
        self._send(connection.socket, Started())

    def _exited(self, connection: Connection) -> None:
        """The process ended (not yet reaped, so its group id is still its own): end what
        it left in its group, then say how it ended."""
        assert connection.process is not None and connection.pidfd is not None
        self._kill(connection)
        code = connection.process.wait()
        self._send(connection.socket, ExitedAnswer(exited=code))
        self._forget(connection)

    def _kill(self, connection: Connection) -> None:
        process = connection.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    def _refuse(self, connection: Connection, reason: str) -> None:
        self._send(connection.socket, Refused(refused=reason))
        self._forget(connection)

    def _send(self, client: socket.socket, answer: BaseModel) -> None:
        # The executor may be gone (its end closed): nobody left to tell.
        with contextlib.suppress(OSError):
            client.send(answer.model_dump_json().encode())

    def _forget(self, connection: Connection) -> None:
        for registered in (connection.socket, connection.pidfd):
            if registered is not None:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self.selector.unregister(registered)
        if connection.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(connection.pidfd)
            connection.pidfd = None
        self.connections.pop(connection.socket.fileno(), None)
        connection.socket.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="signoff tool-launcher", description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", type=Path, default=os.environ.get("SIGNOFF_TOOL_LAUNCHER"), required=False)
    parser.add_argument("--client", required=True, help="the executor's user (name or uid): the only one served")
    parser.add_argument(
        "--tools-dir",
        type=Path,
        default=Path(os.environ.get("SIGNOFF_DATA_DIR", "data")) / "tools",
        help="the tools' working folder (made theirs alone)",
    )
    arguments = parser.parse_args(argv)
    if arguments.socket is None:
        parser.error("--socket (or SIGNOFF_TOOL_LAUNCHER) is required")
    # Its lines like every service's: one JSON object a line in a log file (README, "Logs").
    logs.configure(SERVICE, logs_format(os.environ.get("SIGNOFF_LOG_FORMAT", "auto")), stream=sys.stdout)
    launcher = Launcher(arguments.socket.absolute(), arguments.client, arguments.tools_dir.absolute())
    stop = [False]

    def stopping(*_: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    log.info("tool-launcher ready on %s, for uid %d (pid %d)", launcher.path, launcher.client_uid, os.getpid())
    try:
        launcher.serve(stop)
    except Exception:
        log.critical("tool-launcher stopped", exc_info=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
