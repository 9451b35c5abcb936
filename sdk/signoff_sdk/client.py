"""The intake's client: file a tool call for a person's sign-off, wait for the decision,
and get the output, or run the approved call yourself (`runs: caller`) exactly once.

    from signoff_sdk import Client, Denied

    signoff = Client("http://127.0.0.1:8080", token="signoff_…", origin="http:billing-agent")
    try:
        output = signoff.call("send_refund", {"customer": "c-42", "amount": 12.5},
                              call_id=tool_call.id, thread=run_id, run=send_refund)
    except Denied as denied:
        ...  # denied.reason is the person's

Every request is retried with backoff through a gateway restart or a ledger that has not
answered yet, up to the caller's `deadline` (seconds, default 60) of failing in a row; a
call is re-attached by its call id (filing is idempotent by it), a claim by its token, a
report by its body. A verdict the ledger did not sign (or that says other than the call)
raises BadSignature and nothing runs.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import httpx

from .errors import CLOSURES, BadSignature, CallClosed, NoRunner, Refused, Unreachable
from .events import EventParser
from .models import DECIDED_AS, ClaimShown, Event, FiledShown, Keys, Verdict
from .verdicts import public_key_bytes, verified

# Answers worth asking again: the gateway restarting behind a proxy, or the ledger not yet done.
RETRIED = {429, 502, 503, 504}
# How long one long poll is held (the gateway holds at most 60 s).
POLL = 30.0
# Backoff between failed attempts: from this, doubling, up to the cap.
FIRST_BACKOFF, MAX_BACKOFF = 0.2, 5.0

Runner = Callable[..., Any] | Callable[..., Awaitable[Any]]


class AsyncClient:
    """The intake over HTTP, async. `url`, `token` and `origin` default to the
    environment's `SIGNOFF_URL`, `SIGNOFF_TOKEN` and `SIGNOFF_ORIGIN`. `ledger_key`: the
    ledger's public key (base64url, `signoff keys` or `GET /v1/keys`) to pin; without it
    the key is read from the gateway once. `verify=False` skips verdict checks (tests)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        origin: str | None = None,
        deadline: float = 60.0,
        ledger_key: str | None = None,
        verify: bool = True,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url or os.environ.get("SIGNOFF_URL", "http://127.0.0.1:8080")
        self.token = token or os.environ.get("SIGNOFF_TOKEN", "")
        self.origin = origin or os.environ.get("SIGNOFF_ORIGIN", "")
        self.deadline = deadline
        self.verify = verify
        self._key = public_key_bytes(ledger_key) if ledger_key else None
        self._own_http = http is None
        self.http = http or httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(10.0, read=POLL + 15))
        self.http.headers["Authorization"] = f"Bearer {self.token}"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own_http:
            await self.http.aclose()

    # --- the whole round trip ------------------------------------------------------------

    async def call(
        self,
        tool: str,
        args: dict[str, Any],
        *,
        call_id: str,
        thread: str | None = None,
        summary: str | None = None,
        origin: str | None = None,
        run: Runner | None = None,
        lease_seconds: int = 300,
        timeout: float | None = None,
    ) -> Any:
        """File the call, wait for a person, and return its output. A `runs: caller` tool
        is run here, once, by `run(**approved_arguments)` (the arguments a person approved,
        edited ones included). Raises Denied, Expired, Cancelled, OutcomeUnknown,
        ToolFailed (all CallClosed), Refused, Unreachable or BadSignature. `timeout`:
        how long to wait for a person (None: until the request expires)."""
        filed = await self.file(tool, args, call_id=call_id, thread=thread, summary=summary, origin=origin)
        ends = None if timeout is None else time.monotonic() + timeout
        while True:
            if filed.status == "closed":
                return self.outcome(filed, await self.verdict_of(filed))
            if filed.status == "approved":
                if run is None:
                    raise NoRunner(f"{tool} is run by its caller: pass run= to call()")
                return await self.run(filed, run, lease_seconds=lease_seconds)
            if ends is not None and time.monotonic() >= ends:
                raise TimeoutError(f"call {filed.id} still {filed.status} after {timeout} s")
            filed = await self.wait(filed.id, POLL if ends is None else max(0.0, min(POLL, ends - time.monotonic())))

    # --- the steps -------------------------------------------------------------------------

    async def file(
        self,
        tool: str,
        args: dict[str, Any],
        *,
        call_id: str,
        thread: str | None = None,
        summary: str | None = None,
        origin: str | None = None,
    ) -> FiledShown:
        """File the call (idempotent by `call_id`: filed again, the same call comes back)."""
        body = {"tool": tool, "arguments": args, "call_id": call_id, "origin": origin or self.origin}
        body |= {k: v for k, v in (("thread", thread), ("summary", summary)) if v is not None}
        answer = await self._send("POST", "/v1/calls", json=body, again_on={202})
        return FiledShown.model_validate(answer.json())

    async def get(self, id: str) -> FiledShown:
        return FiledShown.model_validate((await self._send("GET", f"/v1/calls/{id}")).json())

    async def wait(self, id: str, seconds: float = POLL) -> FiledShown:
        """The call, once it no longer waits on a person or runs, or after `seconds`."""
        answer = await self._send("GET", f"/v1/calls/{id}", params={"wait": min(60.0, max(0.0, seconds))})
        return FiledShown.model_validate(answer.json())

    async def claim(
        self, filed: FiledShown | str, *, lease_seconds: int = 300, holder: str | None = None
    ) -> ClaimShown:
        """Claim an approved `runs: caller` call: granted once, to this claim's token. The
        verdict is checked: the arguments to run are the ones a person approved."""
        id = filed if isinstance(filed, str) else filed.id
        body = {"claim_token": secrets.token_urlsafe(32), "lease_seconds": lease_seconds}
        body |= {"holder": holder} if holder else {}
        claim = ClaimShown.model_validate((await self._send("POST", f"/v1/calls/{id}/claim", json=body)).json())
        if self.verify:
            verdict = verified(claim.verdict, await self.ledger_key())
            if verdict.call_id != id or verdict.decision != "approve" or verdict.arguments != claim.arguments:
                raise BadSignature(f"the signed verdict does not approve these arguments for call {id}")
        return claim

    async def report(self, claim: ClaimShown, output: Any = None, *, error: str | None = None) -> FiledShown:
        """How the claimed call ended, once (`error`: it failed, with this text)."""
        body: dict[str, Any] = {"claim_token": claim.claim_token, "outcome": "error" if error else "output"}
        body |= {"error": error[:4000]} if error else {"output": output}
        answer = await self._send("POST", f"/v1/calls/{claim.call_id}/result", json=body)
        return FiledShown.model_validate(answer.json())

    async def run(self, filed: FiledShown, run: Runner, *, lease_seconds: int = 300) -> Any:
        """Claim, run once with the approved arguments, report, and return the output. A
        runner that raises is reported as the call's error, and its exception raised."""
        claim = await self.claim(filed, lease_seconds=lease_seconds, holder=f"pid {os.getpid()}")
        try:
            output = run(**claim.arguments)
            if inspect.isawaitable(output):
                output = await output
            json.dumps(output)
        except Exception as error:
            await self.report(claim, error=f"{type(error).__name__}: {error}")
            raise
        await self.report(claim, output)
        return output

    def outcome(self, filed: FiledShown, verdict: Verdict | None) -> Any:
        """A closed call's output, or its closure raised."""
        closure = filed.closure
        if closure is None:
            raise CallClosed("closed", "the call is closed with no closure on record", call=filed)
        if closure.kind == "output":
            return closure.output
        kind = CLOSURES.get(closure.kind, CallClosed)
        reason = closure.reason_text or ""
        if verdict is not None and closure.kind in ("denied", "answered"):
            reason = verdict.reason if closure.kind == "denied" else verdict.message
        raise kind(closure.kind, reason, closure.reason_code, call=filed)

    async def ledger_key(self) -> bytes:
        if self._key is None:
            keys = Keys.model_validate((await self._send("GET", "/v1/keys")).json())
            self._key = public_key_bytes(next(k.public_key for k in keys.keys if k.kid == "ledger"))
        return self._key

    async def verdict_of(self, filed: FiledShown) -> Verdict | None:
        """A decided call's verdict, checked: the ledger signed it, for this call, and it
        says what the closure says (an output only after an approval, a denial as denied)."""
        if not self.verify or filed.request_id is None or filed.closure is None:
            return None
        if filed.closure.kind not in DECIDED_AS and filed.verdict is None:
            return None  # expired or cancelled before anyone decided
        verdict = verified(filed.verdict, await self.ledger_key())
        expected = DECIDED_AS.get(filed.closure.kind, "approve")
        if verdict.call_id != filed.id or verdict.caller_call_id != filed.caller_call_id:
            raise BadSignature(f"the signed verdict is for another call than {filed.id}")
        if filed.closure.kind in DECIDED_AS and verdict.decision != expected:
            raise BadSignature(f"the signed verdict says {verdict.decision}, the call says {filed.closure.kind}")
        return verdict

    # --- events ------------------------------------------------------------------------------

    async def events(self, since: str | None = "now") -> AsyncGenerator[Event, None]:
        """`GET /v1/events` as it comes, for as long as the caller reads: from `since` (an
        event id: right after it; "now": what is committed from now on, beginning with
        an id-only `Event` once the stream is open; None: the ledger's beginning). A
        dropped stream or a gateway away is reconnected with backoff, resuming right
        after the last id seen (`Last-Event-ID`), so no event is missed or repeated; the
        `deadline` bounds how long the gateway may stay away."""
        last, failing_since, backoff = since, None, FIRST_BACKOFF
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None and last != "now":
                headers["Last-Event-ID"] = last
            params = {"since": "now"} if last == "now" else None
            failure = ""
            try:
                # The gateway's heartbeats keep a quiet stream within the read timeout.
                async with self.http.stream("GET", "/v1/events", headers=headers, params=params) as answer:
                    if answer.status_code >= 400 and answer.status_code not in RETRIED:
                        await answer.aread()
                        raise _refused(answer)
                    if answer.status_code == 200:
                        parser = EventParser()
                        async for line in answer.aiter_lines():
                            event = parser.feed(line)
                            if event is not None:
                                # The stream works: a later drop starts its backoff afresh.
                                failing_since, backoff, last = None, FIRST_BACKOFF, event.id
                                yield event
                    failure = f"HTTP {answer.status_code}"
            except httpx.TransportError as error:
                failure = f"{type(error).__name__}: {error}"
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since + backoff > self.deadline:
                raise Unreachable(f"GET /v1/events: no stream within {self.deadline:.0f} s ({failure or 'it ended'})")
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)

    # --- the wire ----------------------------------------------------------------------------

    async def _send(self, method: str, path: str, *, again_on: frozenset[int] | set[int] = frozenset(), **kwargs: Any):
        """One request, asked again with backoff while the gateway is away or busy, until
        `deadline` seconds of failing in a row. A problem document raises Refused."""
        started, backoff = time.monotonic(), FIRST_BACKOFF
        while True:
            try:
                answer = await self.http.request(method, path, **kwargs)
            except httpx.TransportError as error:
                failure: str = f"{type(error).__name__}: {error}"
            else:
                if answer.status_code < 400 and answer.status_code not in again_on:
                    return answer
                if answer.status_code not in RETRIED and answer.status_code not in again_on:
                    raise _refused(answer)
                failure = f"HTTP {answer.status_code}"
            if time.monotonic() - started + backoff > self.deadline:
                raise Unreachable(f"{method} {path}: no answer within {self.deadline:.0f} s ({failure})")
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)


