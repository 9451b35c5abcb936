"""Python tools run off the executor's event loop, within their declared timeout
(services/tool_executor/tools.py): a slow tool never stops the claim's heartbeat,
and a call that runs too long ends honestly (invariant 4)."""

import asyncio
import os
import time
from pathlib import Path

import pytest

from services.tool_executor import tools
from services.tool_executor.tools import ToolContext, run_tool, tools_user
from shared.catalogue import PythonImplementation, ToolSpec
from tests.fixture_tools import runs_folder


@pytest.fixture(autouse=True, params=["fork-server", "interpreter-per-call"])
def way(request, monkeypatch):
    """Every test both ways: forked from the fork server (the default), and started as a
    fresh interpreter (SIGNOFF_TOOL_FORK_SERVER=0)."""
    monkeypatch.setenv("SIGNOFF_TOOL_FORK_SERVER", "true" if request.param == "fork-server" else "false")
    return request.param


def spec(function: str, effect: str = "read", timeout: float | None = None) -> ToolSpec:
    implementation = PythonImplementation(function=f"tests.fixture_tools:{function}",
                                          **({"timeout_seconds": timeout} if timeout else {}))
    return ToolSpec(name="t", label="t", effect=effect, implementation=implementation)


def context(tmp_path: Path) -> ToolContext:
    return ToolContext("call_1", "ses_1", "idk_1", 1, tmp_path)


async def ticking_while(work):
    """How many 20 ms ticks the loop made while `work` ran, and its result."""
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        result = await work
    finally:
        ticker.cancel()
    return ticks, result


async def test_a_slow_plain_tool_leaves_the_loop_free_for_the_heartbeat(tmp_path):
    started = time.monotonic()
    ticks, result = await ticking_while(run_tool(
        spec("sleep_then_count"), {"seconds": 0.6, "counter": "c"}, context(tmp_path), None))
    assert result.outcome == "output" and result.output == {"counter": "c", "slept": 0.6}
    assert time.monotonic() - started >= 0.6
    assert ticks >= 15, f"the loop ticked {ticks} times in 0.6 s: the tool blocked it"
    assert (runs_folder(tmp_path) / "c.ran").read_text().count("\n") == 1


async def test_an_async_tool_runs_on_the_loop_and_is_awaited(tmp_path):
    ticks, result = await ticking_while(run_tool(spec("nap"), {"seconds": 0.3}, context(tmp_path), None))
    assert (result.outcome, result.output) == ("output", {"napped": 0.3}) and ticks >= 8


@pytest.mark.parametrize(("effect", "outcome"), [("outward", "outcome_unknown"), ("idempotent", "error"),
                                                 ("read", "error")])
@pytest.mark.parametrize("function", ["sleep_then_count", "nap"])
async def test_a_call_past_its_timeout_ends_outward_as_outcome_unknown_and_otherwise_as_an_error(
        tmp_path, effect, outcome, function):
    started = time.monotonic()
    result = await run_tool(spec(function, effect, timeout=0.2), {"seconds": 20, "counter": "t"}, context(tmp_path),
                            None)
    assert time.monotonic() - started < 10, "the call ended when the tool did, not at its timeout"
    assert result.outcome == outcome and "did not finish within 0.2 s" in result.error


def test_a_python_tool_declares_its_timeout_or_gets_the_default():
    assert PythonImplementation(function="m:f").timeout_seconds == 60.0
    assert PythonImplementation(function="m:f", timeout_seconds=2.5).timeout_seconds == 2.5
    with pytest.raises(ValueError):
        PythonImplementation(function="m:f", timeout_seconds=0)


async def test_what_a_tool_raises_even_system_exit_is_an_error_result(tmp_path):
    result = await run_tool(spec("exits"), {}, context(tmp_path), None)
    assert result.outcome == "error" and "sys.exit" in result.error
    missing = await run_tool(spec("no_such_function"), {}, context(tmp_path), None)
    assert missing.outcome == "error" and "AttributeError" in missing.error


async def test_an_output_json_cannot_hold_is_made_json_so_recording_it_cannot_fail(tmp_path):
    result = await run_tool(spec("odd_values"), {}, context(tmp_path), None)
    assert result.outcome == "output"
    assert result.output == {"when": "datetime.datetime(2026, 1, 2, 0, 0, tzinfo=datetime.timezone.utc)",
                             "tags": "{'a'}", "ratio": None}


async def test_a_timeout_the_tool_raises_itself_is_its_error_not_the_executors_deadline(tmp_path):
    result = await run_tool(spec("times_out_itself", "outward"), {}, context(tmp_path), None)
    assert (result.outcome, result.error) == ("error", "TimeoutError: the tool's own request timed out")


# A python tool runs in a process of its own (services/tool_executor/tool_process.py):
# it answers on its stdout with one JSON object, and whatever else happens to that
# process is an error result, never the executor's crash.

def isolated(function: str, env: list[str] | None = None, timeout: float | None = None) -> ToolSpec:
    implementation = PythonImplementation(function=f"tests.fixture_tools:{function}", env=env or [],
                                          **({"timeout_seconds": timeout} if timeout else {}))
    return ToolSpec(name="t", label="t", effect="read", implementation=implementation)


