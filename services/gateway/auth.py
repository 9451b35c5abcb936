"""Who is asking: session cookies, CSRF tokens, the login rate limit and the limit on
failed bearer tokens.

A session is a signed cookie (HMAC-SHA256 with the gateway's session key, shared by
its replicas): the principal, when it ends, and a random session id. No replica
keeps sessions in memory, so any replica serves any request; one that ended early
(logout) is marked in Redis until it would have expired anyway.

CSRF: every request that changes state carries `X-CSRF-Token`, an HMAC of the
session id (the token login answers with; `GET /v1/me` shows it again), and, when a
browser sends one, an `Origin` that is the gateway's own. The cookie is also
`SameSite=Strict`, `HttpOnly` and `Secure`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from redis.asyncio import Redis

COOKIE = "signoff_session"
CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True)
class Login:
    principal: str
    session_id: str
    expires_at: float
    # Groups an OpenID Connect login's groups claim named (shown, not used for approval rights).
    groups: tuple[str, ...] = ()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    def __init__(self, key: bytes, lifetime: float) -> None:
        self.key = key
        self.lifetime = lifetime

    def _mac(self, purpose: bytes, payload: bytes) -> str:
        return _b64(hmac.new(self.key, purpose + b"\0" + payload, hashlib.sha256).digest())

    def issue(self, principal: str, now: float | None = None, groups: tuple[str, ...] = ()) -> tuple[str, Login]:
        login = Login(principal, secrets.token_urlsafe(18), (now or time.time()) + self.lifetime, groups)
        fields: dict = {"p": login.principal, "s": login.session_id, "e": int(login.expires_at)}
        if groups:
            fields["g"] = list(groups)
        payload = json.dumps(fields).encode()
        return f"{_b64(payload)}.{self._mac(b'session', payload)}", login

    def read(self, cookie: str | None, now: float | None = None) -> Login | None:
        """The login a cookie proves, or None: not ours, altered, or expired."""
        if not cookie or cookie.count(".") != 1 or len(cookie) > 1024:
            return None
        payload_text, mac = cookie.split(".")
        try:
            payload = _unb64(payload_text)
        except ValueError:
            return None
        if not hmac.compare_digest(mac, self._mac(b"session", payload)):
            return None
        try:
            data = json.loads(payload)
            login = Login(str(data["p"]), str(data["s"]), float(data["e"]), tuple(map(str, data.get("g", ()))))
        except (ValueError, KeyError, TypeError):
            return None
        if login.expires_at <= (now or time.time()):
            return None
        return login

    def csrf_token(self, login: Login) -> str:
        return self._mac(b"csrf", login.session_id.encode())

    def csrf_ok(self, login: Login, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(str(token), self.csrf_token(login))


class RedisState:
    """The state the replicas share, in Redis under `<namespace>:gateway:`: failed
    login attempts per user and per address (each a counter that expires with its
    window), and sessions ended before their time."""

    def __init__(self, redis: Redis, namespace: str) -> None:
        self.redis = redis
        self.prefix = f"{namespace}:gateway:"

    async def attempt(self, key: str, limit: int, window: float) -> tuple[bool, float]:
        """Count one attempt against `key`: (allowed, seconds until the window ends).
        Counted before the password is checked, so concurrent attempts on several
        replicas cannot all slip under the limit; a success gives its count back."""
        name = self.prefix + "login:" + key
        count = await self.redis.incr(name)
        if count == 1:
            await self.redis.pexpire(name, int(window * 1000))
        ttl = await self.redis.pttl(name)
        if ttl < 0:  # a counter left without expiry (a crash between the two calls)
            await self.redis.pexpire(name, int(window * 1000))
            ttl = int(window * 1000)
        return count <= limit, ttl / 1000

    async def give_back(self, key: str) -> None:
        await self.redis.decr(self.prefix + "login:" + key)

    async def limited(self, key: str, limit: int) -> float:
        """Whether `key` has failed `limit` times in its window: the seconds left of it, or 0."""
        name = self.prefix + "failed:" + key
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(name)
        pipe.pttl(name)
        count, ttl = await pipe.execute()
        return max(ttl, 1000) / 1000 if count is not None and int(count) >= limit else 0.0

    async def failed(self, key: str, window: float) -> None:
        """One more failure against `key`; the count expires with its window."""
        name = self.prefix + "failed:" + key
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(name)
        pipe.pttl(name)
        count, ttl = await pipe.execute()
        if count == 1 or ttl < 0:
            await self.redis.pexpire(name, int(window * 1000))

    async def end(self, login: Login) -> None:
        ttl = max(1, int((login.expires_at - time.time()) * 1000))
        await self.redis.set(self.prefix + "ended:" + login.session_id, "1", px=ttl)

    async def ended(self, login: Login) -> bool:
        return bool(await self.redis.exists(self.prefix + "ended:" + login.session_id))


def user_key(name: str) -> str:
    # Hashed: a name as typed (any length, any bytes) never becomes a Redis key as is.
    return "user:" + hashlib.sha256(name.encode()).hexdigest()[:32]


def address_key(address: str) -> str:
    return "address:" + hashlib.sha256(address.encode()).hexdigest()[:32]
