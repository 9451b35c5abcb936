"""Tool implementations: `python` (an import path) and `http` (a request template)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from shared.catalogue import (
    HttpImplementation,
    MissingSecret,
    PythonImplementation,
    ToolSpec,
    http_request,
    shown_request,
)
from shared.catalogue import resolve_secrets as resolve
from shared.messages import Outcome
from shared.redaction import redact_text, redact_url, redact_value

# A call's error as reported, recorded and said to the model: enough to say why.
ERROR_CHARS = 1000


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
    """Run the call; what it returns has this call's secrets hidden (its declared
    secret arguments, the `${env:…}` values it used, credential shapes in errors):
    the result is recorded, reported, put in the transcript and sent to hooks."""
    implementation = spec.implementation
    if isinstance(implementation, PythonImplementation):
        result = await _run_python(implementation, spec, arguments, context)
    elif isinstance(implementation, HttpImplementation):
        result = await _run_http(implementation, spec, arguments, context, http)
    else:
        result = ToolResult("error", error=f"the tool {spec.name!r} has no implementation")
    secrets = spec.secret_values(arguments)
    return ToolResult(
        result.outcome,
        redact_value(result.output, secrets) if result.output is not None else None,
        # Cut after hiding: a secret cut in two would no longer be found.
        redact_text(result.error, secrets)[:ERROR_CHARS] if result.error is not None else None,
    )


async def _run_python(
    implementation: PythonImplementation, spec: ToolSpec, arguments: dict[str, Any], context: ToolContext
) -> ToolResult:
    """A plain function runs in a thread of its own, an `async def` one on the loop:
    either way the loop stays free, so the claim's heartbeat keeps beating however
    long the tool takes (a lapsed claim would let a redelivery run the call again,
    or close it as outcome-unknown while it still runs). Past the declared timeout
    the call ends: an outward one as outcome-unknown (it may have had its effect, or
    still have it: a thread cannot be stopped), a read or idempotent one as an error."""
    try:
        function = _import(implementation.function)
    except Exception as error:
        return ToolResult("error", error=f"{type(error).__name__}: {error}")
    timeout = implementation.timeout_seconds
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            if inspect.iscoroutinefunction(function):
                value = await function(arguments, context)
            else:
                value = await _in_thread(function, arguments, context)
                if inspect.isawaitable(value):
                    value = await value
    except Exception as error:
        if isinstance(error, TimeoutError) and deadline.expired():
            late = f"the tool did not finish within {timeout:g} s"
            # It may have had its effect, or have it yet: say so rather than guess (invariant 4).
            return ToolResult("outcome_unknown" if spec.effect == "outward" else "error", error=late)
        return ToolResult("error", error=f"{type(error).__name__}: {error}")
    return ToolResult("output", _as_json(value))


def _in_thread(function: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """`function(*args)` in a new daemon thread: one that never returns holds no pool
    worker and no process exit, and everything a tool raises (SystemExit too) is its result."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # timed out and abandoned
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error if isinstance(error, Exception) else ToolFailed(repr(error)))

    def work() -> None:
        try:
            value, error = function(*args), None
        except BaseException as raised:
            value, error = None, raised
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name=f"tool:{getattr(function, '__name__', 'python')}", daemon=True).start()
    return future


def _as_json(value: Any) -> Any:
    """The output as JSON values: it is recorded in the claim row and reported, and a
    value neither can hold (a datetime, a set) would fail the call after it ran."""
    try:
        # NaN and infinities are not JSON (PostgreSQL refuses them): null, as pydantic writes them.
        return json.loads(json.dumps(value, default=repr), parse_constant=lambda _: None)
    except (TypeError, ValueError, RecursionError):  # keys that are not strings, cycles, depth
        return repr(value)[:10_000]


async def _run_http(
    implementation: HttpImplementation,
    spec: ToolSpec,
    arguments: dict[str, Any],
    context: ToolContext,
    http: httpx.AsyncClient,
) -> ToolResult:
    try:
        request = http_request(implementation, arguments, env=lambda name: resolve(f"${{env:{name}}}"))
    except MissingSecret as missing:
        return ToolResult("error", error=f"the executor cannot make this call: {missing}")
    # Errors name the request as the card shows it: never the URL with its secrets filled in.
    shown = shown_request(implementation, spec.shown_arguments(arguments))
    url, method, headers = request.url, request.method, {**request.headers}
    headers["Idempotency-Key"] = context.idempotency_key
    try:
        response = await http.request(
            method,
            url,
            headers=headers,
            params=request.params,
            json=request.json,
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
        return ToolResult("error", error=f"could not connect for {shown}: {_why(error, url)}")
    except (httpx.TimeoutException, httpx.TransportError) as error:
        if spec.effect == "outward":
            # The request may have arrived: say so rather than guess (invariant 4).
            return ToolResult("outcome_unknown", error=f"{shown} failed after sending: {_why(error, url)}")
        return ToolResult("error", error=f"{shown} failed: {_why(error, url)}")
    try:
        body: Any = response.json()
    except ValueError:
        # Hidden before it is cut: a secret cut in two would no longer be found.
        body = redact_text(response.text, spec.secret_values(arguments))[:10_000]
    if response.is_success:
        return ToolResult("output", {"status": response.status_code, "body": body})
    # The receiver's answer, its secrets hidden and cut short by `run_tool`: enough to say why.
    return ToolResult("error", error=f"HTTP {response.status_code} from {shown}: {body}")


def _why(error: Exception, url: str) -> str:
    """An httpx error without the URL it may quote (the real one, secrets filled in)."""
    return f"{type(error).__name__}: {str(error).replace(url, redact_url(url))}"