def _refused(answer: httpx.Response) -> Refused:
    try:
        document = answer.json()
    except ValueError:
        document = {}
    kind = str(document.get("type", "")).rsplit(":", 1)[-1] or "http-error"
    return Refused(answer.status_code, kind, str(document.get("detail", "")), document)


class Client:
    """The same, for code that is not async: each method runs its async twin to the end
    (from a thread that has no event loop running; use AsyncClient inside one)."""

    def __init__(self, url: str | None = None, **options: Any) -> None:
        self.url, self.options = url, options
        self._key: str | None = options.pop("ledger_key", None)

    def _run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        async def once() -> Any:
            async with AsyncClient(self.url, ledger_key=self._key, **self.options) as client:
                try:
                    return await getattr(client, method)(*args, **kwargs)
                finally:
                    if client._key is not None:
                        self._key = _b64(client._key)

        return asyncio.run(once())

    def call(self, tool: str, args: dict[str, Any], *, call_id: str, **options: Any) -> Any:
        return self._run("call", tool, args, call_id=call_id, **options)

    def file(self, tool: str, args: dict[str, Any], *, call_id: str, **options: Any) -> FiledShown:
        return self._run("file", tool, args, call_id=call_id, **options)

    def get(self, id: str) -> FiledShown:
        return self._run("get", id)

    def wait(self, id: str, seconds: float = POLL) -> FiledShown:
        return self._run("wait", id, seconds)

    def claim(self, filed: FiledShown | str, **options: Any) -> ClaimShown:
        return self._run("claim", filed, **options)

    def report(self, claim: ClaimShown, output: Any = None, *, error: str | None = None) -> FiledShown:
        return self._run("report", claim, output, error=error)


def _b64(key: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(key).rstrip(b"=").decode()
