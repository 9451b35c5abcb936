"""The tool launcher (services/operations/tool_launcher.py, shared/tool_launch.py): a root process
that starts python tools as `signoff-tools` for an executor that is not root. It serves
only the executor's uid, accepts nothing but a valid launch request with three pipe
ends, and kills the tool's whole process group when the executor lets go (a timeout:
the executor cannot signal another user's processes)."""

import asyncio
import contextlib
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from services.tool_executor.tool_process import Call, ToolContext
from services.tool_executor.tools import run_tool
from shared.catalogue import PythonImplementation, ToolSpec
from shared.settings import PROJECT_ROOT
from shared.tool_launch import TOOLS_USER, Answer, Exited, Refused, Started

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the launcher switches users: root only (CI is root)")


class Launcher:
    def __init__(self, base: Path, client: int, fork_server: bool = True) -> None:
        self.socket = base / "run" / "launcher.sock"
        self.tools_dir = base / "tools"
        self.fork_server = fork_server
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.operations.tool_launcher", "--socket", str(self.socket), "--client", str(client),
             "--tools-dir", str(self.tools_dir)],
            cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "SIGNOFF_TOOL_FORK_SERVER": "true" if fork_server else "false"})
        said = self.process.stdout.readline()
        # One JSON object a line, as every service logs to a file or a pipe.
        assert json.loads(said)["message"].startswith("tool-launcher ready"), said + self.process.stdout.read()

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(10) == 0


def launcher_for(client: int, fork_server: bool = True):
    base = Path(tempfile.mkdtemp(prefix="launcher-"))
    launcher = Launcher(base, client, fork_server)
    try:
        yield launcher
    finally:
        launcher.stop()
        subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture(scope="module", params=["fork-server", "interpreter-per-call"])
def launcher(request):
    """A launcher that serves this test's own uid (root): with its fork server (the
    default), and starting a fresh interpreter per call (SIGNOFF_TOOL_FORK_SERVER=0)."""
    yield from launcher_for(os.geteuid(), request.param == "fork-server")


@pytest.fixture(scope="module")
def nobodys_launcher():
    """A launcher that serves `nobody` alone."""
    yield from launcher_for(pwd.getpwnam("nobody").pw_uid)


def connect(path: Path) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    connection.settimeout(10)
    connection.connect(str(path))
    return connection


def answer(connection: socket.socket):
    data = connection.recv(16384)
    return Answer.validate_json(data) if data else None


class Pipes:
    """The tool's three pipes: its ends (to hand over) and ours."""

    def __init__(self) -> None:
        self.stdin = os.pipe()
        self.stdout = os.pipe()
        self.stderr = os.pipe()

    @property
    def theirs(self) -> list[int]:
        return [self.stdin[0], self.stdout[1], self.stderr[1]]

    def hand_over(self, connection: socket.socket, request: bytes, descriptors: list[int] | None = None) -> None:
        socket.send_fds(connection, [request], self.theirs if descriptors is None else descriptors)
        for descriptor in self.theirs:
            os.close(descriptor)

    def write_call(self, data: bytes) -> None:
        with os.fdopen(self.stdin[1], "wb") as stdin:
            stdin.write(data)

    def read_stdout(self) -> bytes:
        with contextlib.suppress(OSError):
            os.close(self.stdin[1])
        with os.fdopen(self.stdout[0], "rb") as out:
            return out.read()


REQUEST = json.dumps({"launch": "python-tool", "environment": {"PATH": os.defpath}}).encode()


@pytest.fixture(autouse=True)
def no_note_left(request):
    """Each test reads the pid its own tool noted, never one a test before it left."""
    if "launcher" in request.fixturenames:
        request.getfixturevalue("launcher").tools_dir.joinpath("grandchild.pid").unlink(missing_ok=True)


def call(function: str, data_dir: Path) -> bytes:
    context = ToolContext("call_1", "ses_1", "idk_1", 1, data_dir)
    return Call(f"tests.fixture_tools:{function}", {}, context, {}, [str(PROJECT_ROOT)], None).encode()


def test_a_peer_with_another_uid_is_refused_and_nothing_runs(nobodys_launcher):
    pipes = Pipes()
    with connect(nobodys_launcher.socket) as connection:
        pipes.hand_over(connection, REQUEST)
        refused = answer(connection)
        assert isinstance(refused, Refused)
        assert refused.refused == f"only uid {pwd.getpwnam('nobody').pw_uid} may start tools, not {os.geteuid()}"
        assert answer(connection) is None, "the launcher closes the connection after a refusal"
    assert pipes.read_stdout() == b"", "no process got the pipes"


