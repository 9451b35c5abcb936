"""The gateway's HTTP API (FastAPI): logins, sessions, cards, decisions, the event stream.

It owns no state. It reads the ledger's committed record (reads.py) and speaks to the
ledger only as a registered channel: it signs each response with its own key, as the
person who logged in (never a name the request gives), and publishes it with its own
broker user. The ledger judges every response as it judges any channel's.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import json
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.ledger.pages import BadCursor
from shared.messages import CancelTurn, Envelope, Remember, RespondToApproval, RevokeGrant, StartTurn, mint

from .auth import COOKIE, CSRF_HEADER, Login, RedisState, Sessions, address_key, user_key
from .events import stream
from .inbox import install_routes as install_inbox_routes
from .oidc import install_routes as install_oidc_routes
from .problems import PROBLEM, Problem, problem_response
from .programs import LiveTokens, bearer, scope_needed
from .reads import Ledger, may_approve
from .settings import GatewaySettings
from .users import LiveUsers, User

log = logging.getLogger("signoff.gateway")
ID = r"^[A-Za-z0-9_-]{1,64}$"
# Ledger refusals that say the person may not do this (403); any other is a conflict with the state (409).
FORBIDDEN = {
    "not_an_approver",
    "starter_may_not_approve",
    "starter_unknown",
    "wrong_principal",
    "anonymous_approval",
    "unauthorized_sender",
}
HTTP_REQUESTS = Counter(
    "signoff_gateway_requests_total", "HTTP requests the gateway answered, by route and status", ["route", "status"]
)
LOGINS = Counter("signoff_gateway_logins_total", "Login attempts, by outcome", ["outcome"])


# --- bodies and answers (OpenAPI: docs/openapi.json) ------------------------------------


class Strict(BaseModel):
    # Unknown fields are refused: a misspelt `reason` must not be silently dropped.
    model_config = ConfigDict(extra="forbid")


class LoginBody(Strict):
    name: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)


class Me(BaseModel):
    principal: str
    operator: bool
    groups: list[str]
    csrf_token: str
    expires_at: float


class StartBody(Strict):
    text: str = Field(min_length=1, max_length=100_000)
    # The id of a new session, or of one the caller started (a new turn in it); empty: a new one.
    session_id: str | None = Field(default=None, pattern=ID)
    provider: str | None = Field(default=None, max_length=64, pattern=r"^[a-z0-9_-]+$")


class Started(BaseModel):
    session_id: str
    message_id: str
    links: dict[str, str]


class CancelBody(Strict):
    reason: str = Field(default="", max_length=4000, pattern=r"^[^\x00]*$")


class Cancelled(BaseModel):
    session_id: str
    message_id: str


class DecisionBody(Strict):
    decision: Literal["approve", "deny"]
    reason: str = Field(default="", max_length=4000, pattern=r"^[^\x00]*$")
    message: str = Field(default="", max_length=4000, pattern=r"^[^\x00]*$")
    # The digest on the card the person read; the ledger refuses an approval of other arguments.
    # Empty: the request's digest as the ledger holds it.
    args_digest: str | None = Field(default=None, max_length=100)
    # Edit before approve: the whole argument object as edited from the card (fields as
    # shown are unchanged). Relayed as sent: the ledger judges it against the tool's
    # declaration and schema, and the approval then binds these arguments.
    arguments: dict[str, Any] | None = None
    # Approve and remember: also allow later calls of this tool in this session, on the
    # card's target (`target` as the card shows it) or any (`target` null), for `hours`
    # (null: the rest of the session). Relayed as sent: the ledger decides whether it may.
    remember: RememberBody | None = None


class RememberBody(Strict):
    target: str | None = Field(default=None, max_length=4000)
    hours: float | None = Field(default=None, allow_inf_nan=False)


class GrantShown(BaseModel):
    id: str
    session_id: str
    request_id: str
    granted_by: str
    tool: str
    tool_version: str
    # None: any target of the tool.
    target: str | None
    approvals_required: int
    granted_at: datetime
    # None: for the rest of the session.
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None
    # Whether it still covers calls (neither revoked nor expired).
    live: bool


class Grants(BaseModel):
    grants: list[GrantShown]


class RevokeBody(Strict):
    reason: str = Field(default="", max_length=4000, pattern=r"^[^\x00]*$")


class Revoking(BaseModel):
    grant_id: str
    message_id: str


class Verdict(BaseModel):
    response_id: str
    request_id: str
    decision: Literal["approve", "deny"]
    responder: str
    outcome: Literal["accepted"]
    # Whether this response decided the request; when it needs more approvals, how many so far.
    decided: bool
    approvals: int | None = None
    approvals_required: int | None = None


class Pending(BaseModel):
    response_id: str
    request_id: str
    status: Literal["pending"]
    links: dict[str, str]


class Card(BaseModel):
    id: str
    session_id: str
    status: str
    tool: str
    label: str
    description: str
    effect: str
    target: str
    arguments: dict[str, Any]
    hidden: list[str]
    args_digest: str
    created_at: datetime
    expires_at: datetime | None
    approvers: list[str] | None
    approvals: int
    approvals_required: int
    # Why the call needs approval, and from how many (the tool's rule over its arguments).
    reason: str | None = None
    # Set once a person changed the arguments before approving: who, and how (a short diff).
    edited_by: str | None = None
    edit: str | None = None
    starter_may_approve: bool
    # Whether the tool may be remembered ("approve and remember"); the ledger still judges.
    rememberable: bool = False


class Cards(BaseModel):
    requests: list[Card]
    # The next page: pass it back as `cursor` (None: this was the last).
    next: str | None = None


class TranscriptEntryShown(BaseModel):
    role: str
    text: str
    tool_calls: list[dict[str, Any]]
    call_id: str | None
    closure: str | None


class SessionShown(BaseModel):
    id: str
    status: str
    status_reason: str | None
    started_by: str | None
    created_at: datetime
    updated_at: datetime
    transcript: list[TranscriptEntryShown]
    pending_requests: list[Card]
    usage: dict[str, int]
    # Its remembered approvals, live or not.
    grants: list[GrantShown] = []


class ProblemDocument(BaseModel):
    """RFC 9457: `type` is machine-readable (`urn:signoff:problem:<kind>`; a ledger refusal's
    kind is its reason code), `title` and `detail` are for people."""

    type: str
    title: str
    status: int
    detail: str | None = None
    # A ledger refusal: its reason code and the response it refused.
    reason_code: str | None = None
    response_id: str | None = None
    # Validation: where and what, never the input itself.
    errors: list[dict[str, Any]] | None = None


PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"description": "A problem document", "content": {PROBLEM: {"schema": ProblemDocument.model_json_schema()}}}
    for code in (400, 401, 403, 404, 409, 413, 422, 429)
}


# --- the gateway's connections (made at start-up, never at import) ------------------------


@dataclass
class Gateway:
    settings: GatewaySettings
    users: LiveUsers
    sessions: Sessions
    state: RedisState
    ledger: Ledger
    send: Callable[[Envelope], Awaitable[None]]
    sign: Callable[[RespondToApproval], RespondToApproval]
    ready: Callable[[], Awaitable[dict[str, bool]]]
    # API tokens for programs (programs.py); OpenID Connect logins (oidc.py), when configured.
    tokens: LiveTokens | None = None
    oidc: Any = None
    # The process's one watcher of the ledger: the outbox tail and the verdicts waited on (watch.py).
    watch: Any = None


def gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway


@dataclass(frozen=True)
class Caller:
    login: Login
    user: User
    # A program's token: its scopes (programs.py). None: a person logged in with a session.
    scopes: frozenset[str] | None = None


async def caller(request: Request) -> Caller:
    """The person this request is from: a valid, unexpired, not-ended session of a user
    who still exists. Never a name the request gives."""
    gateway = gateway_of(request)
    token = bearer(request.headers.get("authorization"))
    if token is not None:
        return await checked_program_caller(request, gateway, token)
    login = gateway.sessions.read(request.cookies.get(COOKIE))
    if login is None:
        raise Problem(401, "unauthenticated", "Log in first", "No valid session: POST /v1/login.")
    user = gateway.users.current().users.get(login.principal)
    if user is None or await gateway.state.ended(login):
        raise Problem(401, "unauthenticated", "Log in first", "This session has ended.")
    if login.groups:  # an OpenID Connect login's groups claim
        user = User(user.name, user.password_hash, tuple(dict.fromkeys(user.groups + login.groups)), user.operator)
    return Caller(login, user)


async def changing(request: Request, who: Annotated[Caller, Depends(caller)]) -> Caller:
    """A request that changes state: it also carries the session's CSRF token, and comes
    from the gateway's own origin when a browser names one."""
    gateway = gateway_of(request)
    if who.scopes is not None:
        return who  # a bearer token: no cookie, so nothing a forged cross-site request could ride on
    check_origin(request, gateway.settings)
    if not gateway.sessions.csrf_ok(who.login, request.headers.get(CSRF_HEADER)):
        raise Problem(403, "csrf", "CSRF token missing or wrong", f"Send the session's token in {CSRF_HEADER}.")
    return who


