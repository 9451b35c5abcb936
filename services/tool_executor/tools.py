"""Tool implementations: `python` (an import path) and `http` (a request template)."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from shared.catalogue import HttpImplementation, PythonImplementation, ToolSpec, resolve_secrets
from shared.messages import Outcome


@dataclass(frozen=True)
class ToolContext:
    """What a python tool gets besides its arguments."""

    call_id: str
    session_id: str
    # The same on every retry of this call: pass it to any API that deduplicates.
    idempotency_key: str
    attempt: int
    data_dir: Path


@dataclass(frozen=True)
class ToolResult:
    outcome: Outcome
    output: Any = None
    error: str | None = None


class ToolFailed(Exception):
    pass


def _import(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


async def run_tool(
    spec: ToolSpec, arguments: dict[str, Any], context: ToolContext, http: httpx.AsyncClient
) -> ToolResult:
    implementation = spec.implementation
    if isinstance(implementation, PythonImplementation):
        try:
            function = _import(implementation.function)
            value = function(arguments, context)
            if inspect.isawaitable(value):
                value = await value
            return ToolResult("output", value)
        except Exception as error:
            return ToolResult("error", error=f"{type(error).__name__}: {error}")
    if isinstance(implementation, HttpImplementation):
        return await _run_http(implementation, spec, arguments, context, http)
    return ToolResult("error", error=f"the tool {spec.name!r} has no implementation")


async def _run_http(
    implementation: HttpImplementation,
    spec: ToolSpec,
    arguments: dict[str, Any],
    context: ToolContext,
    http: httpx.AsyncClient,
) -> ToolResult:
    url = resolve_secrets(implementation.url)
    used = set()
    for key, value in arguments.items():
        if "{" + key + "}" in url:
            url = url.replace("{" + key + "}", quote(str(value), safe=""))
            used.add(key)
    rest = {k: v for k, v in arguments.items() if k not in used}
    headers = {k: resolve_secrets(v).strip() for k, v in implementation.headers.items()}
    headers["Idempotency-Key"] = context.idempotency_key
    method = implementation.method.upper()
    try:
        response = await http.request(
            method,
            url,
            headers=headers,
            params=rest if method in ("GET", "DELETE") else None,
            json=rest if method not in ("GET", "DELETE") else None,
            timeout=implementation.timeout_seconds,
        )
    except (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.LocalProtocolError,
        httpx.UnsupportedProtocol,
        httpx.InvalidURL,
    ) as error:
        # Nothing reached the server: an honest error, not an unknown outcome.
        return ToolResult("error", error=f"could not connect to {url}: {error}")
    except (httpx.TimeoutException, httpx.TransportError) as error:
        if spec.effect == "outward":
            # The request may have arrived: say so rather than guess (invariant 4).
            return ToolResult("outcome_unknown", error=f"{method} {url} failed after sending: {error!r}")
        return ToolResult("error", error=f"{method} {url} failed: {error!r}")
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text[:10_000]
    if response.is_success:
        return ToolResult("output", {"status": response.status_code, "body": body})
    return ToolResult("error", error=f"HTTP {response.status_code} from {method} {url}: {str(body)[:2000]}")
