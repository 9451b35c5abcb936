"""OpenID Connect logins (authorization code + PKCE), the production login.

`GET /v1/login/oidc` sends the browser to the issuer's authorization endpoint with a fresh
`state`, `nonce` and PKCE verifier (S256), which travel in a short-lived cookie signed with
the gateway's session key: any replica can finish the login, and none keeps it in memory.
`GET /v1/login/oidc/callback` checks `state`, exchanges the code (authlib's OAuth2 client,
with the client secret and the verifier) and verifies the ID token: RS256/ES256 signature
against the issuer's JWKS (fetched from its discovery document; read again once for an
unknown key id), `iss`, `aud` (our client id), `exp`/`iat`, and the `nonce`. Any failure
logs nobody in (401) and logs why, never a token.

Who it logs in: the configured principal claim (SIGNOFF_GATEWAY_OIDC_PRINCIPAL_CLAIM,
default `preferred_username`) names a user added with `signoff user add NAME --oidc`.
Only those: the gateway's channel is registered for its users (users.register_channel),
so the person is one the channel may assert, and an issuer that lets someone pick their
own username cannot make them a password user. The groups claim's values are kept in
the session (shown by `GET /v1/me`); approval rights come from the tool catalogue.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import httpx
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from .auth import COOKIE
from .bodies import PROBLEMS
from .callers import gateway_of
from .problems import Problem
from .settings import GatewaySettings

log = logging.getLogger("signoff.gateway")
FLOW_COOKIE = "signoff_oidc"
FLOW_SECONDS = 600
ALGORITHMS = ["RS256", "ES256"]
# `GET /v1/login/oidc` and its callback (404 when OpenID Connect is not configured).
router = APIRouter()


class Refused(Exception):
    """An OpenID Connect login that logs nobody in; the message says why (never a token)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class OpenIDConnect:
    issuer: str
    client_id: str
    client_secret: str
    redirect_url: str
    principal_claim: str
    groups_claim: str
    scope: str
    _metadata: dict[str, Any] | None = None
    _keys: KeySet | None = None
    _fetched_keys_at: float = 0.0
    _http: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> OpenIDConnect | None:
        if not settings.gateway_oidc_issuer:
            return None
        return cls(
            settings.gateway_oidc_issuer.rstrip("/"),
            settings.gateway_oidc_client_id,
            settings.gateway_oidc_client_secret,
            settings.gateway_oidc_redirect_url,
            settings.gateway_oidc_principal_claim,
            settings.gateway_oidc_groups_claim,
            settings.gateway_oidc_scope,
        )

    async def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            async with httpx.AsyncClient(timeout=10) as client:
                answer = await client.get(self.issuer + "/.well-known/openid-configuration")
                answer.raise_for_status()
                found = answer.json()
            if found.get("issuer", "").rstrip("/") != self.issuer:
                raise Refused("the discovery document names another issuer")
            self._metadata = found
        return self._metadata

    async def keys(self, refresh: bool = False) -> KeySet:
        # Read again for an unknown key id (the issuer rotated), at most every 30 s.
        if self._keys is None or (refresh and time.monotonic() - self._fetched_keys_at > 30):
            async with httpx.AsyncClient(timeout=10) as client:
                answer = await client.get((await self.metadata())["jwks_uri"])
                answer.raise_for_status()
            self._keys = KeySet.import_key_set(answer.json())
            self._fetched_keys_at = time.monotonic()
        return self._keys

    async def begin(self, signing_key: bytes, next_path: str = "/") -> tuple[str, str]:
        """The issuer's authorization URL, and the signed flow cookie that carries its
        state, nonce and PKCE verifier to the callback, and the page to go to after it."""
        state, nonce, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48)
        url = prepare_grant_uri(
            (await self.metadata())["authorization_endpoint"],
            self.client_id,
            "code",
            redirect_uri=self.redirect_url,
            scope=self.scope,
            state=state,
            nonce=nonce,
            code_challenge=create_s256_code_challenge(verifier),
            code_challenge_method="S256",
        )
        flow = json.dumps(
            {"s": state, "n": nonce, "v": verifier, "e": int(time.time()) + FLOW_SECONDS, "r": next_path}
        ).encode()
        mac = hmac.new(signing_key, b"oidc\0" + flow, hashlib.sha256).digest()
        return url, f"{_b64(flow)}.{_b64(mac)}"

    async def finish(self, signing_key: bytes, flow_cookie: str | None, code: str, state: str) -> dict[str, Any]:
        """The verified ID token's claims, or Refused."""
        flow = read_flow(signing_key, flow_cookie)
        if not hmac.compare_digest(flow["s"], state):
            raise Refused("the state does not match this browser's login")
        metadata = await self.metadata()
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                answer = await client.post(
                    metadata["token_endpoint"],
                    data={
                        "grant_type": "authorization_code",
                        "code": code,
                        "redirect_uri": self.redirect_url,
                        "code_verifier": flow["v"],
                    },
                    auth=(self.client_id, self.client_secret),  # client_secret_basic
                    headers={"Accept": "application/json"},
                )
            token = answer.json()
            if answer.status_code != 200 or not isinstance(token, dict):
                raise Refused(f"the token endpoint answered {answer.status_code}")
        except Refused:
            raise
        except Exception as error:  # the issuer unreachable, or answered nonsense
            raise Refused(f"the token endpoint refused the code ({type(error).__name__})") from None
        id_token = token.get("id_token")
        if not isinstance(id_token, str):
            raise Refused("the token endpoint answered no ID token")
        return await self.verify(id_token, flow["n"])

    async def verify(self, id_token: str, nonce: str) -> dict[str, Any]:
        """Signature (the issuer's keys), issuer, audience, expiry and nonce: each must hold."""
        try:
            try:
                decoded = jwt.decode(id_token, await self.keys(), algorithms=ALGORITHMS)
            except ValueError:  # no key with its key id: the issuer may have rotated its keys
                decoded = jwt.decode(id_token, await self.keys(refresh=True), algorithms=ALGORITHMS)
            jwt.JWTClaimsRegistry(
                leeway=30,
                iss={"essential": True, "value": self.issuer},
                aud={"essential": True, "value": self.client_id},
                exp={"essential": True},
                iat={"essential": True},
                sub={"essential": True},
                nonce={"essential": True, "value": nonce},
            ).validate(decoded.claims)
        except (JoseError, ValueError) as error:
            raise Refused(f"the ID token was refused ({type(error).__name__}: {error_text(error)})") from None
        return dict(decoded.claims)

    def principal(self, claims: dict[str, Any]) -> str:
        value = claims.get(self.principal_claim)
        if not isinstance(value, str) or not value:
            raise Refused(f"the ID token has no {self.principal_claim!r} claim")
        return value

    def groups(self, claims: dict[str, Any]) -> tuple[str, ...]:
        value = claims.get(self.groups_claim) if self.groups_claim else None
        if isinstance(value, str):
            value = [value]
        return tuple(str(g) for g in value or () if isinstance(g, str))[:64]