async def checked_program_caller(request: Request, gateway: Gateway, token: str) -> Caller:
    """A bearer request, within the limit on failed tokens per client address (in Redis,
    across replicas): past it, refused before the token is even looked at."""
    settings = gateway.settings
    key = "bearer:" + address_key(request.client.host if request.client else "unknown")
    wait = await gateway.state.limited(key, settings.gateway_token_failures_per_address)
    if wait:
        problem = Problem(429, "too-many-token-failures", "Too many failed tokens", f"Try again in {wait:.0f} s.")
        problem.extra["retry_after"] = max(1, int(wait))
        raise problem
    try:
        return program_caller(request, gateway, token)
    except Problem as problem:
        if problem.status == 401:
            await gateway.state.failed(key, settings.gateway_login_window_seconds)
        raise


def program_caller(request: Request, gateway: Gateway, token: str) -> Caller:
    """A program with an API token: known (by the token's hash) and not revoked, and the
    route within its scopes (403 otherwise). The token itself is never logged."""
    program = gateway.tokens.find(token) if gateway.tokens is not None else None
    if program is None:
        raise Problem(401, "unauthenticated", "Unknown, revoked or expired token", "Send a valid API token.")
    route = request.scope.get("route")
    open_to_tokens, needed = scope_needed(request.method, getattr(route, "path", ""))
    if not open_to_tokens or (needed is not None and needed not in program.scopes):
        raise Problem(
            403, "insufficient-scope", "The token's scopes do not allow this", f"Needs scope {needed or '(none)'}."
        )
    user = User(program.principal, "", (), False)
    return Caller(Login(program.principal, "token:" + program.name, float("inf")), user, program.scopes)