def test_a_peer_with_the_executors_uid_gets_its_tool_run_as_signoff_tools(launcher):
    pipes = Pipes()
    with connect(launcher.socket) as connection:
        pipes.hand_over(connection, REQUEST)
        assert isinstance(answer(connection), Started)
        pipes.write_call(call("reads_its_secret", launcher.tools_dir).replace(b'"arguments": {}',
                                                                                b'"arguments": {"name": "X"}'))
        result = json.loads(pipes.read_stdout())["output"]
        assert answer(connection) == Exited(exited=0)
    assert result["uid"] == pwd.getpwnam(TOOLS_USER).pw_uid != os.geteuid()


@pytest.mark.parametrize(("request_bytes", "why"), [
    (b"not json", "not a launch request"),
    (b'{"launch": "python-tool"}', "environment: Field required"),
    (b'{"launch": "shell", "environment": {}}', "launch: Input should be 'python-tool'"),
    (b'{"launch": "python-tool", "environment": {}, "user": 0}', "user: Extra inputs are not permitted"),
    (b'{"launch": "python-tool", "environment": {}, "function": "os:system"}', "function: Extra inputs"),
    (b'{"launch": "python-tool", "environment": {"LD_PRELOAD": "/tmp/evil.so"}}', "not ['LD_PRELOAD']"),
    (b'{"launch": "python-tool", "environment": {"SIGNOFF_KEYS_DIR": "/keys"}}', "not ['SIGNOFF_KEYS_DIR']"),
    (b'{"launch": "python-tool", "environment": {"PATH": "/bin\\u0000x"}}', "environment.PATH: String should match"),
    (b'{"launch": "python-tool", "environment": {"PATH": 3}}', "environment.PATH: Input should be a valid string"),
    (b"x" * 20000, "too long"),
], ids=["not json", "no environment", "another program", "a user", "a function", "a loader variable",
        "a setting", "a NUL", "not a string", "too long"])
def test_a_malformed_request_is_refused_with_a_reason_and_nothing_runs(launcher, request_bytes, why):
    pipes = Pipes()
    with connect(launcher.socket) as connection:
        pipes.hand_over(connection, request_bytes)
        refused = answer(connection)
        assert isinstance(refused, Refused) and why in refused.refused, refused
        assert "/tmp/evil.so" not in refused.refused and "/keys" not in refused.refused, "a refusal echoes no value"
    assert pipes.read_stdout() == b""


