"""Python tools run off the executor's event loop, within their declared timeout
(services/tool_executor/tools.py): a slow tool never stops the claim's heartbeat,
and a call that runs too long ends honestly (invariant 4)."""

import asyncio
import time
from pathlib import Path

import pytest

from services.tool_executor.tools import ToolContext, run_tool
from shared.catalogue import PythonImplementation, ToolSpec
from tests.fixture_tools import runs_folder


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
    result = await run_tool(spec(function, effect, timeout=0.2), {"seconds": 2, "counter": "t"}, context(tmp_path),
                            None)
    assert time.monotonic() - started < 1.5, "the call ended at its timeout, not when the tool did"
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
