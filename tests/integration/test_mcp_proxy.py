"""`signoff mcp-proxy` between the `mcp` SDK's own client and a real `mcp` server
(tests/fixtures/mcp_files_server.py), over stdio and over Streamable HTTP on loopback:
what passes, what is refused, and how a broken server ends a call."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import mcp_types
import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.harness import free_port

ROOT = Path(__file__).resolve().parents[2]
FILES_SERVER = ROOT / "tests" / "fixtures" / "mcp_files_server.py"
TOKEN = "files-token-4f1d9a77c2"
POLICY = {
    "read_file": "allow",
    "whoami": "allow",
    "hang": "allow",
    "flood": "allow",
    "crash": "allow",
    "garbage": "allow",
    "add_tool": "allow",
    "delete_file": "ask",
    "wipe_disk": "deny",
}


def _count(folder: Path, tool: str) -> int:
    path = folder / f"{tool}.count"
    return int(path.read_text()) if path.exists() else 0


def _wait_for_port(port: int, process: subprocess.Popen[bytes], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(
                f"exited with {process.returncode}: {process.stderr.read().decode() if process.stderr else ''}"
            )
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=0.5)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


@contextlib.contextmanager
def _running(command: list[str], env: dict[str, str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_port(port, process)
        yield process
    finally:
        process.kill()
        process.wait()


class Setup:
    def __init__(self, tmp_path: Path, transport: str) -> None:
        self.transport = transport
        self.counts = tmp_path / "counts"
        self.counts.mkdir()
        self.config = tmp_path / "proxy.yaml"
        self.env = {**os.environ, "MCP_COUNT_DIR": str(self.counts), "FILES_TOKEN": TOKEN}
        self.stack = contextlib.ExitStack()

    def write(self, upstream: dict[str, object], timeout: float = 3.0) -> None:
        self.config.write_text(
            yaml.safe_dump(
                {"upstreams": {"files": {**upstream, "tools": POLICY, "timeout_seconds": timeout}}},
                sort_keys=False,
            )
        )

    @contextlib.asynccontextmanager
    async def client(self, timeout: float = 3.0) -> AsyncIterator[Client]:
        proxy = [sys.executable, "-m", "services.operations.cli", "mcp-proxy", "--config", str(self.config)]
        if self.transport == "stdio":
            self.write(
                {"command": [sys.executable, str(FILES_SERVER)], "env": ["MCP_COUNT_DIR", "FILES_TOKEN"]}, timeout
            )
            parameters = StdioServerParameters(command=proxy[0], args=proxy[1:], env=self.env, cwd=str(ROOT))
            async with Client(parameters, read_timeout_seconds=30) as client:
                yield client
            return
        upstream_port, proxy_port = free_port(), free_port()
        self.stack.enter_context(
            _running([sys.executable, str(FILES_SERVER), "--http", str(upstream_port)], self.env, upstream_port)
        )
        self.write({"url": f"http://127.0.0.1:{upstream_port}/mcp"}, timeout)
        self.proxy = self.stack.enter_context(
            _running([*proxy, "--http", f"127.0.0.1:{proxy_port}"], self.env, proxy_port)
        )
        self.url = f"http://127.0.0.1:{proxy_port}/mcp"
        async with Client(self.url, read_timeout_seconds=30) as client:
            yield client


@pytest.fixture(params=["stdio", "http"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    setup = Setup(tmp_path, request.param)
    with setup.stack:
        yield setup


def _text(result: mcp_types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, mcp_types.TextContent))


def _kind(result: mcp_types.CallToolResult) -> str:
    return (result.meta or {})["signoff/outcome"]["kind"]


# One proxy per test (each start costs seconds): a test walks through what a session would.


async def test_allowed_calls_pass_denied_tools_do_not_exist_and_ask_calls_wait(setup: Setup) -> None:
    async with setup.client() as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        # The listing leaves out the denied tool and marks the ones that ask.
        assert "wipe_disk" not in tools
        assert {"read_file", "delete_file", "whoami"} <= set(tools)
        assert "a person approves each call" in (tools["delete_file"].description or "")
        assert "a person approves" not in (tools["read_file"].description or "")
        # The server's claims are shown as it made them, never rewritten.
        annotations = tools["delete_file"].annotations
        assert annotations is not None and annotations.destructive_hint

        # An allowed read passes through, once.
        result = await client.call_tool("read_file", {"path": "notes.txt"})
        assert not result.is_error and _text(result) == "contents of notes.txt"

        # A denied tool cannot be called, though its annotations claim it is read-only.
        with pytest.raises(MCPError) as refused:
            await client.call_tool("wipe_disk", {"confirm": True})
        assert refused.value.code == mcp_types.INVALID_PARAMS

        # With no gateway configured, an ask call is refused and never runs.
        result = await client.call_tool("delete_file", {"path": "notes.txt"})
        assert result.is_error and _kind(result) == "not_configured"

        # A tool the server adds after start asks: nobody gave their word for it.
        assert not (await client.call_tool("add_tool", {})).is_error
        tools = {tool.name: tool for tool in (await client.list_tools(cache_mode="refresh")).tools}
        assert "a person approves each call" in (tools["added_later"].description or "")
        result = await client.call_tool("added_later", {})
        assert result.is_error and _kind(result) == "not_configured"

        # Bad input is a JSON-RPC error: nothing filed, nothing sent, the value never echoed.
        for name, arguments in (
            ("no_such_tool", {}),
            ("read_file", {}),
            ("read_file", {"path": 7}),
            ("delete_file", {"path": "x" * 10_000_000}),
        ):
            with pytest.raises(MCPError) as refused:
                await client.call_tool(name, arguments)
            assert refused.value.code in (mcp_types.INVALID_PARAMS, mcp_types.INVALID_REQUEST), name
            assert "x" * 100 not in refused.value.message

        # The credential reaches a stdio server from the proxy's environment, not the file.
        if setup.transport == "stdio":
            assert _text(await client.call_tool("whoami", {})) == TOKEN
        assert not (await client.call_tool("read_file", {"path": "again"})).is_error
    assert TOKEN not in setup.config.read_text()
    assert _count(setup.counts, "read_file") == 2
    assert _count(setup.counts, "wipe_disk") == _count(setup.counts, "delete_file") == 0
    assert _count(setup.counts, "later") == 0


async def test_a_broken_server_ends_each_call_with_its_kind_and_the_proxy_goes_on(setup: Setup) -> None:
    # Long enough for 10 MB to cross a pipe on a busy machine; the hang is bounded by it.
    async with setup.client(timeout=12) as client:
        started = time.monotonic()
        result = await client.call_tool("hang", {"seconds": 60})
        assert result.is_error and _kind(result) == "no_answer", _text(result)
        assert time.monotonic() - started < 30

        result = await client.call_tool("flood", {"megabytes": 10})
        assert result.is_error and _kind(result) == "too_large", _text(result)[:200]
        assert len(_text(result)) < 1000
        assert not (await client.call_tool("read_file", {"path": "a"})).is_error

        if setup.transport == "stdio":
            # The server exits mid-call: said so, never retried; the next call starts it again.
            result = await client.call_tool("crash", {})
            assert result.is_error and _kind(result) in ("broke", "no_answer"), _text(result)
            assert "may or may not have run" in _text(result)
            assert not (await client.call_tool("read_file", {"path": "b"})).is_error
            # Garbage on the protocol's stream ends the call, not the proxy.
            result = await client.call_tool("garbage", {})
            assert result.is_error and _kind(result) in ("no_answer", "bad_answer", "broke"), _text(result)
            assert not (await client.call_tool("read_file", {"path": "c"})).is_error
    assert _count(setup.counts, "crash") == (1 if setup.transport == "stdio" else 0)


def test_malformed_json_rpc_over_http_is_a_json_rpc_error(tmp_path: Path) -> None:
    setup = Setup(tmp_path, "http")
    with setup.stack:
        import asyncio

        async def start() -> None:
            async with setup.client():
                pass

        asyncio.run(start())
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        answer = httpx.post(setup.url, content=b'{"jsonrpc": "2.0", "id": 1, "method": ', headers=headers)
        body = answer.json()
        assert body["error"]["code"] == mcp_types.PARSE_ERROR
        assert setup.proxy.poll() is None


def test_malformed_json_rpc_over_stdio_is_a_json_rpc_error(tmp_path: Path) -> None:
    setup = Setup(tmp_path, "stdio")
    setup.write({"command": [sys.executable, str(FILES_SERVER)], "env": ["MCP_COUNT_DIR", "FILES_TOKEN"]})
    proxy = subprocess.Popen(
        [sys.executable, "-m", "services.operations.cli", "mcp-proxy", "--config", str(setup.config)],
        cwd=ROOT,
        env=setup.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proxy.stdin is not None and proxy.stdout is not None
        proxy.stdin.write(b'{"jsonrpc": "2.0", "id": 1, "method": \n')
        proxy.stdin.flush()
        answer = json.loads(proxy.stdout.readline())
        assert answer["error"]["code"] == mcp_types.PARSE_ERROR
        assert proxy.poll() is None
    finally:
        proxy.kill()
        proxy.wait()
