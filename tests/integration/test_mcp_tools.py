"""The executor's `mcp` tool kind: a catalogue tool that is a tool of an MCP server (a real
`mcp` server, tests/fixtures/mcp_files_server.py, over stdio), called once per run, on a
connection to the server the executor keeps open (`McpConnections`)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from services.tool_executor import tools
from services.tool_executor.tools import ToolContext, run_tool
from shared import mcp_upstream
from shared.catalogue import ToolCatalogue, ToolSpec
from tests.harness import eventually

FILES_SERVER = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "mcp_files_server.py"


def _spec(
    tool: str, effect: str = "outward", command: list[str] | None = None, timeout: float = 20, connect: float = 30
) -> ToolSpec:
    return ToolSpec.model_validate(
        {
            "name": tool,
            "label": tool,
            "parameters": {"type": "object", "additionalProperties": True},
            "effect": effect,
            "implementation": {
                "kind": "mcp",
                "tool": tool,
                "server": {
                    "command": command or [sys.executable, str(FILES_SERVER)],
                    "env": ["MCP_COUNT_DIR"],
                    "timeout_seconds": timeout,
                    "connect_timeout_seconds": connect,
                },
            },
        }
    )


async def _run(
    spec: ToolSpec, arguments: dict[str, object], tmp_path: Path, mcp: tools.McpConnections | None = None
) -> tools.ToolResult:
    async with httpx.AsyncClient() as http:
        return await run_tool(spec, arguments, ToolContext("call_1", "ses_1", "idk_1", 1, tmp_path), http, mcp=mcp)


async def test_an_mcp_tool_runs_once_and_its_result_is_the_servers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MCP_COUNT_DIR", str(tmp_path))
    result = await _run(_spec("delete_file"), {"path": "a.txt"}, tmp_path)
    assert result.outcome == "output", result.error
    assert result.output["content"][0]["text"] == "deleted a.txt (run 1)"
    assert (tmp_path / "delete_file.count").read_text() == "1"
    assert _spec("delete_file").target_of({}) == "MCP tool delete_file on stdio " + Path(sys.executable).name


async def test_an_outward_mcp_tool_whose_server_dies_mid_call_is_outcome_unknown_never_run_again(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("MCP_COUNT_DIR", str(tmp_path))
    result = await _run(_spec("crash"), {}, tmp_path)
    assert result.outcome == "outcome_unknown", result
    assert (tmp_path / "crash.count").read_text() == "1"


async def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _count(folder: Path, name: str) -> int:
    path = folder / f"{name}.count"
    return int(path.read_text()) if path.exists() else 0


async def test_approved_calls_to_one_mcp_server_are_served_by_one_process_started_once(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("MCP_COUNT_DIR", str(tmp_path))
    connections = tools.McpConnections()
    try:
        for index in range(3):
            result = await _run(_spec("delete_file"), {"path": f"{index}.txt"}, tmp_path, connections)
            assert result.outcome == "output", result.error
        # Side by side on the one session: MCP lets a client have several requests in flight.
        together = await asyncio.gather(
            *(_run(_spec("delete_file"), {"path": f"t{index}.txt"}, tmp_path, connections) for index in range(4))
        )
        assert [result.outcome for result in together] == ["output"] * 4, together
    finally:
        await connections.close()
    assert _count(tmp_path, "delete_file") == 7
    assert _count(tmp_path, "started") == 1


async def test_a_killed_mcp_server_is_started_again_for_the_next_call(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MCP_COUNT_DIR", str(tmp_path))
    connections = tools.McpConnections()
    spec = _spec("delete_file", timeout=5, connect=5)
    try:
        assert (await _run(spec, {"path": "a.txt"}, tmp_path, connections)).outcome == "output"
        pid = int((tmp_path / "server.pid").read_text())
        upstream = connections.upstream(mcp_upstream, spec.implementation.server)
        assert upstream.connected
        os.kill(pid, signal.SIGKILL)

        # Once the executor has seen it go (its connection closed while idle), the next call
        # starts a new one. A call sent in the instant before that may have reached the
        # dying server, and is told so (outcome unknown: the next test).
        async def seen_gone() -> bool:
            return await _gone(pid) and not upstream.connected

        await eventually(seen_gone, timeout=10)
        result = await _run(spec, {"path": "b.txt"}, tmp_path, connections)
        assert result.outcome == "output", result.error
        assert result.output["content"][0]["text"] == "deleted b.txt (run 2)"
    finally:
        await connections.close()
    assert _count(tmp_path, "started") == 2


async def test_a_server_that_dies_mid_call_on_a_kept_connection_is_replaced_and_the_call_never_resent(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("MCP_COUNT_DIR", str(tmp_path))
    connections = tools.McpConnections()
    try:
        assert (await _run(_spec("delete_file"), {"path": "a.txt"}, tmp_path, connections)).outcome == "output"
        crashed = await _run(_spec("crash"), {}, tmp_path, connections)
        assert crashed.outcome == "outcome_unknown", crashed
        # A read that broke the same way is an error, for the existing retry rules to judge.
        read = await _run(_spec("garbage", effect="read"), {}, tmp_path, connections)
        assert read.outcome == "error", read
        assert (await _run(_spec("delete_file"), {"path": "b.txt"}, tmp_path, connections)).outcome == "output"
    finally:
        await connections.close()
    assert _count(tmp_path, "crash") == 1
    assert _count(tmp_path, "started") == 3


async def test_a_hanging_server_times_out_its_call_gets_a_new_connection_and_blocks_no_other(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("MCP_COUNT_DIR", str(tmp_path))
    connections = tools.McpConnections()
    other = [sys.executable, str(FILES_SERVER), "--started-as", "other"]
    # One declaration, one server: every call below but `other`'s goes to the same one.
    try:
        hanging = asyncio.create_task(_run(_spec("hang", timeout=6), {"seconds": 600}, tmp_path, connections))
        await asyncio.sleep(1)  # the hang is sent first
        started = time.monotonic()
        # Meanwhile a call on the same connection, and one to another server, are answered.
        same, elsewhere = await asyncio.gather(
            _run(_spec("read_file", effect="read", timeout=6), {"path": "x"}, tmp_path, connections),
            _run(_spec("delete_file", command=other), {"path": "y"}, tmp_path, connections),
        )
        assert same.outcome == elsewhere.outcome == "output", (same, elsewhere)
        assert not hanging.done() and time.monotonic() - started < 6
        hung = await hanging
        assert hung.outcome == "outcome_unknown" and "did not answer within 6s" in (hung.error or ""), hung
        # The server that did not answer is not trusted with the next call: a new one is started.
        after = await _run(_spec("delete_file", timeout=6), {"path": "z"}, tmp_path, connections)
        assert after.outcome == "output", after.error
    finally:
        await connections.close()
    assert _count(tmp_path, "started") == 2
    assert _count(tmp_path, "started-other") == 1


async def test_a_flood_of_ten_megabytes_is_a_typed_failure_and_the_connection_serves_on(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("MCP_COUNT_DIR", str(tmp_path))
    connections = tools.McpConnections()
    try:
        flood = await _run(_spec("flood", effect="read", timeout=60), {"megabytes": 10}, tmp_path, connections)
        assert flood.outcome == "error" and "(too_large)" in (flood.error or ""), flood.error
        # The same server: a declaration of its own (another timeout) would be a server of its own.
        after = await _run(_spec("delete_file", timeout=60), {"path": "a"}, tmp_path, connections)
        assert after.outcome == "output", after.error
    finally:
        await connections.close()
    assert _count(tmp_path, "started") == 1


async def test_a_reload_that_drops_a_server_lets_its_process_go_once_the_call_still_on_it_has_finished(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("MCP_COUNT_DIR", str(tmp_path))
    connections = tools.McpConnections()
    try:
        assert (await _run(_spec("delete_file"), {"path": "a"}, tmp_path, connections)).outcome == "output"
        pid = int((tmp_path / "server.pid").read_text())
        running = asyncio.create_task(_run(_spec("hang"), {"seconds": 2}, tmp_path, connections))
        await asyncio.sleep(0.5)  # sent
        connections.keep_only(ToolCatalogue(tools=[]))
        finished = await running
        assert finished.outcome == "output" and finished.output["content"][0]["text"] == "woke", finished
        await eventually(lambda: _gone(pid), timeout=10)
        # A tool of that server called again (a catalogue that names it again) starts it anew.
        assert (await _run(_spec("delete_file"), {"path": "b"}, tmp_path, connections)).outcome == "output"
    finally:
        await connections.close()
    assert _count(tmp_path, "started") == 2


async def test_a_server_that_cannot_be_started_is_an_error_nothing_ran(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MCP_COUNT_DIR", str(tmp_path))
    result = await _run(_spec("delete_file", command=["/nonexistent/mcp-server"]), {}, tmp_path)
    assert result.outcome == "error" and "could not reach" in (result.error or "")


async def test_an_executor_without_the_mcp_extra_refuses_the_call_saying_so(tmp_path: Path, monkeypatch) -> None:
    # As an install without `signoff[mcp]`: importing the SDK's module fails.
    monkeypatch.setitem(sys.modules, "shared.mcp_upstream", None)
    result = await _run(_spec("delete_file"), {"path": "a.txt"}, tmp_path)
    assert result.outcome == "error" and result.error == tools.MCP_MISSING
    assert not (tmp_path / "delete_file.count").exists()


def test_a_credential_written_into_an_mcp_servers_declaration_is_refused() -> None:
    with pytest.raises(ValueError, match="never a value"):
        ToolSpec.model_validate(
            {
                "name": "x",
                "label": "x",
                "implementation": {
                    "kind": "mcp",
                    "tool": "x",
                    "server": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer abc"}},
                },
            }
        )
    with pytest.raises(ValueError, match="never a value"):
        ToolSpec.model_validate(
            {
                "name": "x",
                "label": "x",
                "implementation": {"kind": "mcp", "tool": "x", "server": {"command": ["s"], "env": {"TOKEN": "abc"}}},
            }
        )
