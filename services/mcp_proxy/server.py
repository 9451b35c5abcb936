"""The proxy's MCP server: `tools/list` shows what the policy lets through, `tools/call`
passes an allowed call straight to its server, holds an `ask` call for a person's
sign-off (`Gate`), and refuses everything else before anything is filed or sent.

Bad input from the client is a JSON-RPC error (nothing filed, nothing sent upstream);
a failing server is a tool error of a stated kind (`_meta["signoff/outcome"]`), and the
proxy goes on serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jsonschema
import mcp_types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from shared.catalogue import _rule_broken
from shared.mcp_upstream import Upstream, UpstreamFailure
from shared.redaction import redact_text

from .config import Policy, ProxyConfig, UpstreamConfig

log = logging.getLogger(__name__)

# Where a tool error says what kind of ending it is, for a program to read.
OUTCOME_META = "signoff/outcome"
# How many schema errors a refusal lists.
ERRORS_SHOWN = 5
ASK_NOTE = "[Signoff: a person approves each call of this tool before it runs; a call may wait for them.]"


@dataclass(frozen=True)
class Offered:
    """A tool as the proxy offers it: whose it is, its server's own description of it, and
    the operator's policy (annotations are the server's claims: shown, never obeyed)."""

    name: str
    upstream: str
    tool: mcp_types.Tool
    policy: Policy
    # The longest one call of it can take: connecting to its server, then its `timeout_seconds`.
    run_seconds: float = 90.0


def tool_error(kind: str, text: str, **facts: Any) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=text)],
        is_error=True,
        _meta={OUTCOME_META: {"kind": kind, **facts}},
    )


# Calls the tool's server once with the given (approved) arguments.
Runner = Callable[[dict[str, Any]], Awaitable[mcp_types.CallToolResult]]
# What a `tools/call` answers: its result, or (MCP 2026-07-28) input the client is asked
# for before it calls again.
Answer = mcp_types.CallToolResult | mcp_types.InputRequiredResult


class Gate(Protocol):
    """Where an `ask` call goes for a person's decision, and from where it runs once
    (`run`: for a tool the proxy itself must run once it is approved)."""

    async def hold(
        self, ctx: ServerRequestContext[Any], offered: Offered, arguments: dict[str, Any], run: Runner
    ) -> Answer: ...


class NoGate:
    """No Signoff gateway configured: an `ask` call is refused, saying why."""

    async def hold(
        self, ctx: ServerRequestContext[Any], offered: Offered, arguments: dict[str, Any], run: Runner
    ) -> mcp_types.CallToolResult:
        return tool_error(
            "not_configured",
            f"{offered.name} needs a person's sign-off, and this proxy has no Signoff gateway configured "
            "(`signoff:` in its configuration file): it was not run.",
        )


def argument_errors(schema: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """What is wrong with the arguments by the tool's own schema: each error names the
    path and the rule broken, never the value (it may be a secret)."""
    try:
        validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError:
        return ["the server's schema for this tool is not valid JSON Schema: no call can be checked against it"]
    errors = sorted(validator_class(schema).iter_errors(arguments), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(arguments)'}: {_rule_broken(e)}" for e in errors]


class Proxy:
    def __init__(self, config: ProxyConfig, keys_dir: Path | None, gate: Gate | None = None) -> None:
        self.config = config
        self.gate: Gate = gate or NoGate()
        self.upstreams = {
            name: Upstream(name, upstream, keys_dir, max_result_bytes=config.limits.max_result_bytes)
            for name, upstream in config.upstreams.items()
        }
        self._offered: dict[str, Offered] = {}

    def _config(self, upstream: str) -> UpstreamConfig:
        return self.config.upstreams[upstream]

    async def _listing(self, upstream: str) -> list[Offered]:
        """An upstream's tools with their policy, `deny` left out; an upstream that does
        not answer offers nothing for now (the others still do)."""
        config = self._config(upstream)
        try:
            tools = await self.upstreams[upstream].list_tools()
        except UpstreamFailure as failure:
            log.warning("mcp-proxy: %s offers no tools for now: %s (%s)", upstream, failure, failure.kind)
            return []
        return [
            Offered(
                f"{config.prefix}{tool.name}",
                upstream,
                tool,
                config.policy(tool.name),
                config.connect_timeout_seconds + config.timeout_seconds,
            )
            for tool in tools
            if config.policy(tool.name) != "deny"
        ]

    async def refresh(self) -> list[Offered]:
        listings = await asyncio.gather(*(self._listing(name) for name in self.upstreams))
        offered = [tool for listing in listings for tool in listing]
        self._offered = {tool.name: tool for tool in offered}
        return offered

    async def on_list_tools(
        self, ctx: ServerRequestContext[Any], params: mcp_types.PaginatedRequestParams | None
    ) -> mcp_types.ListToolsResult:
        tools = []
        for offered in await self.refresh():
            tool = offered.tool.model_copy(update={"name": offered.name})
            if offered.policy == "ask":
                tool = tool.model_copy(update={"description": f"{tool.description or ''}\n\n{ASK_NOTE}".strip()})
            tools.append(tool)
        # ttl 0: a client asks again rather than keep a list the policy or the server changed.
        return mcp_types.ListToolsResult(tools=tools, ttl_ms=0, cache_scope="private")

    async def _find(self, name: str) -> Offered | None:
        if name not in self._offered:
            # A tool the server added since the last listing: list again, once.
            await self.refresh()
        return self._offered.get(name)

    async def on_call_tool(self, ctx: ServerRequestContext[Any], params: mcp_types.CallToolRequestParams) -> Answer:
        arguments = params.arguments or {}
        size = len(json.dumps(arguments, separators=(",", ":"), ensure_ascii=False).encode())
        limit = self.config.limits.max_argument_bytes
        if size > limit:
            raise MCPError(mcp_types.INVALID_PARAMS, f"the arguments are {size:,} bytes, more than {limit:,}")
        offered = await self._find(params.name)
        if offered is None:
            # A denied tool is said as one that does not exist: it is not offered.
            raise MCPError(mcp_types.INVALID_PARAMS, f"no tool named {redact_text(params.name)[:128]!r} is offered")
        errors = argument_errors(offered.tool.input_schema, arguments)
        if errors:
            shown = "; ".join(errors[:ERRORS_SHOWN]) + (
                f" (and {len(errors) - ERRORS_SHOWN} more)" if len(errors) > ERRORS_SHOWN else ""
            )
            raise MCPError(mcp_types.INVALID_PARAMS, f"arguments of {offered.name} refused: {shown}")
        if offered.policy == "allow":
            return await self.pass_through(offered, arguments)

        async def run(approved: dict[str, Any]) -> mcp_types.CallToolResult:
            return await self.upstreams[offered.upstream].call_tool(offered.tool.name, approved)

        return await self.gate.hold(ctx, offered, arguments, run)

    async def pass_through(self, offered: Offered, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        try:
            return await self.upstreams[offered.upstream].call_tool(offered.tool.name, arguments)
        except UpstreamFailure as failure:
            return tool_error(
                failure.kind,
                f"{offered.name}: {failure}"
                + (" (it may or may not have run)" if failure.may_have_run else " (it did not run)"),
                upstream=offered.upstream,
            )

    def server(self) -> Server[Any]:
        return Server(
            "signoff-mcp-proxy",
            version="1",
            instructions="Tools of other MCP servers; some need a person's sign-off through Signoff before they run.",
            on_list_tools=self.on_list_tools,
            on_call_tool=self.on_call_tool,
        )

    async def serve_upstreams(self) -> None:
        """The upstreams' connections (each opened on its first request); runs until cancelled."""
        async with asyncio.TaskGroup() as group:
            for upstream in self.upstreams.values():
                group.create_task(upstream.serve())
