"""The gateway's HTTP API (FastAPI): logins, sessions, cards, decisions, the event stream.

It owns no state. It reads the ledger's committed record (reads.py) and speaks to the
ledger only as a registered channel: it signs each response with its own key, as the
person who logged in (never a name the request gives), and publishes it with its own
broker user. The ledger judges every response as it judges any channel's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import calls, cards, events, inbox, logins, oidc, probes, sessions
from .answers import EveryAnswer
from .callers import Gateway
from .head import HeadAsGet
from .middleware import HTTP_REQUESTS, BodyLimit, CountRequests
from .problems import Problem, problem_response
from .settings import GatewaySettings

__all__ = ["HTTP_REQUESTS", "Gateway", "create_app", "dumps", "openapi_document"]


def create_app(start: Callable[[FastAPI], Any] | None = None) -> FastAPI:
    """The API. `start(app)` is an async context manager that opens the gateway's
    connections (main.py); without it (the OpenAPI document) nothing is opened."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if start is None:
            yield
            return
        async with start(app):
            yield

    app = FastAPI(
        title="Signoff gateway",
        version="1",
        description="Durable human sign-off for AI agents' tool calls, over HTTP. Errors are RFC 9457 "
        "problem documents; state-changing requests need the session's CSRF token (X-CSRF-Token).",
        lifespan=lifespan,
        openapi_url="/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(HeadAsGet)  # type: ignore[arg-type]
    app.add_middleware(BodyLimit, limit=lambda: _limit(app))  # type: ignore[arg-type]
    app.add_exception_handler(Problem, problem_answer)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, invalid_answer)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_answer)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, failed_answer)
    app.add_middleware(CountRequests)  # type: ignore[arg-type]
    app.add_middleware(EveryAnswer)  # type: ignore[arg-type]
    # The routes, in this order (the first route that matches a path answers it).
    app.include_router(probes.router)
    app.include_router(logins.home_router)
    app.include_router(logins.router)
    app.include_router(sessions.router)
    app.include_router(cards.router)
    app.include_router(events.router)
    app.include_router(calls.router)
    app.include_router(oidc.router)
    app.include_router(inbox.router)
    app.mount(f"{inbox.PREFIX}/static", inbox.STATIC, name="inbox-static")
    return app


async def problem_answer(_request: Request, problem: Problem) -> JSONResponse:
    retry = problem.extra.get("retry_after")
    return problem_response(problem, {"Retry-After": str(retry)} if retry else None)


async def invalid_answer(_request: Request, error: RequestValidationError) -> JSONResponse:
    errors = error.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return problem_response(Problem(400, "malformed-json", "The body is not JSON"))
    # Where and what, never the input itself (it may hold a password).
    shown = [{"loc": list(e.get("loc", ())), "type": e.get("type"), "msg": e.get("msg")} for e in errors]
    kind = "unknown-field" if any(e.get("type") == "extra_forbidden" for e in errors) else "invalid"
    return problem_response(Problem(422, kind, "The request does not fit", errors=shown))


async def http_answer(_request: Request, error: StarletteHTTPException) -> JSONResponse:
    kinds = {404: "not-found", 405: "method-not-allowed"}
    return problem_response(Problem(error.status_code, kinds.get(error.status_code, "http-error"), str(error.detail)))


async def failed_answer(_request: Request, _error: Exception) -> JSONResponse:
    # Starlette logs the error itself; the client gets a problem document, never its text.
    return problem_response(Problem(500, "internal", "The gateway failed", "Try again; it has been logged."))


def _limit(app: FastAPI) -> int:
    gateway = getattr(app.state, "gateway", None)
    return (
        gateway.settings.gateway_max_body_bytes
        if gateway
        else GatewaySettings.model_fields["gateway_max_body_bytes"].default
    )


def openapi_document() -> dict[str, Any]:
    return create_app().openapi()


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(dumps(openapi_document()))
