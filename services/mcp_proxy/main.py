"""`signoff mcp-proxy --config proxy.yaml [--http HOST:PORT]`: serve the proxy over stdio
(what a desktop host launches) or Streamable HTTP. Its log goes to stderr: on stdio,
standard output is the protocol's."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from .config import ProxyConfig, load_config

if TYPE_CHECKING:
    from .server import Gate

log = logging.getLogger("signoff.mcp_proxy")

# Streamable HTTP: a body up to this size reaches the proxy, which answers arguments over
# its limit with a JSON-RPC error; a larger one is refused by the transport itself (HTTP 413).
MAX_BODY_BYTES = 32_000_000


def keys_dir_of(config: ProxyConfig) -> Path | None:
    """The keys folder for `${key:NAME}`: the file's `keys_dir`, else SIGNOFF_KEYS_DIR,
    else `<SIGNOFF_DATA_DIR>/keys` when that is set."""
    if config.keys_dir is not None:
        return config.keys_dir
    if os.environ.get("SIGNOFF_KEYS_DIR"):
        return Path(os.environ["SIGNOFF_KEYS_DIR"])
    if os.environ.get("SIGNOFF_DATA_DIR"):
        return Path(os.environ["SIGNOFF_DATA_DIR"]) / "keys"
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="signoff mcp-proxy",
        description="An MCP server in front of other MCP servers: allowed tools pass, `ask` tools wait for a "
        "person's sign-off through Signoff, denied tools are neither listed nor callable.",
    )
    parser.add_argument("--config", type=Path, required=True, help="the proxy's configuration (docs/mcp-proxy.md)")
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve Streamable HTTP at http://HOST:PORT/mcp instead of stdio (keep HOST on loopback)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s mcp-proxy %(message)s")
    # Not a line per request to the gateway while a call is held.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        import mcp  # noqa: F401
    except ImportError:
        print("signoff mcp-proxy needs the MCP SDK: pip install 'signoff[mcp]'", file=sys.stderr)
        return 2
    config = load_config(args.config)
    address = None
    if args.http:
        host, _, port = args.http.rpartition(":")
        if not host or not port.isdigit():
            parser.error("--http takes HOST:PORT, e.g. 127.0.0.1:8765")
        address = (host.strip("[]"), int(port))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, address))
    return 0


async def answer_malformed(read: Any, checked: Any, write: Any) -> None:
    """Pass each message on; answer a line that was not JSON-RPC with a parse error (id null)."""
    import mcp_types
    from mcp.shared.message import SessionMessage

    async with checked:
        async for item in read:
            if isinstance(item, Exception):
                error = mcp_types.ErrorData(code=mcp_types.PARSE_ERROR, message="Parse error: not a JSON-RPC message")
                await write.send(SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=None, error=error)))
                continue
            await checked.send(item)


async def serve(config: ProxyConfig, address: tuple[str, int] | None) -> None:
    from .server import Proxy

    proxy = Proxy(config, keys_dir_of(config), gate_for(config, keys_dir_of(config)))
    server = proxy.server()
    upstreams = asyncio.create_task(proxy.serve_upstreams())
    try:
        if address is None:
            from mcp.server.stdio import stdio_server

            async with stdio_server() as (read, write), anyio.create_task_group() as group:
                # The SDK drops a line that is not JSON-RPC without a word: the client is told.
                checked_send, checked = anyio.create_memory_object_stream[Any](0)
                group.start_soon(answer_malformed, read, checked_send, write)
                await server.run(checked, write, server.create_initialization_options())
                group.cancel_scope.cancel()
        else:
            import uvicorn

            host, port = address
            app = server.streamable_http_app(
                host=host, max_request_body_size=max(MAX_BODY_BYTES, 2 * config.limits.max_argument_bytes)
            )
            log.info("serving MCP at http://%s:%d/mcp", host, port)
            await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()
    finally:
        upstreams.cancel()
        await asyncio.gather(upstreams, return_exceptions=True)


def gate_for(config: ProxyConfig, keys_dir: Path | None) -> Gate:
    """The gate `ask` calls go through: Signoff's intake when `signoff:` is configured,
    else one that refuses them, saying why. Imported here, above both, so the server
    never imports the gate that imports it."""
    from .server import NoGate

    if config.signoff is None:
        return NoGate()
    from .intake_gate import intake_gate

    return intake_gate(config.signoff, keys_dir)