async def test_what_a_tool_prints_on_its_stdout_does_not_disturb_its_result(tmp_path):
    result = await run_tool(isolated("says_hello_then_answers"), {}, context(tmp_path), None)
    assert (result.outcome, result.output) == ("output", "answered")


async def test_a_tool_process_that_answers_garbage_is_an_error(tmp_path):
    result = await run_tool(isolated("answers_garbage"), {}, context(tmp_path), None)
    assert result.outcome == "error"
    assert result.error == "the tool's process answered something that is not JSON (10 bytes)"


async def test_a_tool_process_that_dies_is_an_error_saying_how_it_ended(tmp_path):
    result = await run_tool(isolated("dies"), {}, context(tmp_path), None)
    assert result.outcome == "error"
    assert result.error == "the tool's process exited with -9: about to die"


def gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status  # dead, not yet reaped by whoever adopted it


async def test_a_tool_past_its_timeout_is_killed_with_the_processes_it_started(tmp_path):
    # 5 s, so a loaded machine's fork and imports cannot use up the timeout before the child starts.
    result = await run_tool(isolated("hangs_with_a_child", timeout=5), {}, context(tmp_path), None)
    assert result.outcome == "error" and "did not finish within 5 s" in result.error
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    deadline = time.monotonic() + 5
    while not gone(grandchild) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert gone(grandchild), "what the tool started outlived its timeout"


async def test_a_tool_that_returns_leaving_a_process_behind_answers_at_once_and_the_process_ends(tmp_path):
    started = time.monotonic()
    result = await run_tool(isolated("leaves_a_child_behind", timeout=20), {}, context(tmp_path), None)
    assert (result.outcome, result.output) == ("output", "done")
    assert time.monotonic() - started < 10, "the call waited for what the tool left behind"
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    deadline = time.monotonic() + 5
    while not gone(grandchild) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert gone(grandchild), "what the tool left behind outlived its call"


def result_of_bytes(data: bytes):
    from services.tool_executor.tool_process import NoResult, result_of

    try:
        return result_of(data)
    except NoResult as garbage:
        return str(garbage)


def test_only_one_output_or_one_error_is_a_result():
    assert result_of_bytes(b'{"output": {"a": 1}}') == ({"a": 1}, None)
    assert result_of_bytes(b'{"output": null}') == (None, None)
    assert result_of_bytes(b'{"error": "ValueError: no"}') == (None, "ValueError: no")
    for garbage in (b"", b"not json", b"[1]", b'{"output": 1, "error": "x"}', b'{"error": 3}', b'{"outcome": "output"}',
                    b"[" * 100_000):
        assert isinstance(result_of_bytes(garbage), str), garbage


@pytest.mark.parametrize("own_user", [True, False], ids=["as the tools user when root", "as the executor's user"])
async def test_a_tool_process_has_its_declared_variables_and_nothing_of_the_executors(tmp_path, monkeypatch, own_user):
    if not own_user:
        async def no_tools_user():
            return None

        monkeypatch.setattr(tools, "tools_user", no_tools_user)
    monkeypatch.setenv("TOOL_OWN_SECRET", "own-value-123456")
    monkeypatch.setenv("ANOTHER_TOOLS_SECRET", "other-value-654321")
    monkeypatch.setenv("SIGNOFF_RABBITMQ_URL", "amqp://executor:password@localhost/")
    result = await run_tool(isolated("reads_its_secret", env=["TOOL_OWN_SECRET"]), {"name": "TOOL_OWN_SECRET"},
                            context(tmp_path), None)
    assert result.outcome == "output", result.error
    assert "TOOL_OWN_SECRET" in result.output["names"]
    assert set(result.output["names"]) <= {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME", "TOOL_OWN_SECRET"}
    # Its value reached the tool (and, read back, is hidden: a value from the environment is a secret).
    assert result.output["own"] in ("own-value-123456", "***redacted***")
    if own_user and os.geteuid() == 0:
        assert result.output["uid"] == (await tools_user())[0] != 0, "a root executor's tool ran as root"
    else:
        assert result.output["uid"] == os.geteuid()


async def test_a_declared_variable_the_executor_lacks_is_an_error_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("TOOL_OWN_SECRET", raising=False)
    result = await run_tool(isolated("sleep_then_count", env=["TOOL_OWN_SECRET"]), {"counter": "never"},
                            context(tmp_path), None)
    assert result.outcome == "error" and "${env:TOOL_OWN_SECRET} is not set" in result.error
    assert not (runs_folder(tmp_path) / "never.started").exists()


def test_a_python_tool_declares_only_variables_and_never_the_executors_settings():
    assert PythonImplementation(function="m:f", env=["API_TOKEN"]).env == ["API_TOKEN"]
    for name in ("SIGNOFF_RABBITMQ_URL", "signoff_keys_dir", "NOT-A-NAME", "A=B", ""):
        with pytest.raises(ValueError):
            PythonImplementation(function="m:f", env=[name])
