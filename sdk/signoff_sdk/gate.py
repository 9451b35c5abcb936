"""What every framework adapter does with one gated tool call, written once, without I/O:
file it (idempotent by the framework's call id), pause the framework while a person has
not decided, and then act on the ledger's signed verdict, never on what the framework
was resumed with. The adapters (`signoff_sdk.langchain`, `signoff_sdk.langgraph`,
`signoff_sdk.openai_agents`) drive these steps with their own pause and their own way of
running a tool, sync or async (`drive`, `adrive`).

The steps, as `settle()` yields them: `File` the call; while it waits on a person,
`Pause` (the framework stops here and comes back later) and `Fetch` it again; while
someone runs it, `Wait`; then `Check` its verdict (signed by the ledger's key, for this
very call), and for an approved `runs: caller` call, `Claim` it (granted once), `Run`
the tool with exactly the arguments a person approved, and `Report` how it ended.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import os
from collections.abc import Awaitable, Callable, Collection, Generator
from dataclasses import dataclass, field
from typing import Any

from .client import AsyncClient
from .errors import BadSignature
from .models import DECIDED_AS, ClaimShown, FiledShown, Verdict
from .verdicts import verified

# While a call is in one of these, someone is running it: wait for its end.
RUNNING = ("running", "claimed")


@dataclass(frozen=True)
class File:
    tool: str
    arguments: dict[str, Any]
    call_id: str
    thread: str | None
    summary: str | None


@dataclass(frozen=True)
class Pause:
    """The framework pauses here (a LangGraph `interrupt()`); what it is resumed with is ignored."""

    filed: FiledShown


@dataclass(frozen=True)
class Fetch:
    id: str


@dataclass(frozen=True)
class Wait:
    id: str


@dataclass(frozen=True)
class Check:
    filed: FiledShown


@dataclass(frozen=True)
class Claim:
    filed: FiledShown


@dataclass(frozen=True)
class Run:
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Ran:
    """How the tool's run ended: its result as the framework has it, what to report, or the
    exception it raised."""

    result: Any = None
    output: Any = None
    error: str | None = None
    raised: BaseException | None = None


@dataclass(frozen=True)
class Report:
    claim: ClaimShown
    ran: Ran


@dataclass
class Settled:
    """What became of a gated call. `decision`: approve, edit (approved with the arguments
    a person edited), deny, respond (a person answered in the tool's place: nothing ran,
    and `message` is their answer, the tool's result for the model), or how Signoff
    closed it otherwise (expired, cancelled, outcome_unknown, error). `ran`: the tool
    ran here, now (its result in `result`); otherwise `output` is the call's recorded
    output, if it has one. `closure`: how the call closed (output, denied, answered,
    error, expired, …; None while a caller's call runs here).
    `refused`: a `runs: caller` call approved in a way the agent does not allow for this
    tool (an edit it does not take); nothing ran."""

    call: FiledShown
    decision: str
    arguments: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    message: str = ""
    ran: bool = False
    result: Any = None
    output: Any = None
    refused: str | None = None
    closure: str | None = None
    verdict: Verdict | None = None

    @property
    def edited(self) -> bool:
        return self.decision == "edit"


Step = File | Pause | Fetch | Wait | Check | Claim | Run | Report


def settle(call: File, allowed: Collection[str] | None = None) -> Generator[Step, Any, Settled]:
    """The steps of one gated call (see the module's text). `allowed`: the decisions the
    agent accepts for this tool (approve, edit, deny, respond); None: any. A decision
    that does not run the tool (deny, respond) is what it is whatever the agent allows:
    nothing runs either way."""
    filed: FiledShown = yield call
    _same_call(filed, call)
    while filed.status == "pending":
        yield Pause(filed)
        filed = yield Fetch(filed.id)
    while filed.status in RUNNING:
        filed = yield Wait(filed.id)
    verdict: Verdict | None = yield Check(filed)
    decision = _decision(filed, verdict, call)
    arguments = verdict.arguments if verdict is not None else call.arguments
    reason = verdict.reason if verdict is not None and decision == "deny" else ""
    message = verdict.message if verdict is not None and decision == "respond" else ""
    closure = filed.closure.kind if filed.closure is not None else None
    if closure not in (None, "output", "denied", "answered"):
        reason = filed.closure.reason_text or "" if filed.closure is not None else ""
    settled = Settled(filed, decision, arguments, reason, message, closure=closure, verdict=verdict)
    if filed.status == "approved" and allowed is not None and decision not in allowed:
        settled.refused = f"a person's {decision!r} is not a decision this agent allows for {call.tool!r}"
        return settled
    if filed.status == "approved":
        claim: ClaimShown = yield Claim(filed)
        ran: Ran = yield Run(claim.arguments)
        yield Report(claim, ran)
        if ran.raised is not None:
            raise ran.raised
        settled.arguments, settled.ran, settled.result, settled.output = claim.arguments, True, ran.result, ran.output
        return settled
    if filed.closure is not None and filed.closure.kind == "output":
        settled.output = filed.closure.output
    return settled


def _same_call(filed: FiledShown, call: File) -> None:
    if filed.caller_call_id != call.call_id:
        raise BadSignature(f"the gateway answered for call {filed.caller_call_id!r}, not {call.call_id!r}")


def _decision(filed: FiledShown, verdict: Verdict | None, call: File) -> str:
    if verdict is None:
        return filed.closure.kind if filed.closure is not None else filed.status
    if verdict.caller_call_id != call.call_id or verdict.tool != filed.tool:
        raise BadSignature(f"the signed verdict is for another call than {call.call_id!r}")
    if verdict.decision in ("deny", "respond"):
        return verdict.decision
    return "edit" if verdict.edited_by or verdict.arguments != call.arguments else "approve"


# --- drivers ---------------------------------------------------------------------------------


@dataclass
class Connection:
    """Where the adapters reach Signoff: `url`, `token` and `origin` default to the
    environment's `SIGNOFF_URL`, `SIGNOFF_TOKEN` and `SIGNOFF_ORIGIN`; without an origin,
    the adapter's kind and the program's own name (`langgraph:<program>`). `ledger_key`
    pins the ledger's public key (else read once from the gateway)."""

    url: str | None = None
    token: str | None = None
    origin: str | None = None
    ledger_key: str | None = None
    deadline: float = 60.0
    lease_seconds: int = 120
    kind: str = "http"

    def client(self) -> AsyncClient:
        return AsyncClient(
            self.url,
            token=self.token,
            origin=self.origin or os.environ.get("SIGNOFF_ORIGIN") or None,
            ledger_key=self.ledger_key,
            deadline=self.deadline,
        )

    async def origin_of(self, client: AsyncClient) -> str:
        """The origin to file for: as configured, else `<kind>:<program>` (`GET /v1/me`)."""
        if not client.origin:
            me = (await client._send("GET", "/v1/me")).json()
            client.origin = self.origin = f"{self.kind}:{str(me['principal']).split(':', 1)[-1]}"
        return client.origin

    def remember(self, client: AsyncClient) -> None:
        """Keep what the client learnt (the ledger's key, the origin) for the next call."""
        if self.ledger_key is None and client._key is not None:
            self.ledger_key = base64.urlsafe_b64encode(client._key).rstrip(b"=").decode()
        self.origin = self.origin or client.origin or None


async def perform(client: AsyncClient, connection: Connection, step: Step) -> Any:
    """One step that talks to Signoff."""
    if isinstance(step, File):
        await connection.origin_of(client)
        return await client.file(
            step.tool, step.arguments, call_id=step.call_id, thread=step.thread, summary=step.summary
        )
    if isinstance(step, Fetch):
        return await client.get(step.id)
    if isinstance(step, Wait):
        return await client.wait(step.id)
    if isinstance(step, Check):
        return await checked_verdict(client, step.filed)
    if isinstance(step, Claim):
        return await client.claim(step.filed, lease_seconds=connection.lease_seconds, holder=f"pid {os.getpid()}")
    if isinstance(step, Report):
        ran = step.ran
        return await client.report(step.claim, ran.output, error=ran.error)
    raise TypeError(f"not a step that talks to Signoff: {step!r}")


async def checked_verdict(client: AsyncClient, filed: FiledShown) -> Verdict | None:
    """The call's verdict, if a person decided it: signed by the ledger's key, for this
    call, and saying what the call's state says. None: no person decided (it expired or
    was cancelled first, or the catalogue let it run without one); then nothing runs here."""
    if filed.verdict is None:
        if filed.status == "approved":
            raise BadSignature(f"call {filed.id} is approved but carries no signed verdict")
        return None
    verdict = verified(filed.verdict, await client.ledger_key())
    if verdict.call_id != filed.id or verdict.caller_call_id != filed.caller_call_id:
        raise BadSignature(f"the signed verdict is for another call than {filed.id}")
    said = DECIDED_AS.get(filed.closure.kind, "approve") if filed.closure is not None else "approve"
    if filed.closure is not None and filed.closure.kind in DECIDED_AS and verdict.decision != said:
        raise BadSignature(f"the signed verdict says {verdict.decision}, the call says {filed.closure.kind}")
    if filed.status == "approved" and verdict.decision != "approve":
        raise BadSignature(f"the signed verdict says {verdict.decision}, the call says approved")
    return verdict


def ran_with(result: Any, output: Any = None, error: str | None = None) -> Ran:
    return Ran(result=result, output=output, error=error)


def drive(
    steps: Generator[Step, Any, Settled],
    connection: Connection,
    *,
    pause: Callable[[FiledShown], Any],
    run: Callable[[dict[str, Any]], Ran],
) -> Settled:
    """Drive the steps from code that is not async. One event loop for the whole call, idle
    while the framework pauses or the tool runs (so a tool may run its own loop)."""
    with asyncio.Runner() as loop:
        client = connection.client()
        try:
            answer: Any = None
            while True:
                try:
                    step = steps.send(answer)
                except StopIteration as done:
                    return done.value
                if isinstance(step, Pause):
                    answer = pause(step.filed)
                elif isinstance(step, Run):
                    answer = _running(run, step.arguments)
                else:
                    answer = loop.run(perform(client, connection, step))
        finally:
            connection.remember(client)
            loop.run(client.aclose())


async def adrive(
    steps: Generator[Step, Any, Settled],
    connection: Connection,
    *,
    pause: Callable[[FiledShown], Any],
    run: Callable[[dict[str, Any]], Awaitable[Ran]],
) -> Settled:
    """The same, from async code."""
    async with connection.client() as client:
        try:
            answer: Any = None
            while True:
                try:
                    step = steps.send(answer)
                except StopIteration as done:
                    return done.value
                if isinstance(step, Pause):
                    answer = pause(step.filed)
                    if inspect.isawaitable(answer):
                        answer = await answer
                elif isinstance(step, Run):
                    try:
                        answer = await run(step.arguments)
                    except Exception as error:
                        answer = Ran(error=f"{type(error).__name__}: {error}", raised=error)
                else:
                    answer = await perform(client, connection, step)
        finally:
            connection.remember(client)


def _running(run: Callable[[dict[str, Any]], Ran], arguments: dict[str, Any]) -> Ran:
    try:
        return run(arguments)
    except Exception as error:
        return Ran(error=f"{type(error).__name__}: {error}", raised=error)
