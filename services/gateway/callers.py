"""Who a request is from, and the gateway's state: the routers' dependencies.

`Who`: the person logged in (a session cookie) or a program (an API token), never a name
the request gives. `Changer`: the same, for a request that changes state, which also
carries the session's CSRF token and comes from this gateway's origin. `State`: the
process's connections (`Gateway`, on `app.state`, opened by main.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, Path, Request

from shared.messages import Envelope
from shared.responses import ResponseSigner

from .auth import COOKIE, CSRF_HEADER, PROGRAM_SESSION, Login, RedisState, Sessions, address_key
from .bodies import ID
from .problems import Problem
from .programs import LiveTokens, bearer, scope_needed
from .reads import Ledger
from .settings import GatewaySettings
from .users import LiveUsers, User


@dataclass
class Gateway:
    settings: GatewaySettings
    users: LiveUsers
    sessions: Sessions
    state: RedisState
    ledger: Ledger
    send: Callable[[Envelope], Awaitable[None]]
    # The gateway's channel key: every decision it sends is built and signed by it (shared/responses.py).
    signer: ResponseSigner
    ready: Callable[[], Awaitable[dict[str, bool]]]
    # API tokens for programs (programs.py); OpenID Connect logins (oidc.py), when configured.
    tokens: LiveTokens | None = None
    oidc: Any = None
    # The process's one watcher of the ledger: the outbox tail and the verdicts waited on (watch.py).
    watch: Any = None
    # Whether a login still holds, and the open streams' logins checked again (auth.Logins).
    logins: Any = None


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
    user = await gateway.logins.person(login)  # None: ended, removed, or its credential reset
    if user is None:
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
    login = Login(program.principal, PROGRAM_SESSION + program.name, float("inf"), credential=program.token_hash)
    return Caller(login, user, program.scopes)


def check_origin(request: Request, settings: GatewaySettings) -> None:
    origin = request.headers.get("origin")
    if origin is None:
        return  # not a browser's cross-site request (browsers send Origin on every POST)
    expected = settings.gateway_public_url.rstrip("/") or f"{request.url.scheme}://{request.headers.get('host', '')}"
    parts = urlsplit(origin)
    if origin == "null" or f"{parts.scheme}://{parts.netloc}" != expected:
        raise Problem(403, "cross-origin", "Request from another origin", "Origin is not this gateway's.")


def ledger_of(request: Request) -> Ledger:
    return gateway_of(request).ledger


State = Annotated[Gateway, Depends(gateway_of)]
Reader = Annotated[Ledger, Depends(ledger_of)]
Who = Annotated[Caller, Depends(caller)]
Changer = Annotated[Caller, Depends(changing)]
Identifier = Annotated[str, Path(pattern=ID)]


def not_found(what: str) -> Problem:
    return Problem(404, "not-found", f"No such {what}", f"No {what} with that id that you may see.")