def test_descriptors_that_are_not_the_three_pipe_ends_are_refused(launcher, tmp_path):
    cases = []
    pipes = Pipes()
    cases.append((pipes, pipes.theirs[:2], "expected 3 descriptors"))
    pipes = Pipes()
    cases.append((pipes, [pipes.stdin[1], pipes.stdout[1], pipes.stderr[1]], "stdin is not a pipe's read end"))
    pipes = Pipes()
    file = os.open(tmp_path / "a-file", os.O_WRONLY | os.O_CREAT)
    cases.append((pipes, [pipes.stdin[0], file, pipes.stderr[1]], "stdout is not a pipe"))
    for pipes, descriptors, why in cases:
        with connect(launcher.socket) as connection:
            pipes.hand_over(connection, REQUEST, descriptors)
            refused = answer(connection)
            assert isinstance(refused, Refused) and why in refused.refused, refused
    os.close(file)


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def wait_for(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


@pytest.mark.parametrize("letting_go", ["closes", "shuts down its writing"])
def test_when_the_executor_lets_go_the_tools_whole_process_group_is_killed(launcher, letting_go):
    pipes = Pipes()
    connection = connect(launcher.socket)
    pipes.hand_over(connection, REQUEST)
    assert isinstance(answer(connection), Started)
    pipes.write_call(call("hangs_with_a_child", launcher.tools_dir))
    noted = launcher.tools_dir / "grandchild.pid"
    assert wait_for(lambda: noted.exists() and noted.read_text(), 30)
    grandchild = int(noted.read_text())
    tool = os.getpgid(grandchild)
    assert alive(grandchild) and alive(tool)
    assert pwd.getpwuid(os.stat(f"/proc/{grandchild}").st_uid).pw_name == TOOLS_USER
    if letting_go == "closes":
        connection.close()
    else:
        connection.shutdown(socket.SHUT_WR)
        assert answer(connection) == Exited(exited=-signal.SIGKILL)
        connection.close()
    assert wait_for(lambda: not alive(tool) and not alive(grandchild)), "the tool or what it started outlived the call"


def test_a_tool_that_ends_leaving_a_process_behind_has_it_killed_before_its_exit_is_reported(launcher):
    pipes = Pipes()
    with connect(launcher.socket) as connection:
        pipes.hand_over(connection, REQUEST)
        assert isinstance(answer(connection), Started)
        pipes.write_call(call("leaves_a_child_behind", launcher.tools_dir))
        assert answer(connection) == Exited(exited=0)
        grandchild = int((launcher.tools_dir / "grandchild.pid").read_text())
        assert wait_for(lambda: not alive(grandchild), 2)
    os.close(pipes.stdout[0])
    os.close(pipes.stderr[0])


def test_the_socket_is_in_a_folder_only_root_and_the_executors_group_may_enter(launcher):
    folder = launcher.socket.parent.stat()
    assert (folder.st_uid, folder.st_mode & 0o777) == (0, 0o750)
    assert (launcher.tools_dir.stat().st_uid, launcher.tools_dir.stat().st_mode & 0o777) == \
        (pwd.getpwnam(TOOLS_USER).pw_uid, 0o700)


# Through run_tool, as the executor uses it (services/tool_executor/tools.py).

def spec(function: str, env: list[str] | None = None, timeout: float | None = None, effect: str = "read") -> ToolSpec:
    implementation = PythonImplementation(function=f"tests.fixture_tools:{function}", env=env or [],
                                          **({"timeout_seconds": timeout} if timeout else {}))
    return ToolSpec(name="t", label="t", effect=effect, implementation=implementation)


def context(data_dir: Path) -> ToolContext:
    return ToolContext("call_1", "ses_1", "idk_1", 1, data_dir)


async def test_through_the_launcher_a_tool_runs_as_signoff_tools_with_its_declared_variable_alone(
        launcher, monkeypatch, tmp_path):
    monkeypatch.setenv("TOOL_OWN_SECRET", "own-value-123456")
    monkeypatch.setenv("SIGNOFF_RABBITMQ_URL", "amqp://executor:password@localhost/")
    result = await run_tool(spec("reads_its_secret", env=["TOOL_OWN_SECRET"]), {"name": "TOOL_OWN_SECRET"},
                            context(tmp_path), None, launcher.socket)
    assert result.outcome == "output", result.error
    assert result.output["uid"] == pwd.getpwnam(TOOLS_USER).pw_uid
    assert set(result.output["names"]) <= {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME", "TOOL_OWN_SECRET",
                                           "PYTHONHOME", "PYTHONPATH", "LD_LIBRARY_PATH"}
    assert "TOOL_OWN_SECRET" in result.output["names"]


async def test_through_the_launcher_a_timeout_kills_the_tool_and_what_it_started(launcher, tmp_path):
    started = time.monotonic()
    # 5 s, so a loaded machine's fork and imports cannot use up the timeout before the child starts.
    result = await run_tool(spec("hangs_with_a_child", timeout=5, effect="outward"), {}, context(tmp_path), None,
                            launcher.socket)
    assert (result.outcome, result.error) == ("outcome_unknown", "the tool did not finish within 5 s")
    assert time.monotonic() - started < 15, "the call waited for the tool, not its timeout"
    grandchild = int((launcher.tools_dir / "grandchild.pid").read_text())
    assert await asyncio.to_thread(wait_for, lambda: not alive(grandchild)), "what the tool started outlived it"


async def test_through_the_launcher_a_dying_or_garbled_process_is_an_error_saying_how(launcher, tmp_path):
    died = await run_tool(spec("dies"), {}, context(tmp_path), None, launcher.socket)
    assert (died.outcome, died.error) == ("error", "the tool's process exited with -9: about to die")
    garbled = await run_tool(spec("answers_garbage"), {}, context(tmp_path), None, launcher.socket)
    assert garbled.error == "the tool's process answered something that is not JSON (10 bytes)"


async def test_a_configured_launcher_that_cannot_be_reached_is_an_error_and_the_tool_never_runs_here(tmp_path):
    result = await run_tool(spec("sleep_then_count"), {"counter": "never"}, context(tmp_path), None,
                            tmp_path / "no-launcher.sock")
    assert result.outcome == "error"
    assert result.error.startswith(f"python tools run only through the tool launcher at {tmp_path}/no-launcher.sock, "
                                   "which cannot be reached (FileNotFoundError")
    assert not list(tmp_path.rglob("never.*")), "the tool ran without the launcher"


async def test_a_launcher_that_refuses_is_an_error_naming_why(nobodys_launcher, tmp_path):
    result = await run_tool(spec("sleep_then_count"), {"counter": "never"}, context(tmp_path), None,
                            nobodys_launcher.socket)
    assert result.outcome == "error"
    assert result.error.startswith("the tool launcher refused to start the tool: only uid")


async def test_through_the_launcher_a_tool_that_kills_its_parent_ends_its_own_call_and_the_next_call_runs(
        launcher, tmp_path):
    killed = await run_tool(spec("kills_its_parent"), {}, context(tmp_path), None, launcher.socket)
    if launcher.fork_server:
        # Its parent is the fork server, of its own user: the call dies with it.
        assert (killed.outcome, killed.error) == ("error",
                                                  "the tool's process answered something that is not JSON (0 bytes)")
    else:
        assert (killed.outcome, killed.output) == ("output", "its parent is not of its user")
    after = await run_tool(spec("reads_its_secret"), {"name": "NONE"}, context(tmp_path), None, launcher.socket)
    assert after.outcome == "output", after.error
    assert after.output["uid"] == pwd.getpwnam(TOOLS_USER).pw_uid
    assert launcher.process.poll() is None, "the launcher died"
