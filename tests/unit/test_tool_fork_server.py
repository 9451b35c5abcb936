"""The python tools' fork server (services/tool_executor/tool_process.py `serve`,
tools.py `ForkServer`, docs/design.md "A process per python call costs time"): one
long-lived process of the tools' user, holding no secret and no tool's code, forks one
child per call. Each call still runs in a process of its own that cannot see another
call's state nor anything of the executor's, and the executor outlives the fork server."""

import os
import time
import secrets
from pathlib import Path

import pytest

from services.tool_executor import tools
from services.tool_executor.tools import ToolContext, run_tool
from shared.catalogue import PythonImplementation, ToolSpec


@pytest.fixture(autouse=True)
def fork_server(monkeypatch):
    monkeypatch.setenv("SIGNOFF_TOOL_FORK_SERVER", "true")


def isolated(function: str, env: list[str] | None = None) -> ToolSpec:
    implementation = PythonImplementation(function=f"tests.fixture_tools:{function}", env=env or [])
    return ToolSpec(name="t", label="t", effect="read", implementation=implementation)


def context(tmp_path: Path, call_id: str = "call_1") -> ToolContext:
    return ToolContext(call_id, "ses_1", "idk_1", 1, tmp_path)


def starts() -> int:
    return sum(server.starts for server in tools._fork_servers.values())


async def test_what_a_tool_leaves_in_its_process_is_not_there_for_the_next_call(tmp_path):
    started = starts()
    first = await run_tool(isolated("plants_state"), {}, context(tmp_path, "call_1"), None)
    second = await run_tool(isolated("plants_state"), {}, context(tmp_path, "call_2"), None)
    assert first.outcome == second.outcome == "output", (first.error, second.error)
    assert second.output["pid"] != first.output["pid"]
    clean = {"json attribute": None, "sys.modules": False, "environment": None, "module global": None}
    assert {name: second.output[name] for name in clean} == clean, "the second call saw what the first left"
    assert starts() - started <= 1, "the calls were not forked from one fork server"


async def test_a_tool_that_kills_its_fork_server_dies_with_it_and_the_next_call_gets_a_new_one(tmp_path):
    await run_tool(isolated("plants_state"), {}, context(tmp_path), None)
    started = starts()
    killed = await run_tool(isolated("kills_its_parent"), {}, context(tmp_path), None)
    assert killed.outcome == "error", killed.output
    assert killed.error == "the tool's process answered something that is not JSON (0 bytes)"
    after = await run_tool(isolated("plants_state"), {}, context(tmp_path, "call_2"), None)
    assert after.outcome == "output", after.error
    assert starts() == started + 1, "no new fork server"


async def test_a_tool_finds_no_secret_in_its_fork_servers_environment_or_memory_nor_any_of_its_descriptors(
    tmp_path, monkeypatch
):
    executors = f"amqp://executor:{secrets.token_hex(12)}@localhost/"
    own = f"own-{secrets.token_hex(12)}"
    monkeypatch.setenv("SIGNOFF_RABBITMQ_URL", executors)
    monkeypatch.setenv("TOOL_OWN_SECRET", own)
    # An earlier call held its declared secret: its process is gone, and the fork server never saw it.
    held = await run_tool(
        isolated("reads_its_secret", env=["TOOL_OWN_SECRET"]), {"name": "TOOL_OWN_SECRET"}, context(tmp_path), None
    )
    assert held.outcome == "output", held.error
    # The needles travel reversed: the call's arguments reach the tool's own memory, not its fork server's.
    result = await run_tool(
        isolated("looks_for_secrets"), {"needles": [executors[::-1], own[::-1]]}, context(tmp_path, "call_2"), None
    )
    assert result.outcome == "output", result.error
    assert result.output["found in"] == [], result.output
    assert result.output["sockets"] == [], "the tool holds a socket of its fork server's"
    if os.geteuid() == 0:
        # The fork server is not dumpable: another process of its user cannot read it.
        assert {"parent's environ: PermissionError", "parent's memory: PermissionError"} <= set(
            result.output["unreadable"]
        ), result.output


async def test_a_tool_that_stops_its_fork_server_delays_the_next_call_by_a_few_seconds_and_it_runs(tmp_path):
    stopped = await run_tool(isolated("stops_its_parent"), {}, context(tmp_path), None)
    assert (stopped.outcome, stopped.output) == ("output", "stopped its parent")
    started = time.monotonic()
    after = await run_tool(isolated("plants_state"), {}, context(tmp_path, "call_2"), None)
    assert after.outcome == "output", after.error
    assert time.monotonic() - started < tools.FORK_ANSWER_SECONDS + 5
