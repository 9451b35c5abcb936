"""Who is asking: session cookies, CSRF tokens, the login rate limit and the limit on
failed bearer tokens.

A session is a signed cookie (HMAC-SHA256 with the gateway's session key, shared by
its replicas): the principal, the credential it logged in with, when it ends, and a
random session id. No replica keeps sessions in memory, so any replica serves any
request. A login holds (`Logins`) while its session has not ended early (a logout:
on record in the ledger's database, `shared/ledger/gateway_logins.py`, which every
replica reads; Redis only caches it) and its credential is still the person's (a
password reset or a re-add of a removed name makes a new one, `users.add`) or its
program's token is still there (`signoff token revoke`). Event streams already open
are checked again every `CHECK_SECONDS` against the files and the clock, and against the
ledger's ended logins, all of a replica's in one read (`OpenStreams`), when a logout's
NOTIFY says so (PostgreSQL; every check on SQLite), and end when their login does.

CSRF: every request that changes state carries `X-CSRF-Token`, an HMAC of the
session id (the token login answers with; `GET /v1/me` shows it again), and, when a
browser sends one, an `Origin` that is the gateway's own. The cookie is also
`SameSite=Strict`, `HttpOnly` and `Secure`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from .users import LiveUsers, User

if TYPE_CHECKING:
    from shared.ledger.gateway_logins import EndedLogins

    from .programs import LiveTokens

log = logging.getLogger("signoff.gateway")

COOKIE = "signoff_session"
CSRF_HEADER = "x-csrf-token"
# How often a replica checks again the logins of its open event streams: a stream ends
# within a second of its login (one read of the ended logins per check, for all of them).
CHECK_SECONDS = 0.25
# With NOTIFY heard, the ledger's ended logins are still read this often: a backstop.
BACKSTOP_SECONDS = 5.0
# A program's login: its session id names the token (`token:<name>`), its credential is the token's hash.
PROGRAM_SESSION = "token:"


@dataclass(frozen=True)
class Login:
    principal: str
    session_id: str
    expires_at: float
    # Groups an OpenID Connect login's groups claim named (shown, not used for approval rights).
    groups: tuple[str, ...] = ()
    # The credential it was made with (`User.credential`; a program's: its token's hash).
    credential: str = ""


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

    def issue(
        self, principal: str, credential: str, now: float | None = None, groups: tuple[str, ...] = ()
    ) -> tuple[str, Login]:
        login = Login(principal, secrets.token_urlsafe(18), (now or time.time()) + self.lifetime, groups, credential)
        fields: dict = {"p": login.principal, "s": login.session_id, "e": int(login.expires_at), "c": credential}
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
            groups = tuple(map(str, data.get("g", ())))
            login = Login(str(data["p"]), str(data["s"]), float(data["e"]), groups, str(data.get("c", "")))
        except (ValueError, KeyError, TypeError):
            return None
        if login.expires_at <= (now or time.time()):
            return None
        return login

    def csrf_token(self, login: Login) -> str:
        return self._mac(b"csrf", login.session_id.encode())

    def csrf_ok(self, login: Login, token: str | None) -> bool:
        # As bytes: `compare_digest` refuses a str with a letter outside ASCII (a TypeError, a 500).
        sent = str(token or "").encode("utf-8", "replace")
        return bool(sent) and hmac.compare_digest(sent, self.csrf_token(login).encode())


class RedisState:
    """The state the replicas share, in Redis under `<namespace>:gateway:`: failed
    login attempts per user and per address (each a counter that expires with its
    window), and a cache of the sessions ended before their time (`Logins`: the
    database holds the record)."""

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


class Logins:
    """Whether a login still holds, on every replica: its session not ended early (the
    ledger's record; Redis in front of it, never instead of it) and its credential
    still the one it was made with."""

    def __init__(
        self, users: LiveUsers, tokens: LiveTokens | None, record: EndedLogins, cache: RedisState | None
    ) -> None:
        self.users = users
        self.tokens = tokens
        self.record = record
        self.cache = cache
        self.streams = OpenStreams(self)

    async def end(self, login: Login) -> None:
        """A logout: on record first (the truth every replica reads), then in the cache."""
        await self.record.end(login.session_id, login.principal, login.expires_at)
        if self.cache is not None:
            try:
                await self.cache.end(login)
            except Exception as error:  # the record holds the end; the cache only speeds refusals
                log.warning("redis unavailable to cache a logout (%r); the ledger's record holds it", error)

    async def ended(self, login: Login) -> bool:
        if self.cache is not None:
            try:
                if await self.cache.ended(login):
                    return True
            except Exception as error:
                log.warning("redis unavailable for ended sessions (%r); the ledger's record decides", error)
        return await self.record.ended(login.session_id)

    def credential_holds(self, login: Login, now: float | None = None) -> User | None:
        """The user (for a program: one standing for it) the login is of, while it has not
        expired and its credential is still theirs: None once removed, reset or revoked."""
        if login.expires_at <= (now or time.time()):
            return None
        if login.session_id.startswith(PROGRAM_SESSION):
            program = self.tokens.holding(login.credential, now) if self.tokens is not None else None
            if program is None or program.principal != login.principal:
                return None
            return User(program.principal, "", (), False)
        user = self.users.current().users.get(login.principal)
        if user is None or not hmac.compare_digest(user.credential.encode(), login.credential.encode()):
            return None
        return user

    async def person(self, login: Login) -> User | None:
        """The user a session cookie's login is of, while it holds; None: ended, or the
        credential it was made with is gone."""
        user = self.credential_holds(login)
        if user is None or await self.ended(login):
            return None
        return user


class OpenStreams:
    """The logins of a replica's open event streams, checked again every `CHECK_SECONDS`
    while any is open: the users and tokens files as they are now, and one read of the
    ledger's ended logins for all of them. A stream's event is set when its login ends
    (a logout on any replica, a removed user, a reset credential, a revoked token, its
    time up), or when the check itself fails: the client resumes with Last-Event-ID and
    is checked again at its request."""

    def __init__(self, logins: Logins) -> None:
        self.logins = logins
        self.open: dict[int, tuple[Login, asyncio.Event]] = {}
        self._task: asyncio.Task | None = None
        # Set by the ledger watcher on a logout's NOTIFY, and when its LISTEN connection
        # (re)starts (what ended while it was away is read then).
        self.wake = asyncio.Event()
        # Whether that NOTIFY can be heard (the watcher's LISTEN connection is up).
        self.listening: Callable[[], bool] = lambda: False
        self._read_at = 0.0

    @contextlib.contextmanager
    def watching(self, login: Login) -> Iterator[asyncio.Event]:
        ended = asyncio.Event()
        key = id(ended)
        self.open[key] = (login, ended)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="gateway stream logins")
        try:
            yield ended
        finally:
            self.open.pop(key, None)

    async def _run(self) -> None:
        while self.open:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), CHECK_SECONDS)
            woken = self.wake.is_set()
            self.wake.clear()
            # The ledger's ended logins are read when a logout notified (or NOTIFY cannot be
            # heard, or now and then as a backstop); the credentials, which live in this
            # replica's files and clock, every check.
            read = woken or not self.listening() or time.monotonic() - self._read_at >= BACKSTOP_SECONDS
            await self.check(read_ledger=read)

    async def check(self, read_ledger: bool = True) -> None:
        watched = list(self.open.values())
        try:
            ended: set[str] = set()
            if read_ledger:
                self._read_at = time.monotonic()
                sessions = [
                    login.session_id for login, _ in watched if not login.session_id.startswith(PROGRAM_SESSION)
                ]
                ended = await self.logins.record.ended_among(sessions)
        except Exception as error:
            log.warning("cannot check the open streams' logins (%r); ending those streams", error)
            ended = {login.session_id for login, _ in watched}
        for login, event in watched:
            if login.session_id in ended or self.logins.credential_holds(login) is None:
                event.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


def user_key(name: str) -> str:
    # Hashed: a name as typed (any length, any bytes) never becomes a Redis key as is.
    return "user:" + hashlib.sha256(name.encode()).hexdigest()[:32]


def address_key(address: str) -> str:
    return "address:" + hashlib.sha256(address.encode()).hexdigest()[:32]