def error_text(error: Exception) -> str:
    # joserfc's messages name claims and reasons, never the token; short anyway.
    return str(getattr(error, "description", "") or error)[:200]


def page_after_login(next_path: str | None) -> str:
    """Where the browser goes after the callback: a path on this gateway, never another
    site (`//host`, `/\\host` and `https://host` are other sites to a browser): else "/"."""
    path = next_path or "/"
    if (
        not path.startswith("/")
        or path.startswith(("//", "/\\"))
        or len(path) > 512
        or any(ord(c) < 0x21 or c == "\\" for c in path)
    ):
        return "/"
    return path


def read_flow(signing_key: bytes, cookie: str | None) -> dict[str, Any]:
    if not cookie or cookie.count(".") != 1 or len(cookie) > 2048:
        raise Refused("no login in progress in this browser")
    flow_text, mac_text = cookie.split(".")
    try:
        flow, mac = _unb64(flow_text), _unb64(mac_text)
    except ValueError:
        raise Refused("the login cookie is malformed") from None
    if not hmac.compare_digest(mac, hmac.new(signing_key, b"oidc\0" + flow, hashlib.sha256).digest()):
        raise Refused("the login cookie is not ours")
    data = json.loads(flow)
    if data["e"] < time.time():
        raise Refused("the login took too long; start again")
    return data