def check_origin(request: Request, settings: GatewaySettings) -> None:
    origin = request.headers.get("origin")
    if origin is None:
        return  # not a browser's cross-site request (browsers send Origin on every POST)
    expected = settings.gateway_public_url.rstrip("/") or f"{request.url.scheme}://{request.headers.get('host', '')}"
    parts = urlsplit(origin)
    if origin == "null" or f"{parts.scheme}://{parts.netloc}" != expected:
        raise Problem(403, "cross-origin", "Request from another origin", "Origin is not this gateway's.")


Who = Annotated[Caller, Depends(caller)]
Changer = Annotated[Caller, Depends(changing)]
Identifier = Annotated[str, Path(pattern=ID)]


# --- the body size limit (pure ASGI: it counts the bytes before anything parses them) -------


class CountRequests:
    """Counts each answer by route and status as it starts. Pure ASGI: starlette's
    `@app.middleware("http")` (BaseHTTPMiddleware) pipes every body chunk, the event
    stream's included, through a task and a memory stream (make bench, the gateway level)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counted(message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                HTTP_REQUESTS.labels(getattr(route, "path", "unmatched"), str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)


class BodyLimit:
    def __init__(self, app, limit: Callable[[], int]) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit()
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_large = Problem(413, "too-large", "Body too large", f"At most {limit} bytes.")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await problem_response(too_large)(scope, receive, send)
        # The body is read here, whole and bounded, before anything parses it; then handed on.
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                return await problem_response(too_large)(scope, receive, send)
        handed = False

        async def replay():
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# --- the app --------------------------------------------------------------------------------


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
    app.add_middleware(BodyLimit, limit=lambda: _limit(app))  # type: ignore[arg-type]

    @app.exception_handler(Problem)
    async def _problem(_request: Request, problem: Problem) -> JSONResponse:
        retry = problem.extra.get("retry_after")
        return problem_response(problem, {"Retry-After": str(retry)} if retry else None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        errors = error.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return problem_response(Problem(400, "malformed-json", "The body is not JSON"))
        # Where and what, never the input itself (it may hold a password).
        shown = [{"loc": list(e.get("loc", ())), "type": e.get("type"), "msg": e.get("msg")} for e in errors]
        kind = "unknown-field" if any(e.get("type") == "extra_forbidden" for e in errors) else "invalid"
        return problem_response(Problem(422, kind, "The request does not fit", errors=shown))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, error: StarletteHTTPException) -> JSONResponse:
        kinds = {404: "not-found", 405: "method-not-allowed"}
        return problem_response(
            Problem(error.status_code, kinds.get(error.status_code, "http-error"), str(error.detail))
        )

    app.add_middleware(CountRequests)  # type: ignore[arg-type]

    # --- probes --------------------------------------------------------------------------

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request) -> PlainTextResponse:
        verdicts = await gateway_of(request).ready()
        body = "".join(f"{name}: {'ok' if ok else 'not ready'}\n" for name, ok in verdicts.items())
        return PlainTextResponse(body, status_code=200 if verdicts and all(verdicts.values()) else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        await gateway_of(request).ready()
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def home(request: Request) -> HTMLResponse:
        """The page a browser lands on after logging in with OpenID Connect (or any time):
        who is logged in, or a link to log in. No script, nothing it could be framed for."""
        gateway = gateway_of(request)
        login = gateway.sessions.read(request.cookies.get(COOKIE))
        if login is not None and (
            login.principal not in gateway.users.current().users or await gateway.state.ended(login)
        ):
            login = None
        if login is not None:
            body = f"<p>Logged in to Signoff as <b>{html.escape(login.principal)}</b>.</p>"
        else:
            body = "<p>Not logged in.</p>" + (
                '<p><a href="/v1/login/oidc">Log in</a></p>' if gateway.oidc is not None else ""
            )
        page = f'<!doctype html><html lang="en"><meta charset="utf-8"><title>Signoff</title>{body}</html>\n'
        return HTMLResponse(
            page,
            headers={
                "Cache-Control": "no-store",
                "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff",
            },
        )

    # --- logins --------------------------------------------------------------------------

    @app.post("/v1/login", response_model=Me, responses=PROBLEMS, tags=["login"])
    async def login(body: LoginBody, request: Request, response: Response) -> Me:
        """Log in with a name and password (`signoff user add`): sets the session cookie and
        answers the CSRF token to send with every request that changes something."""
        gateway = gateway_of(request)
        check_origin(request, gateway.settings)
        settings = gateway.settings
        window = settings.gateway_login_window_seconds
        address = request.client.host if request.client else "unknown"
        keys = (
            (user_key(body.name), settings.gateway_login_attempts_per_user),
            (address_key(address), settings.gateway_login_attempts_per_address),
        )
        counted = []
        for key, limit in keys:
            allowed, wait = await gateway.state.attempt(key, limit, window)
            counted.append(key)
            if not allowed:
                LOGINS.labels("limited").inc()
                raise_limited(wait)
        # argon2 is deliberately slow: off the event loop.
        user = await asyncio.to_thread(gateway.users.current().verify, body.name, body.password)
        if user is None:
            LOGINS.labels("refused").inc()
            log.info("login refused for a name or password that does not match")
            raise Problem(401, "bad-login", "Wrong name or password")
        for key in counted:
            await gateway.state.give_back(key)
        cookie, session = gateway.sessions.issue(user.name)
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=int(settings.gateway_session_seconds),
            httponly=True,
            secure=True,
            samesite="strict",
            path="/",
        )
        LOGINS.labels("accepted").inc()
        log.info("%s logged in", user.name)
        return me_of(gateway, Caller(session, user))

    @app.post("/v1/logout", status_code=204, responses=PROBLEMS, tags=["login"])
    async def logout(request: Request, who: Changer) -> Response:
        """End this session on every replica."""
        await gateway_of(request).state.end(who.login)
        response = Response(status_code=204)
        response.delete_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return response

    @app.get("/v1/me", response_model=Me, responses=PROBLEMS, tags=["login"])
    async def me(request: Request, who: Who) -> Me:
        return me_of(gateway_of(request), who)

    # --- sessions ------------------------------------------------------------------------

    @app.post("/v1/sessions", status_code=202, response_model=Started, responses=PROBLEMS, tags=["sessions"])
    async def start_session(body: StartBody, request: Request, who: Changer) -> Started:
        """Start a turn in a new session, started by the caller."""
        gateway = gateway_of(request)
        session_id = body.session_id or mint("ses")
        # A new turn in an existing session only for whoever may see it (its starters, operators).
        exists = body.session_id is not None and await gateway.ledger.session(session_id) is not None
        if exists and not await gateway.ledger.may_see_session(who.user, session_id):
            raise not_found("session")
        turn = StartTurn(session_id=session_id, text=body.text, provider=body.provider, started_by=who.user.name)
        await gateway.send(turn)
        return Started(
            session_id=turn.session_id,
            message_id=turn.message_id,
            links={"session": f"/v1/sessions/{turn.session_id}"},
        )

    @app.get("/v1/sessions/{session_id}", response_model=SessionShown, responses=PROBLEMS, tags=["sessions"])
    async def show_session(session_id: Identifier, request: Request, who: Who) -> dict[str, Any]:
        """Status, transcript (as the card shows it), pending requests and usage: for
        whoever started it, and operators."""
        gateway = gateway_of(request)
        shown = await gateway.ledger.session(session_id)
        if shown is None or not await gateway.ledger.may_see_session(who.user, session_id):
            raise not_found("session")
        return shown

    @app.post(
        "/v1/sessions/{session_id}/cancel",
        status_code=202,
        response_model=Cancelled,
        responses=PROBLEMS,
        tags=["sessions"],
    )
    async def cancel_session(session_id: Identifier, body: CancelBody, request: Request, who: Changer) -> Cancelled:
        """Cancel the session's open turn, as the caller (the ledger judges whether they may)."""
        gateway = gateway_of(request)
        if await gateway.ledger.session(session_id) is None or not await gateway.ledger.may_see_session(
            who.user, session_id
        ):
            raise not_found("session")
        cancel = CancelTurn(session_id=session_id, reason=body.reason, cancelled_by=who.user.name)
        await gateway.send(cancel)
        return Cancelled(session_id=session_id, message_id=cancel.message_id)

    # --- grants (approve and remember) ------------------------------------------------------

    @app.get("/v1/sessions/{session_id}/grants", response_model=Grants, responses=PROBLEMS, tags=["sessions"])
    async def list_grants(session_id: Identifier, request: Request, who: Who) -> dict[str, Any]:
        """The session's remembered approvals, live or not: for whoever started it, and operators."""
        ledger = gateway_of(request).ledger
        if await ledger.session(session_id) is None or not await ledger.may_see_session(who.user, session_id):
            raise not_found("session")
        return {"grants": await ledger.grants(session_id)}

    @app.post(
        "/v1/grants/{grant_id}/revoke", status_code=202, response_model=Revoking, responses=PROBLEMS, tags=["sessions"]
    )
    async def revoke_grant(grant_id: Identifier, body: RevokeBody, request: Request, who: Changer) -> Revoking:
        """Revoke a remembered approval, as the caller (the ledger judges whether they may):
        every call decided after it asks a person again."""
        gateway = gateway_of(request)
        grant = await gateway.ledger.grant(grant_id)
        if grant is None or not (
            await gateway.ledger.may_see_session(who.user, grant.session_id)
            or may_approve(gateway.ledger.catalogue, who.user, grant.tool, False)
        ):
            raise not_found("grant")
        revoke = RevokeGrant(
            session_id=grant.session_id, grant_id=grant_id, reason=body.reason, revoked_by=who.user.name
        )
        await gateway.send(revoke)
        return Revoking(grant_id=grant_id, message_id=revoke.message_id)

    # --- requests ------------------------------------------------------------------------

    @app.get("/v1/requests", response_model=Cards, responses=PROBLEMS, tags=["requests"])
    async def list_requests(
        request: Request,
        who: Who,
        status: Annotated[
            Literal["pending", "approved", "denied", "expired", "cancelled", "altered"] | None, Query()
        ] = None,
        tool: Annotated[str | None, Query(max_length=256)] = None,
        session_id: Annotated[str | None, Query(pattern=ID)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
        cursor: Annotated[str | None, Query(max_length=512)] = None,
    ) -> dict[str, Any]:
        """The cards the caller may see: those they may approve and those of sessions they started
        (operators: all), oldest first, a page of at most `limit`; `next` is the cursor of the page after."""
        try:
            cards, following = await gateway_of(request).ledger.requests(
                who.user, status, tool, session_id, limit, cursor
            )
        except BadCursor as error:
            raise Problem(400, "bad-cursor", "Not a cursor", "Pass back a `next` this gateway gave.") from error
        return {"requests": cards, "next": following}

    @app.get("/v1/requests/{request_id}", response_model=Card, responses=PROBLEMS, tags=["requests"])
    async def show_request(request_id: Identifier, request: Request, who: Who) -> dict[str, Any]:
        ledger = gateway_of(request).ledger
        found = await ledger.request(request_id)
        if found is None or not await ledger.may_see_request(who.user, found):
            raise not_found("request")
        return await ledger.card(found)

    @app.post(
        "/v1/requests/{request_id}/decision",
        response_model=Verdict,
        responses={**PROBLEMS, 202: {"model": Pending}},
        tags=["requests"],
    )
    async def decide(
        request_id: Identifier,
        body: DecisionBody,
        request: Request,
        who: Changer,
        idempotency_key: Annotated[str, Header(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")],
    ) -> Any:
        """Approve or deny, as the caller, with an Idempotency-Key: the same key answers the
        same outcome and sends nothing twice. Answers the ledger's verdict once it has
        decided (refusals as problems naming the ledger's reason code), or 202 and a link
        to poll when that takes longer than a few seconds."""
        gateway = gateway_of(request)
        found = await gateway.ledger.request(request_id)
        if found is None:
            raise not_found("request")
        # The response's ids follow from who asks and their key: the same key gives the same
        # message (the ledger's inbox drops it) and the same response id (`replayed`).
        message_id, response_id = response_ids(who.user.name, idempotency_key)
        earlier = await gateway.ledger.verdict(found.session_id, message_id)
        if earlier is None:
            response = RespondToApproval(
                message_id=message_id,
                response_id=response_id,
                session_id=found.session_id,
                request_id=found.id,
                decision=body.decision,
                args_digest=body.args_digest or found.args_digest,
                reason=body.reason,
                message=body.message,
                responder=who.user.name,
                edited_arguments=body.arguments if body.decision == "approve" else None,
                remember=None if body.remember is None else Remember(**body.remember.model_dump()),
            )
            signed = gateway.sign(response)
            wait = gateway.settings.gateway_decision_wait_seconds
            earlier = await gateway.watch.verdict(found.session_id, message_id, wait, lambda: gateway.send(signed))
        if earlier is None:
            return pending(request_id, response_id)
        if earlier.subject != request_id or (earlier.detail or {}).get("decision") != body.decision:
            raise Problem(
                422,
                "idempotency-key-reused",
                "Idempotency-Key used for another decision",
                "This key already answered a different request or decision.",
            )
        return answer(earlier)

    @app.get(
        "/v1/requests/{request_id}/decision/{response_id}",
        response_model=Verdict,
        responses={**PROBLEMS, 202: {"model": Pending}},
        tags=["requests"],
    )
    async def poll_decision(request_id: Identifier, response_id: Identifier, request: Request, who: Who) -> Any:
        """The ledger's verdict on a decision answered 202."""
        gateway = gateway_of(request)
        found = await gateway.ledger.request(request_id)
        if found is None or not response_id.startswith("rsp_"):
            raise not_found("decision")
        earlier = await gateway.ledger.verdict(found.session_id, "msg_" + response_id[4:])
        if earlier is not None and earlier.actor != who.user.name:
            raise not_found("decision")
        return answer(earlier) if earlier is not None else pending(request_id, response_id)

    # --- events --------------------------------------------------------------------------

    @app.get(
        "/v1/events",
        responses={**PROBLEMS, 200: {"content": {"text/event-stream": {}}}},
        response_class=Response,
        tags=["events"],
    )
    async def events(
        request: Request,
        who: Who,
        last_event_id: Annotated[str | None, Header(max_length=64)] = None,
        since: Annotated[Literal["start", "now"], Query()] = "start",
    ) -> Response:
        """Server-Sent Events of every event the caller may see, in the ledger's commit
        order, each with an id; `Last-Event-ID` resumes right after it, on any replica.
        Without one the stream starts at the ledger's beginning (`since=start`), or with
        what is committed from now on (`since=now`: its first message is the id to resume
        from, with no event, so a reconnect before any event misses nothing)."""
        return await stream(gateway_of(request), who.user, last_event_id, since)

    install_oidc_routes(app, sys.modules[__name__])
    install_inbox_routes(app, sys.modules[__name__])
    return app


def _limit(app: FastAPI) -> int:
    gateway = getattr(app.state, "gateway", None)
    return (
        gateway.settings.gateway_max_body_bytes
        if gateway
        else GatewaySettings.model_fields["gateway_max_body_bytes"].default
    )


def me_of(gateway: Gateway, who: Caller) -> Me:
    return Me(
        principal=who.user.name,
        operator=who.user.operator,
        groups=list(who.user.groups),
        # A program's token needs no CSRF token and does not expire (it is revoked).
        csrf_token=gateway.sessions.csrf_token(who.login) if who.scopes is None else "",
        expires_at=who.login.expires_at if who.scopes is None else 0.0,
    )


def raise_limited(wait: float) -> None:
    problem = Problem(429, "too-many-logins", "Too many login attempts", f"Try again in {wait:.0f} s.")
    problem.extra["retry_after"] = max(1, int(wait))
    raise problem


def not_found(what: str) -> Problem:
    return Problem(404, "not-found", f"No such {what}", f"No {what} with that id that you may see.")


def response_ids(principal: str, key: str) -> tuple[str, str]:
    digest = hashlib.sha256(b"signoff-gateway-response\0" + principal.encode() + b"\0" + key.encode()).hexdigest()
    return f"msg_{digest[:32]}", f"rsp_{digest[:32]}"


def pending(request_id: str, response_id: str) -> JSONResponse:
    return JSONResponse(
        Pending(
            response_id=response_id,
            request_id=request_id,
            status="pending",
            links={"poll": f"/v1/requests/{request_id}/decision/{response_id}"},
        ).model_dump(),
        status_code=202,
    )


def answer(entry) -> Any:
    """The ledger's verdict as an HTTP answer: the accepted response, or a problem naming its reason code."""
    detail = entry.detail or {}
    if entry.kind == "response.rejected":
        code = str(detail.get("reason_code", "refused"))
        return problem_response(
            Problem(
                403 if code in FORBIDDEN else 409,
                code.replace("_", "-"),
                "Refused by the ledger",
                str(detail.get("reason_text", "")),
                reason_code=code,
                response_id=detail.get("response_id"),
            )
        )
    return Verdict(
        response_id=str(detail.get("response_id", "")),
        request_id=entry.subject or "",
        decision=detail.get("decision", "approve"),
        responder=entry.actor or "",
        outcome="accepted",
        decided=detail.get("count") is None,
        approvals=detail.get("count"),
        approvals_required=detail.get("required"),
    )


def openapi_document() -> dict[str, Any]:
    return create_app().openapi()


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(dumps(openapi_document()))
