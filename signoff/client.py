"""The gateway's HTTP API from Python: `Client` (blocking) and `AsyncClient` (asyncio),
the same methods on both, over httpx.

    from signoff import Client

    with Client("http://127.0.0.1:8080", "alice", "correct horse battery staple") as signoff:
        started = signoff.start_session("Post the release notes")
        for card in signoff.pending():
            signoff.approve(card)
        for event in signoff.events():
            ...

Login is the gateway's users-file login (`signoff user add`): `POST /v1/login` answers
a session cookie and a CSRF token; the client sends the cookie on every request and
the token on every request that changes something. It logs in when first needed, and
again when its session has ended (401), with the name and password it was given.

A decision carries an `Idempotency-Key` (a fresh one per call unless given): the
gateway answers the same key with the same outcome and sends nothing twice, so the
client retries a decision whose answer it never got (a dropped connection, a gateway
replica gone) with the same key, and a caller may retry a whole `approve` with the key
it passed. Other calls are not retried: starting a turn twice would start two turns.

`events(since=…)` follows `GET /v1/events` (Server-Sent Events) and reconnects by
itself, resuming with `Last-Event-ID` right after the last event it yielded: a
gateway restart or a failover to another replica loses and repeats nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel

from .models import (
    Cancelled,
    Card,
    Cards,
    Event,
    Grants,
    GrantShown,
    Me,
    Pending,
    ProblemDocument,
    Revoking,
    SessionShown,
    Started,
    Verdict,
)

COOKIE = "signoff_session"
CSRF_HEADER = "X-CSRF-Token"
# Statuses a gateway may answer while it (or the replica behind the address) is unavailable:
# a decision is sent again with its key, a stream reconnects.
UNAVAILABLE = {502, 503, 504}
# The events that end a turn.
TURN_ENDED = ("turn.completed", "turn.failed", "turn.cancelled")
ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

Model = TypeVar("Model", bound=BaseModel)


class SignoffError(Exception):
    """Anything the SDK could not do."""


class ProblemError(SignoffError):
    """The gateway answered an RFC 9457 problem: `status`, `kind` (the last part of its
    `type`, e.g. `not-found`, `csrf`), and the document itself in `problem`."""

    def __init__(self, status: int, problem: ProblemDocument) -> None:
        self.status = status
        self.problem = problem
        super().__init__(
            f"{status} {problem.type}: {problem.title}" + (f" ({problem.detail})" if problem.detail else "")
        )

    @property
    def kind(self) -> str:
        return self.problem.type.rsplit(":", 1)[-1]

    @property
    def reason_code(self) -> str | None:
        """The ledger's reason code when it refused a decision (`not_an_approver`, `already_decided`, …)."""
        return self.problem.reason_code


class Refused(ProblemError):
    """The ledger refused a decision; `reason_code` says why."""


class Unauthenticated(ProblemError):
    """No valid login: wrong name or password, or a session that ended and no password to log in again."""


class DecisionPending(SignoffError):
    """The decision was sent but the ledger had not committed its verdict in time.
    Calling `approve`/`deny` again with `pending.idempotency_key` sends nothing new and
    answers the verdict once it is there."""

    def __init__(self, pending: Pending, idempotency_key: str) -> None:
        self.pending = pending
        self.idempotency_key = idempotency_key
        super().__init__(f"no verdict yet on {pending.request_id} (poll {pending.links.get('poll')})")


# --- what both clients share: the requests, their answers, the login ---------------------