def login_answer(gateway, user, groups: tuple[str, ...], next_path: str) -> RedirectResponse:
    cookie, _session = gateway.sessions.issue(user.name, user.credential, groups=groups)
    # 303: the browser GETs the page; the cookie is set on the way.
    answer = RedirectResponse(page_after_login(next_path), status_code=303)
    answer.set_cookie(
        COOKIE,
        cookie,
        max_age=int(gateway.settings.gateway_session_seconds),
        httponly=True,
        secure=True,
        samesite="strict",
        path="/",
    )
    return answer


def configured(request: Request) -> OpenIDConnect:
    oidc = gateway_of(request).oidc
    if oidc is None:
        raise Problem(404, "not-found", "OpenID Connect is not configured")
    return oidc


@router.get("/v1/login/oidc", status_code=302, responses=PROBLEMS, tags=["login"])
async def oidc_login(request: Request, next: Annotated[str, Query(alias="next", max_length=512)] = "/") -> Any:
    """Log in with the configured OpenID Connect issuer (authorization code + PKCE):
    redirects to the issuer, which comes back to the callback, which sends the browser
    on to `next` (a path on this gateway; default `/`, a page naming who is logged in)."""
    gateway = gateway_of(request)
    url, flow = await configured(request).begin(gateway.sessions.key, page_after_login(next))
    answer = RedirectResponse(url, status_code=302)
    # Lax, not Strict: the issuer's redirect back to the callback is a cross-site navigation.
    answer.set_cookie(
        FLOW_COOKIE, flow, max_age=FLOW_SECONDS, httponly=True, secure=True, samesite="lax", path="/v1/login/oidc"
    )
    return answer


@router.get(
    "/v1/login/oidc/callback",
    status_code=303,
    response_class=RedirectResponse,
    responses={**PROBLEMS, 303: {"description": "Logged in: the session cookie, and on to the page"}},
    tags=["login"],
)
async def oidc_callback(
    request: Request,
    code: Annotated[str, Query(min_length=1, max_length=4096)],
    state: Annotated[str, Query(min_length=1, max_length=512)],
) -> Any:
    """Where the issuer sends the browser back: the code exchanged, the ID token
    verified, the person in the principal claim logged in (a session cookie), and the
    browser sent on (303) to the page it started from (`next`), not shown JSON."""
    gateway = gateway_of(request)
    oidc = configured(request)
    try:
        claims = await oidc.finish(gateway.sessions.key, request.cookies.get(FLOW_COOKIE), code, state)
        name = oidc.principal(claims)
        user = gateway.users.current().users.get(name)
        if user is None or user.password_hash:
            raise Refused(f"the {oidc.principal_claim!r} claim names no user added with --oidc")
    except Refused as refused:
        log.info("OpenID Connect login refused: %s", refused)
        raise Problem(401, "oidc-refused", "OpenID Connect login refused", str(refused)) from None
    next_path = read_flow(gateway.sessions.key, request.cookies.get(FLOW_COOKIE)).get("r", "/")
    answer = login_answer(gateway, user, oidc.groups(claims), next_path)
    answer.delete_cookie(FLOW_COOKIE, path="/v1/login/oidc", secure=True, httponly=True, samesite="lax")
    log.info("%s logged in through OpenID Connect", user.name)
    return answer
