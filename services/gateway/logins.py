"""`/v1/login`, `/v1/logout`, `/v1/me`, and `/`: the page that says who is logged in.

A password login is limited per name and per client address (in Redis, across
replicas); the session cookie it sets is HttpOnly, Secure and SameSite=Strict, and every
request that changes state also sends the CSRF token it answers (callers.changing).
"""

from __future__ import annotations

import asyncio
import html
import logging

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse
from prometheus_client import Counter

from .auth import COOKIE, address_key, user_key
from .bodies import PROBLEMS, LoginBody, Me
from .callers import Caller, Changer, Gateway, Who, check_origin, gateway_of
from .problems import Problem

log = logging.getLogger("signoff.gateway")
LOGINS = Counter("signoff_gateway_logins_total", "Login attempts, by outcome", ["outcome"])

router = APIRouter(prefix="/v1", tags=["login"], responses=PROBLEMS)
home_router = APIRouter(include_in_schema=False)


@router.post("/login", response_model=Me)
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
    cookie, session = gateway.sessions.issue(user.name, user.credential)
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


@router.post("/logout", status_code=204)
async def logout(request: Request, who: Changer) -> Response:
    """End this session on every replica."""
    await gateway_of(request).logins.end(who.login)
    response = Response(status_code=204)
    response.delete_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="strict")
    return response


@router.get("/me", response_model=Me)
async def me(request: Request, who: Who) -> Me:
    return me_of(gateway_of(request), who)


@home_router.get("/")
async def home(request: Request) -> HTMLResponse:
    """The page a browser lands on after logging in with OpenID Connect (or any time):
    who is logged in, or a link to log in. No script, nothing it could be framed for."""
    gateway = gateway_of(request)
    login = gateway.sessions.read(request.cookies.get(COOKIE))
    if login is not None and await gateway.logins.person(login) is None:
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
