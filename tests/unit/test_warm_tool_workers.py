"""Warm workers (services/tool_executor/tools.py `WarmWorkers`, tool_process.py
`serve_calls`): a python tool marked `reuse_process` in the catalogue has its calls served
by a warm process of its own, forked from the fork server and kept; every other tool still
gets a fresh fork per call. A worker serves one tool only, and one whose call timed out,
died or answered garbage is killed, never reused."""

import asyncio
import os

import pytest

from services.tool_executor import tools
from services.tool_executor.tools import ToolContext, run_tool
from shared.catalogue import PythonImplementation, ToolSpec


@pytest.fixture(autouse=True)
def fork_server(monkeypatch):
    monkeypatch.setenv("SIGNOFF_TOOL_FORK_SERVER", "true")


@pytest.fixture(autouse=True)
async def no_workers_left():
    yield
    tools._warm_workers.stop()


def tool(function: str, *, reuse: bool = True, env: list[str] | None = None, timeout: float = 60.0) -> ToolSpec:
    implementation = PythonImplementation(
        function=f"tests.fixture_tools:{function}", env=env or [], reuse_process=reuse, timeout_seconds=timeout
    )
    return ToolSpec(name=function, label=function, effect="read", implementation=implementation)


def context(tmp_path, call_id: str = "call_1") -> ToolContext:
    return ToolContext(call_id, "ses_1", "idk_1", 1, tmp_path)


async def test_a_reusable_tools_calls_share_one_warm_process(tmp_path):
    forks = tools._warm_workers.forks
    first = await run_tool(tool("plants_state"), {}, context(tmp_path, "call_1"), None)
    second = await run_tool(tool("plants_state"), {}, context(tmp_path, "call_2"), None)
    assert first.outcome == second.outcome == "output", (first.error, second.error)
    assert second.output["pid"] == first.output["pid"], "the second call did not reuse the first's process"
    assert second.output["module global"] == "call_1"
    assert tools._warm_workers.forks == forks + 1


async def test_a_tool_not_marked_reusable_still_gets_a_fresh_process_per_call(tmp_path):
    first = await run_tool(tool("plants_state", reuse=False), {}, context(tmp_path, "call_1"), None)
    second = await run_tool(tool("plants_state", reuse=False), {}, context(tmp_path, "call_2"), None)
    assert second.output["pid"] != first.output["pid"]
    assert second.output["module global"] is None


async def test_a_warm_process_serves_one_tool_and_never_another(tmp_path):
    planted = await run_tool(tool("plants_state"), {}, context(tmp_path, "call_1"), None)
    other = await run_tool(tool("reads_its_secret"), {"name": "PLANTED_BY"}, context(tmp_path, "call_2"), None)
    assert other.outcome == "output", other.error
    assert other.output["own"] is None, "another tool's call ran in the process the first tool changed"
    assert planted.outcome == "output"


async def test_a_warm_process_that_dies_mid_call_is_an_error_and_the_next_call_gets_a_new_one(tmp_path):
    await run_tool(tool("plants_state"), {}, context(tmp_path), None)
    died = await run_tool(tool("dies"), {}, context(tmp_path, "call_2"), None)
    assert died.outcome == "error"
    assert "about to die" in (died.error or ""), died.error
    again = await run_tool(tool("dies"), {}, context(tmp_path, "call_3"), None)
    assert again.outcome == "error", "a dead worker was handed a call"


async def test_a_warm_process_past_its_timeout_is_killed_with_its_group_and_not_reused(tmp_path):
    # Warmed first, so the call that hangs spends its seconds in the tool, not in a fork and
    # imports that a loaded machine can stretch past the timeout before the child is started.
    slow = tool("hangs_with_a_child", timeout=8.0)
    warmed = await run_tool(slow, {"only_warm_up": True}, context(tmp_path, "call_0"), None)
    assert warmed.outcome == "output", warmed.error
    late = await run_tool(slow, {}, context(tmp_path), None)
    assert (late.outcome, late.error) == ("error", "the tool did not finish within 8 s")
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("what the timed-out call started outlived it")
    assert all(not workers for workers in tools._warm_workers.idle.values()), "a timed-out worker was kept"


async def test_a_warm_process_passes_on_what_a_tool_prints_and_still_answers(tmp_path):
    for call_id in ("call_1", "call_2"):
        said = await run_tool(tool("says_hello_then_answers"), {}, context(tmp_path, call_id), None)
        assert (said.outcome, said.output) == ("output", "answered"), said.error


async def test_a_warm_process_that_answers_garbage_is_an_error_and_is_not_reused(tmp_path):
    garbage = await run_tool(tool("answers_garbage"), {}, context(tmp_path), None)
    assert garbage.outcome == "error"
    assert all(not workers for workers in tools._warm_workers.idle.values())