@dataclass
class Call:
    """One HTTP request to the gateway, independent of how it is sent."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # It changes state: it carries the CSRF token.
    changes: bool = False
    # Safe to send again when no answer came (reads, and decisions with their key).
    retry: bool = False


@dataclass
class Login:
    name: str | None
    password: str | None
    token: str | None
    cookie: str | None = None
    csrf: str | None = None
    me: Me | None = None

    @property
    def can_log_in(self) -> bool:
        return self.name is not None and self.password is not None

    def headers(self, call: Call) -> dict[str, str]:
        headers = dict(call.headers)
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        elif self.cookie is not None:
            # Sent by hand: the cookie is `Secure`, which httpx's jar keeps to https, and a
            # gateway reached over loopback http must still get it.
            headers["Cookie"] = f"{COOKIE}={self.cookie}"
            if call.changes and self.csrf:
                headers[CSRF_HEADER] = self.csrf
        return headers

    def accept(self, answer: httpx.Response) -> Me:
        me = parse(answer, Me)
        cookie = answer.cookies.get(COOKIE) or _set_cookie(answer)
        if cookie is None:
            raise SignoffError("the gateway answered the login without a session cookie")
        self.cookie, self.csrf, self.me = cookie, me.csrf_token, me
        return me

    def forget(self) -> None:
        self.cookie = self.csrf = None
        self.me = None


def _set_cookie(answer: httpx.Response) -> str | None:
    for header in answer.headers.get_list("set-cookie"):
        name, _, rest = header.partition("=")
        if name.strip() == COOKIE:
            return rest.split(";", 1)[0]
    return None


def problem_of(answer: httpx.Response) -> ProblemError:
    try:
        document = ProblemDocument.model_validate(answer.json())
    except ValueError:
        document = ProblemDocument(type="about:blank", title=answer.reason_phrase or "error", status=answer.status_code)
    error_type: type[ProblemError] = ProblemError
    if answer.status_code == 401:
        error_type = Unauthenticated
    elif document.reason_code:
        error_type = Refused
    return error_type(answer.status_code, document)


def parse(answer: httpx.Response, model: type[Model]) -> Model:
    if answer.status_code >= 400:
        raise problem_of(answer)
    return model.model_validate(answer.json())


def decision_call(
    request: str | Card,
    decision: Literal["approve", "deny", "respond"],
    reason: str,
    message: str,
    args_digest: str | None,
    idempotency_key: str,
) -> Call:
    request_id = request.id if isinstance(request, Card) else request
    if args_digest is None and isinstance(request, Card):
        # The digest of the card that was read: the ledger refuses the approval if the
        # request's arguments are not the ones on that card.
        args_digest = request.args_digest
    body: dict[str, Any] = {"decision": decision, "reason": reason, "message": message}
    if args_digest is not None:
        body["args_digest"] = args_digest
    return Call(
        "POST",
        f"/v1/requests/{request_id}/decision",
        json=body,
        headers={"Idempotency-Key": idempotency_key},
        changes=True,
        retry=True,
    )


def verdict_of(answer: httpx.Response) -> Verdict | Pending:
    if answer.status_code == 202:
        return parse(answer, Pending)
    return parse(answer, Verdict)


def new_key() -> str:
    return secrets.token_urlsafe(24)


class EventParser:
    """Server-Sent Events, line by line (the WHATWG rules the gateway's stream uses):
    fields until a blank line, comments (heartbeats) ignored."""

    def __init__(self) -> None:
        self.id: str | None = None
        # The id of the last block ended, with or without data (`since=now` begins with an
        # id alone): where a reconnect resumes.
        self.last_id: str | None = None
        self.type = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> Event | None:
        if line == "":
            event = None
            self.last_id = self.id
            if self.data and self.id is not None:
                event = Event(id=self.id, type=self.type, data=json.loads("\n".join(self.data)))
            self.type, self.data = "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            self.id = value
        elif name == "event":
            self.type = value
        elif name == "data":
            self.data.append(value)
        return None


class Backoff:
    def __init__(self, first: float, most: float) -> None:
        self.first, self.most, self.next = first, most, first

    def __call__(self) -> float:
        wait, self.next = self.next, min(self.next * 2, self.most)
        return wait

    def reset(self) -> None:
        self.next = self.first


def _timeout(timeout: float, heartbeat_timeout: float) -> tuple[httpx.Timeout, httpx.Timeout]:
    # A stream waits longer for its next line than a call for its answer: the gateway
    # sends a heartbeat only every 15 s by default; silence beyond `heartbeat_timeout` is a dead connection.
    return httpx.Timeout(timeout), httpx.Timeout(timeout, read=heartbeat_timeout)


def _path(template: str, *ids: str) -> str:
    # An id goes into the path as it is: one that is not an id must not become another path.
    for value in ids:
        if not ID.fullmatch(value):
            raise ValueError(f"not an id: {value!r}")
    return template.format(*ids)


def _read_until(timeout: httpx.Timeout, until: float | None) -> httpx.Timeout:
    # Waiting `until` a time: no read waits past it (the heartbeats may be 15 s apart).
    if until is None or timeout.read is None:
        return timeout
    return httpx.Timeout(timeout.connect, read=max(0.05, min(timeout.read, until - time.monotonic())))


# --- the blocking client ---------------------------------------------------------------------


class Client:
    """The gateway's API, blocking. `url` is the gateway's address; `name` and `password`
    a login of its users file (`signoff user add`); or `token`, an API token, sent as a
    bearer token (for a gateway that issues them)."""

    def __init__(
        self,
        url: str,
        name: str | None = None,
        password: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        heartbeat_timeout: float = 60.0,
        decision_wait: float = 60.0,
        attempts: int = 4,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._login = Login(name, password, token)
        self._timeout, self._stream_timeout = _timeout(timeout, heartbeat_timeout)
        self._http = httpx.Client(base_url=url, timeout=self._timeout, transport=transport)
        self.decision_wait = decision_wait
        self.attempts = attempts

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- login ---

    def login(self, name: str | None = None, password: str | None = None) -> Me:
        """Log in (again): with these, or the name and password the client was made with."""
        if name is not None:
            self._login.name, self._login.password = name, password
        if not self._login.can_log_in:
            raise SignoffError("no name and password to log in with")
        answer = self._http.post("/v1/login", json={"name": self._login.name, "password": self._login.password})
        return self._login.accept(answer)

    def logout(self) -> None:
        answer = self._send(Call("POST", "/v1/logout", changes=True))
        if answer.status_code >= 400:
            raise problem_of(answer)
        self._login.forget()

    def me(self) -> Me:
        return parse(self._send(Call("GET", "/v1/me", retry=True)), Me)

    # --- sessions ---

    def start_session(
        self,
        text: str,
        *,
        session_id: str | None = None,
        provider: str | None = None,
        idempotency_key: str | None = None,
    ) -> Started:
        """Start a turn: in a new session, or in `session_id` (a new one, or one the caller
        started). With `idempotency_key`, sending it again is answered with the turn it
        started (`repeated`), so it is retried when no answer came."""
        return parse(self._send(start_call(text, session_id, provider, idempotency_key)), Started)

    def session(self, session_id: str) -> SessionShown:
        return parse(self._send(Call("GET", _path("/v1/sessions/{}", session_id), retry=True)), SessionShown)

    def cancel(self, session_id: str, reason: str = "") -> Cancelled:
        call = Call("POST", _path("/v1/sessions/{}/cancel", session_id), json={"reason": reason}, changes=True)
        return parse(self._send(call), Cancelled)

    def grants(self, session_id: str) -> list[GrantShown]:
        """The session's remembered approvals, live or not."""
        return parse(self._send(Call("GET", _path("/v1/sessions/{}/grants", session_id), retry=True)), Grants).grants

    def revoke_grant(self, grant_id: str, reason: str = "") -> Revoking:
        """Revoke a remembered approval (the ledger judges whether the caller may)."""
        call = Call("POST", _path("/v1/grants/{}/revoke", grant_id), json={"reason": reason}, changes=True)
        return parse(self._send(call), Revoking)

    def wait_for_turn(self, session_id: str, *, since: str | None = None, timeout: float | None = None) -> Event:
        """The event that ends the session's next turn (completed, failed or cancelled),
        read from the event stream from `since` (its start when None)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for event in self.events(since=since, until=deadline):
            if event.session_id == session_id and event.type in TURN_ENDED:
                return event
        raise TimeoutError(f"session {session_id}: no turn ended within {timeout} s")

    # --- requests ---

    def requests(
        self,
        *,
        status: str | None = None,
        tool: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
    ) -> list[Card]:
        """The cards the caller may see: those they may approve and those of sessions they
        started, oldest first: the first page of at most `limit` (`requests_page` pages on)."""
        return self.requests_page(status=status, tool=tool, session_id=session_id, limit=limit).requests

    def requests_page(
        self,
        *,
        status: str | None = None,
        tool: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Cards:
        """One page of `requests`; its `next` is the `cursor` of the page after (None: the last)."""
        params = {"status": status, "tool": tool, "session_id": session_id, "limit": limit, "cursor": cursor}
        call = Call("GET", "/v1/requests", params={k: v for k, v in params.items() if v is not None}, retry=True)
        return parse(self._send(call), Cards)

    def pending(self, *, tool: str | None = None, session_id: str | None = None, limit: int = 100) -> list[Card]:
        """The pending cards the caller may see."""
        return self.requests(status="pending", tool=tool, session_id=session_id, limit=limit)

    def request(self, request_id: str) -> Card:
        return parse(self._send(Call("GET", _path("/v1/requests/{}", request_id), retry=True)), Card)

    def approve(
        self,
        request: str | Card,
        *,
        message: str = "",
        args_digest: str | None = None,
        idempotency_key: str | None = None,
    ) -> Verdict:
        """Approve, as the logged-in person. Given a `Card`, the approval names its digest:
        the ledger refuses it if the request's arguments are not the ones on the card.
        Raises `Refused` (with the ledger's `reason_code`) when the ledger refuses it."""
        return self._decide(decision_call(request, "approve", "", message, args_digest, idempotency_key or new_key()))

    def deny(self, request: str | Card, *, reason: str = "", idempotency_key: str | None = None) -> Verdict:
        return self._decide(decision_call(request, "deny", reason, "", None, idempotency_key or new_key()))

    def respond(self, request: str | Card, message: str, *, idempotency_key: str | None = None) -> Verdict:
        """Answer in the tool's place: the call does not run, and the model reads `message` as its result."""
        return self._decide(decision_call(request, "respond", "", message, None, idempotency_key or new_key()))

    def _decide(self, call: Call) -> Verdict:
        answer = verdict_of(self._send(call))
        deadline = time.monotonic() + self.decision_wait
        backoff = Backoff(0.2, 2.0)
        while isinstance(answer, Pending):
            if time.monotonic() >= deadline:
                raise DecisionPending(answer, call.headers["Idempotency-Key"])
            time.sleep(backoff())
            answer = verdict_of(self._send(Call("GET", answer.links["poll"], retry=True)))
        return answer

    # --- events ---

    def events(self, since: str | None = None, *, until: float | None = None) -> Iterator[Event]:
        """Every event the caller may see, after the event id `since` (from the start when
        None; `"now"`: only what is committed from now on), for ever (or until the
        monotonic time `until`); reconnects by itself and resumes after the last event
        yielded."""
        last = since
        backoff = Backoff(0.1, 5.0)
        parser = EventParser()
        while until is None or time.monotonic() < until:
            headers = {"Accept": "text/event-stream"}
            if last is not None and last != "now":
                headers["Last-Event-ID"] = last
            call = Call("GET", "/v1/events", headers=headers)
            params = {"since": "now"} if last == "now" else None
            try:
                with self._http.stream(
                    "GET",
                    call.path,
                    params=params,
                    headers=self._login_headers(call),
                    timeout=_read_until(self._stream_timeout, until),
                ) as answer:
                    if answer.status_code == 401 and self._login.can_log_in:
                        self.login()
                        continue
                    if answer.status_code >= 400 and answer.status_code not in UNAVAILABLE:
                        answer.read()
                        raise problem_of(answer)
                    if answer.status_code == 200:
                        backoff.reset()
                        parser = EventParser()
                        for line in answer.iter_lines():
                            event = parser.feed(line)
                            if line == "" and parser.last_id is not None:
                                last = parser.last_id
                            if event is not None:
                                yield event
                            if until is not None and time.monotonic() >= until:
                                return
            except httpx.TransportError:
                pass  # the connection dropped: reconnect from `last`
            time.sleep(backoff())

    # --- sending ---

    def _login_headers(self, call: Call) -> dict[str, str]:
        if self._login.token is None and self._login.cookie is None and self._login.can_log_in:
            self.login()
        return self._login.headers(call)

    def _send(self, call: Call) -> httpx.Response:
        backoff = Backoff(0.2, 3.0)
        logged_in_again = False
        attempt = 0
        while True:
            attempt += 1
            try:
                answer = self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=self._login_headers(call)
                )
            except httpx.TransportError:
                if not call.retry or attempt >= self.attempts:
                    raise
                time.sleep(backoff())
                continue
            if answer.status_code == 401 and self._login.can_log_in and not logged_in_again:
                # The session ended (expired, logged out elsewhere): log in again, once.
                logged_in_again = True
                self.login()
                continue
            if answer.status_code in UNAVAILABLE and call.retry and attempt < self.attempts:
                time.sleep(backoff())
                continue
            return answer


# --- the asyncio client ------------------------------------------------------------------------


class AsyncClient:
    """`Client`'s methods, awaited (`async with AsyncClient(...) as signoff`)."""

    def __init__(
        self,
        url: str,
        name: str | None = None,
        password: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        heartbeat_timeout: float = 60.0,
        decision_wait: float = 60.0,
        attempts: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._login = Login(name, password, token)
        self._timeout, self._stream_timeout = _timeout(timeout, heartbeat_timeout)
        self._http = httpx.AsyncClient(base_url=url, timeout=self._timeout, transport=transport)
        self.decision_wait = decision_wait
        self.attempts = attempts
        self._logging_in = asyncio.Lock()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- login ---

    async def login(self, name: str | None = None, password: str | None = None) -> Me:
        if name is not None:
            self._login.name, self._login.password = name, password
        if not self._login.can_log_in:
            raise SignoffError("no name and password to log in with")
        answer = await self._http.post("/v1/login", json={"name": self._login.name, "password": self._login.password})
        return self._login.accept(answer)

    async def logout(self) -> None:
        answer = await self._send(Call("POST", "/v1/logout", changes=True))
        if answer.status_code >= 400:
            raise problem_of(answer)
        self._login.forget()

    async def me(self) -> Me:
        return parse(await self._send(Call("GET", "/v1/me", retry=True)), Me)

    # --- sessions ---

    async def start_session(
        self,
        text: str,
        *,
        session_id: str | None = None,
        provider: str | None = None,
        idempotency_key: str | None = None,
    ) -> Started:
        return parse(await self._send(start_call(text, session_id, provider, idempotency_key)), Started)

    async def session(self, session_id: str) -> SessionShown:
        return parse(await self._send(Call("GET", _path("/v1/sessions/{}", session_id), retry=True)), SessionShown)

    async def cancel(self, session_id: str, reason: str = "") -> Cancelled:
        call = Call("POST", _path("/v1/sessions/{}/cancel", session_id), json={"reason": reason}, changes=True)
        return parse(await self._send(call), Cancelled)

    async def grants(self, session_id: str) -> list[GrantShown]:
        call = Call("GET", _path("/v1/sessions/{}/grants", session_id), retry=True)
        return parse(await self._send(call), Grants).grants

    async def revoke_grant(self, grant_id: str, reason: str = "") -> Revoking:
        call = Call("POST", _path("/v1/grants/{}/revoke", grant_id), json={"reason": reason}, changes=True)
        return parse(await self._send(call), Revoking)

    async def wait_for_turn(self, session_id: str, *, since: str | None = None, timeout: float | None = None) -> Event:
        deadline = None if timeout is None else time.monotonic() + timeout
        async for event in self.events(since=since, until=deadline):
            if event.session_id == session_id and event.type in TURN_ENDED:
                return event
        raise TimeoutError(f"session {session_id}: no turn ended within {timeout} s")

    # --- requests ---

    async def requests(
        self,
        *,
        status: str | None = None,
        tool: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
    ) -> list[Card]:
        return (await self.requests_page(status=status, tool=tool, session_id=session_id, limit=limit)).requests

    async def requests_page(
        self,
        *,
        status: str | None = None,
        tool: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Cards:
        params = {"status": status, "tool": tool, "session_id": session_id, "limit": limit, "cursor": cursor}
        call = Call("GET", "/v1/requests", params={k: v for k, v in params.items() if v is not None}, retry=True)
        return parse(await self._send(call), Cards)

    async def pending(self, *, tool: str | None = None, session_id: str | None = None, limit: int = 100) -> list[Card]:
        return await self.requests(status="pending", tool=tool, session_id=session_id, limit=limit)

    async def request(self, request_id: str) -> Card:
        return parse(await self._send(Call("GET", _path("/v1/requests/{}", request_id), retry=True)), Card)

    async def approve(
        self,
        request: str | Card,
        *,
        message: str = "",
        args_digest: str | None = None,
        idempotency_key: str | None = None,
    ) -> Verdict:
        call = decision_call(request, "approve", "", message, args_digest, idempotency_key or new_key())
        return await self._decide(call)

    async def deny(self, request: str | Card, *, reason: str = "", idempotency_key: str | None = None) -> Verdict:
        return await self._decide(decision_call(request, "deny", reason, "", None, idempotency_key or new_key()))

    async def respond(self, request: str | Card, message: str, *, idempotency_key: str | None = None) -> Verdict:
        """Answer in the tool's place: the call does not run, and the model reads `message` as its result."""
        return await self._decide(decision_call(request, "respond", "", message, None, idempotency_key or new_key()))

    async def _decide(self, call: Call) -> Verdict:
        answer = verdict_of(await self._send(call))
        deadline = time.monotonic() + self.decision_wait
        backoff = Backoff(0.2, 2.0)
        while isinstance(answer, Pending):
            if time.monotonic() >= deadline:
                raise DecisionPending(answer, call.headers["Idempotency-Key"])
            await asyncio.sleep(backoff())
            answer = verdict_of(await self._send(Call("GET", answer.links["poll"], retry=True)))
        return answer

    # --- events ---

    async def events(self, since: str | None = None, *, until: float | None = None) -> AsyncIterator[Event]:
        last = since
        backoff = Backoff(0.1, 5.0)
        while until is None or time.monotonic() < until:
            headers = {"Accept": "text/event-stream"}
            if last is not None and last != "now":
                headers["Last-Event-ID"] = last
            call = Call("GET", "/v1/events", headers=headers)
            params = {"since": "now"} if last == "now" else None
            try:
                async with self._http.stream(
                    "GET",
                    call.path,
                    params=params,
                    headers=await self._login_headers(call),
                    timeout=_read_until(self._stream_timeout, until),
                ) as answer:
                    if answer.status_code == 401 and self._login.can_log_in:
                        await self.login()
                        continue
                    if answer.status_code >= 400 and answer.status_code not in UNAVAILABLE:
                        await answer.aread()
                        raise problem_of(answer)
                    if answer.status_code == 200:
                        backoff.reset()
                        parser = EventParser()
                        async for line in answer.aiter_lines():
                            event = parser.feed(line)
                            if line == "" and parser.last_id is not None:
                                last = parser.last_id
                            if event is not None:
                                yield event
                            if until is not None and time.monotonic() >= until:
                                return
            except httpx.TransportError:
                pass
            await asyncio.sleep(backoff())

    # --- sending ---

    async def _login_headers(self, call: Call) -> dict[str, str]:
        if self._login.token is None and self._login.cookie is None and self._login.can_log_in:
            async with self._logging_in:
                if self._login.cookie is None:
                    await self.login()
        return self._login.headers(call)

    async def _send(self, call: Call) -> httpx.Response:
        backoff = Backoff(0.2, 3.0)
        logged_in_again = False
        attempt = 0
        while True:
            attempt += 1
            try:
                answer = await self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=await self._login_headers(call)
                )
            except httpx.TransportError:
                if not call.retry or attempt >= self.attempts:
                    raise
                await asyncio.sleep(backoff())
                continue
            if answer.status_code == 401 and self._login.can_log_in and not logged_in_again:
                logged_in_again = True
                await self.login()
                continue
            if answer.status_code in UNAVAILABLE and call.retry and attempt < self.attempts:
                await asyncio.sleep(backoff())
                continue
            return answer


def start_call(text: str, session_id: str | None, provider: str | None, key: str | None) -> Call:
    body: dict[str, Any] = {"text": text}
    if session_id is not None:
        body["session_id"] = session_id
    if provider is not None:
        body["provider"] = provider
    headers = {"Idempotency-Key": key} if key is not None else {}
    return Call("POST", "/v1/sessions", json=body, headers=headers, changes=True, retry=key is not None)
