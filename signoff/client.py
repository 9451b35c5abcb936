"""`signoff.Client` and `signoff.AsyncClient`: the gateway's HTTP API from Python (httpx).

    with signoff.Client("https://signoff.example", "alice", password) as client:
        started = client.start_session("Publish the notes for 1.3")
        for card in client.pending():
            client.approve(card.id)
        for event in client.events(since=None):   # reconnects and resumes by Last-Event-ID
            ...

Every error the gateway answers is raised as `signoff.Problem` (RFC 9457: `kind` is the
machine-readable part of its type, e.g. `not-an-approver`; `reason_code` the ledger's).
The results are pydantic models that match docs/openapi.json (a unit test checks).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

COOKIE = "signoff_session"


class _Result(BaseModel):
    # A newer gateway may add fields: an older SDK keeps working.
    model_config = ConfigDict(extra="ignore")


class Started(_Result):
    session_id: str
    message_id: str
    links: dict[str, str]


class Card(_Result):
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
    starter_may_approve: bool


class TranscriptEntry(_Result):
    role: str
    text: str
    tool_calls: list[dict[str, Any]]
    call_id: str | None
    closure: str | None


class SessionView(_Result):
    id: str
    status: str
    status_reason: str | None
    started_by: str | None
    created_at: datetime
    updated_at: datetime
    transcript: list[TranscriptEntry]
    pending_requests: list[Card]
    usage: dict[str, int]


class Verdict(_Result):
    response_id: str
    request_id: str
    decision: str
    responder: str
    outcome: str
    decided: bool
    approvals: int | None = None
    approvals_required: int | None = None


class Pending(_Result):
    response_id: str
    request_id: str
    status: str
    links: dict[str, str]


class Event(_Result):
    id: str
    type: str
    data: dict[str, Any]


class Problem(Exception):
    def __init__(self, status: int, document: dict[str, Any]) -> None:
        self.status = status
        self.document = document
        self.type = str(document.get("type", ""))
        self.kind = self.type.rsplit(":", 1)[-1]
        self.reason_code = document.get("reason_code")
        super().__init__(f"{status} {self.kind}: {document.get('detail') or document.get('title', '')}")


def _checked(answer: httpx.Response) -> Any:
    if answer.status_code >= 400:
        try:
            document = answer.json()
        except ValueError:
            document = {"type": "urn:signoff:problem:http-error", "title": answer.text[:200]}
        raise Problem(answer.status_code, document)
    return answer.json() if answer.content else None


def _decision(answer: httpx.Response) -> Verdict | Pending:
    body = _checked(answer)
    return Pending(**body) if answer.status_code == 202 else Verdict(**body)


def _cookie_of(answer: httpx.Response) -> str:
    for header in answer.headers.get_list("set-cookie"):
        name, _, rest = header.partition("=")
        if name.strip() == COOKIE:
            return rest.split(";", 1)[0]
    raise Problem(answer.status_code, {"type": "urn:signoff:problem:no-session", "title": "no session cookie"})


class _Parser:
    """Server-Sent Events, a line at a time: an event at each blank line that ends one with an id."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen
        self.fields: dict[str, str] = {}

    def line(self, line: str) -> Event | None:
        if line.startswith(":"):
            return None  # a heartbeat
        if line:
            name, _, value = line.partition(":")
            self.fields[name] = value.removeprefix(" ")
            return None
        fields, self.fields = self.fields, {}
        if "id" not in fields:
            return None
        self.seen.append(fields["id"])
        return Event(id=fields["id"], type=fields.get("event", ""), data=json.loads(fields.get("data") or "{}"))


def _pending_params(tool: str | None, session_id: str | None) -> dict[str, str]:
    params = {"status": "pending"}
    if tool:
        params["tool"] = tool
    if session_id:
        params["session_id"] = session_id
    return params


class _Session:
    """The login: the session cookie (sent by hand: it is Secure, and httpx's jar sends
    those only over https, while a gateway on loopback is plain http) and the CSRF token."""

    def __init__(self) -> None:
        self.cookie = ""
        self.csrf = ""

    def headers(self, changing: bool = False, **extra: str) -> dict[str, str]:
        headers = {"Cookie": f"{COOKIE}={self.cookie}"} if self.cookie else {}
        if changing:
            headers["X-CSRF-Token"] = self.csrf
        return {**headers, **extra}

    def logged_in(self, answer: httpx.Response) -> None:
        self.csrf = _checked(answer)["csrf_token"]
        self.cookie = _cookie_of(answer)


class Client:
    """The gateway's API, blocking."""

    def __init__(self, url: str, name: str, password: str, *, timeout: float = 30.0, wait_seconds: float = 60) -> None:
        self.http = httpx.Client(base_url=url, timeout=timeout)
        # How long a decision waits for the ledger's verdict before it returns `Pending`.
        self.wait_seconds = wait_seconds
        self.session_ = _Session()
        self.session_.logged_in(self.http.post("/v1/login", json={"name": name, "password": password}))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def _post(self, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
        return self.http.post(path, json=body, headers=self.session_.headers(True, **headers))

    def start_session(self, text: str, session_id: str | None = None) -> Started:
        body = {"text": text, **({"session_id": session_id} if session_id else {})}
        return Started(**_checked(self._post("/v1/sessions", body)))

    def session(self, session_id: str) -> SessionView:
        return SessionView(**_checked(self.http.get(f"/v1/sessions/{session_id}", headers=self.session_.headers())))

    def pending(self, tool: str | None = None, session_id: str | None = None) -> list[Card]:
        params = {
            "status": "pending",
            **({"tool": tool} if tool else {}),
            **({"session_id": session_id} if session_id else {}),
        }
        answer = self.http.get("/v1/requests", params=params, headers=self.session_.headers())
        return [Card(**card) for card in _checked(answer)["requests"]]

    def decide(
        self, request_id: str, decision: str, *, reason: str = "", message: str = "", idempotency_key: str | None = None
    ) -> Verdict | Pending:
        key = idempotency_key or secrets.token_hex(16)
        body = {"decision": decision, "reason": reason, "message": message}
        answer = _decision(self._post(f"/v1/requests/{request_id}/decision", body, **{"Idempotency-Key": key}))
        deadline = time.monotonic() + self.wait_seconds
        # 202: the ledger has not decided yet; its verdict is polled for, up to wait_seconds.
        while isinstance(answer, Pending) and time.monotonic() < deadline:
            time.sleep(0.5)
            answer = _decision(self.http.get(answer.links["poll"], headers=self.session_.headers()))
        return answer

    def approve(self, request_id: str, message: str = "", idempotency_key: str | None = None) -> Verdict | Pending:
        return self.decide(request_id, "approve", message=message, idempotency_key=idempotency_key)

    def deny(self, request_id: str, reason: str, idempotency_key: str | None = None) -> Verdict | Pending:
        return self.decide(request_id, "deny", reason=reason, idempotency_key=idempotency_key)

    def cancel(self, session_id: str, reason: str = "") -> None:
        _checked(self._post(f"/v1/sessions/{session_id}/cancel", {"reason": reason}))

    def events(self, since: str | None = None, *, retry_seconds: float = 1.0) -> Iterator[Event]:
        """Every event the caller may see, from after `since` (an event id), for ever: a
        broken stream is opened again (any replica) from the last id seen."""
        seen = [since] if since else []
        while True:
            headers = self.session_.headers(False, **({"Last-Event-ID": seen[-1]} if seen else {}))
            try:
                with self.http.stream("GET", "/v1/events", headers=headers, timeout=None) as answer:
                    if answer.status_code >= 400:
                        answer.read()
                        _checked(answer)
                    parser = _Parser(seen)
                    for line in answer.iter_lines():
                        if (event := parser.line(line)) is not None:
                            yield event
            except httpx.TransportError:
                pass
            time.sleep(retry_seconds)


class AsyncClient:
    """The gateway's API, for asyncio. `await AsyncClient.login(url, name, password)`."""

    def __init__(self, url: str, *, timeout: float = 30.0, wait_seconds: float = 60) -> None:
        self.http = httpx.AsyncClient(base_url=url, timeout=timeout)
        self.wait_seconds = wait_seconds
        self.session_ = _Session()

    @classmethod
    async def login(cls, url: str, name: str, password: str, *, timeout: float = 30.0) -> AsyncClient:
        client = cls(url, timeout=timeout)
        client.session_.logged_in(await client.http.post("/v1/login", json={"name": name, "password": password}))
        return client

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def _post(self, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
        return await self.http.post(path, json=body, headers=self.session_.headers(True, **headers))

    async def start_session(self, text: str, session_id: str | None = None) -> Started:
        body = {"text": text, **({"session_id": session_id} if session_id else {})}
        return Started(**_checked(await self._post("/v1/sessions", body)))

    async def session(self, session_id: str) -> SessionView:
        answer = await self.http.get(f"/v1/sessions/{session_id}", headers=self.session_.headers())
        return SessionView(**_checked(answer))

    async def pending(self, tool: str | None = None, session_id: str | None = None) -> list[Card]:
        params = {
            "status": "pending",
            **({"tool": tool} if tool else {}),
            **({"session_id": session_id} if session_id else {}),
        }
        answer = await self.http.get("/v1/requests", params=params, headers=self.session_.headers())
        return [Card(**card) for card in _checked(answer)["requests"]]

    async def decide(
        self, request_id: str, decision: str, *, reason: str = "", message: str = "", idempotency_key: str | None = None
    ) -> Verdict | Pending:
        import asyncio

        key = idempotency_key or secrets.token_hex(16)
        body = {"decision": decision, "reason": reason, "message": message}
        answer = _decision(await self._post(f"/v1/requests/{request_id}/decision", body, **{"Idempotency-Key": key}))
        deadline = time.monotonic() + self.wait_seconds
        while isinstance(answer, Pending) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            answer = _decision(await self.http.get(answer.links["poll"], headers=self.session_.headers()))
        return answer

    async def approve(self, request_id: str, message: str = "", idempotency_key: str | None = None):
        return await self.decide(request_id, "approve", message=message, idempotency_key=idempotency_key)

    async def deny(self, request_id: str, reason: str, idempotency_key: str | None = None):
        return await self.decide(request_id, "deny", reason=reason, idempotency_key=idempotency_key)

    async def cancel(self, session_id: str, reason: str = "") -> None:
        _checked(await self._post(f"/v1/sessions/{session_id}/cancel", {"reason": reason}))

    async def events(self, since: str | None = None, *, retry_seconds: float = 1.0) -> AsyncIterator[Event]:
        """As `Client.events`: reconnects and resumes by Last-Event-ID by itself."""
        import asyncio

        seen = [since] if since else []
        while True:
            headers = self.session_.headers(False, **({"Last-Event-ID": seen[-1]} if seen else {}))
            try:
                async with self.http.stream("GET", "/v1/events", headers=headers, timeout=None) as answer:
                    if answer.status_code >= 400:
                        await answer.aread()
                        _checked(answer)
                    parser = _Parser(seen)
                    async for line in answer.aiter_lines():
                        if (event := parser.line(line)) is not None:
                            yield event
            except httpx.TransportError:
                pass
            await asyncio.sleep(retry_seconds)
