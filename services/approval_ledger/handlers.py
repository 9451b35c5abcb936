"""One handler per inbound message; each is one unit of work.

SQLAlchemy Core on the unit of work's connection: a handler reads what it
needs in one query (a step; a call or a request with every call of its step,
their closures and decision notes), decides with the rules in `domain`, and
hands its new and changed rows to the unit of work, which writes them at
commit. What the handler itself writes is never read back; the transcript is
read only when a model step is requested.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from shared.catalogue import ToolCatalogue
from shared.messages import (
    ApprovalDecided,
    ApprovalRequested,
    Envelope,
    ExecuteTool,
    MessageRejected,
    ModelStepCompleted,
    OperatorAlerted,
    RequestModelStep,
    RespondToApproval,
    StartTurn,
    ToolCallClosed,
    ToolExecuted,
    TranscriptCall,
    TranscriptEntry,
    TurnCompleted,
    TurnFailed,
    arguments_digest,
    mint,
)
from shared.topology import Topology

from . import domain
from .unit_of_work import TABLES, Duplicate, SessionState, UnitOfWork

log = logging.getLogger("signoff.ledger")

TURNS = TABLES["turns"]
STEPS = TABLES["steps"]
TRANSCRIPT = TABLES["transcript"]
TOOL_CALLS = TABLES["tool_calls"]
APPROVAL_REQUESTS = TABLES["approval_requests"]
DECISIONS = TABLES["decisions"]
CLOSURES = TABLES["closures"]
PROVIDER_ATTEMPTS = TABLES["provider_attempts"]


@dataclass
class Ledger:
    sessions: async_sessionmaker | AsyncEngine
    topology: Topology
    catalogue: ToolCatalogue
    default_provider: str
    notify_channel: str | None = None

    def unit_of_work(self) -> UnitOfWork:
        return UnitOfWork(self.sessions, self.topology, self.notify_channel)


# --- the reads, built once ---------------------------------------------------------

_pending = APPROVAL_REQUESTS.alias("pending")


def _session_waits(*, besides: Any = None):
    """Whether the session has a pending approval request (other than `besides`), as a column."""
    condition = [_pending.c.session_id == bindparam("session_id"), _pending.c.status == "pending"]
    if besides is not None:
        condition.append(_pending.c.id != besides)
    return select(_pending.c.id).where(*condition).exists().label("waiting")


_TRANSCRIPT = (
    select(TRANSCRIPT.c.entry)
    .where(TRANSCRIPT.c.session_id == bindparam("session_id"), TRANSCRIPT.c.position <= bindparam("upto"))
    .order_by(TRANSCRIPT.c.position)
)
_STEP = select(STEPS.c.id, STEPS.c.session_id, STEPS.c.turn_id, STEPS.c.status, _session_waits()).where(
    STEPS.c.id == bindparam("step_id")
)
_PENDING = (
    select(APPROVAL_REQUESTS.c.id)
    .where(APPROVAL_REQUESTS.c.session_id == bindparam("session_id"), APPROVAL_REQUESTS.c.status == "pending")
    .order_by(APPROVAL_REQUESTS.c.created_at, APPROVAL_REQUESTS.c.id)
)
# Every call of a step, in the model's order, with what resuming the step needs:
# its closure, its decision's note, the step's turn, and whether the session waits.
_target = TOOL_CALLS.alias("target")
_SIBLINGS = (
    TOOL_CALLS.join(STEPS, STEPS.c.id == TOOL_CALLS.c.step_id)
    .outerjoin(CLOSURES, CLOSURES.c.call_id == TOOL_CALLS.c.id)
    .outerjoin(APPROVAL_REQUESTS, APPROVAL_REQUESTS.c.call_id == TOOL_CALLS.c.id)
    .outerjoin(DECISIONS, DECISIONS.c.request_id == APPROVAL_REQUESTS.c.id)
)
_CALL_COLUMNS = (
    TOOL_CALLS.c.id, TOOL_CALLS.c.session_id, TOOL_CALLS.c.step_id, TOOL_CALLS.c.provider_call_id, TOOL_CALLS.c.tool,
    TOOL_CALLS.c.arguments, TOOL_CALLS.c.idempotency_key, TOOL_CALLS.c.status, STEPS.c.turn_id,
    CLOSURES.c.kind, CLOSURES.c.output, CLOSURES.c.reason_text, DECISIONS.c.responder, DECISIONS.c.message,
)
# A tool call and the other calls of its step.
_CALL_AND_SIBLINGS = (
    select(*_CALL_COLUMNS, _session_waits())
    .select_from(_target.join(_SIBLINGS, TOOL_CALLS.c.step_id == _target.c.step_id))
    .where(_target.c.id == bindparam("call_id"))
    .order_by(TOOL_CALLS.c.position)
)
# An approval request, its call and the other calls of its step; whether the session
# waits on a request other than this one (which this response decides).
_request = APPROVAL_REQUESTS.alias("request")
_REQUEST_AND_CALLS = (
    select(
        _request.c.id.label("request_id"), _request.c.session_id.label("request_session_id"),
        _request.c.status.label("request_status"), _request.c.args_digest.label("request_args_digest"),
        _request.c.call_id.label("request_call_id"),
        *_CALL_COLUMNS, _session_waits(besides=_request.c.id),
    )
    .select_from(
        _request.join(_target, _target.c.id == _request.c.call_id)
        .join(_SIBLINGS, TOOL_CALLS.c.step_id == _target.c.step_id)
    )
    .where(_request.c.id == bindparam("request_id"))
    .order_by(TOOL_CALLS.c.position)
)


# --- helpers shared by the handlers -----------------------------------------


async def _transcript(uow: UnitOfWork, session: SessionState) -> list[TranscriptEntry]:
    """The whole transcript: the rows stored before this transition, then the entries it appended."""
    entries = []
    if session.transcript_base:
        rows = await uow.db.scalars(_TRANSCRIPT, {"session_id": session.id, "upto": session.transcript_base})
        entries = [TranscriptEntry.model_validate(r) for r in rows]
    return entries + session.appended


def _append(uow: UnitOfWork, session: SessionState, entry: TranscriptEntry) -> None:
    session.transcript_len += 1
    session.appended.append(entry)
    uow.add(TRANSCRIPT, {"session_id": session.id, "position": session.transcript_len,
                         "entry": entry.model_dump(mode="json")})


async def _request_step(ledger: Ledger, uow: UnitOfWork, session: SessionState, turn_id: str,
                        cause: Envelope) -> None:
    step_id = mint("stp")
    uow.add(STEPS, {"id": step_id, "session_id": session.id, "turn_id": turn_id, "status": "requested",
                    "created_at": uow.now, "completed_at": None})
    uow.emit(
        session,
        RequestModelStep(
            session_id=session.id,
            causation_id=cause.message_id,
            step_id=step_id,
            provider=session.provider,
            transcript=await _transcript(uow, session),
            tools=ledger.catalogue.descriptions(),
        ),
    )
    session.status = "running"


def _reject(uow: UnitOfWork, session: SessionState | None, message: Envelope, code: str, text: str) -> None:
    log.info("rejected %s %s: %s", message.type, message.message_id, code)  # type: ignore[attr-defined]
    uow.emit(
        session,
        MessageRejected(
            session_id=message.session_id,
            causation_id=message.message_id,
            rejected_message_id=message.message_id,
            rejected_type=message.type,  # type: ignore[attr-defined]
            reason_code=code,
            reason_text=text,
        ),
    )


def _close(uow: UnitOfWork, session: SessionState, call: dict[str, Any], kind: str, cause: Envelope, *,
           output=None, reason_code: str | None = None, reason_text: str | None = None) -> dict[str, Any]:
    """Close a call: its status and its closure row (returned), and say so."""
    uow.change(TOOL_CALLS, call, status="closed")
    closure = uow.add(CLOSURES, {
        "call_id": call["id"],
        "session_id": session.id,
        "kind": kind,
        "reason_code": reason_code,
        "reason_text": reason_text,
        "output": None if output is None else {"value": output},
        "created_at": uow.now,
    })
    uow.emit(
        session,
        ToolCallClosed(
            session_id=session.id,
            causation_id=cause.message_id,
            call_id=call["id"],
            kind=kind,
            reason_code=reason_code,
            reason_text=reason_text,
        ),
    )
    return closure


def _step_call(row) -> dict[str, Any]:
    """A call as read with its step (`_CALL_COLUMNS`): the call's row, plus its closure and note if any."""
    call = {key: row._mapping[key] for key in ("id", "session_id", "step_id", "provider_call_id", "tool", "arguments",
                                                  "idempotency_key", "status")}
    call["turn_id"] = row.turn_id
    call["closure"] = None if row.kind is None else {"kind": row.kind, "output": row.output,
                                                     "reason_text": row.reason_text}
    call["note"] = (row.responder, row.message) if row.message else None
    return call


async def _resume_if_step_closed(ledger: Ledger, uow: UnitOfWork, session: SessionState, calls: list[dict[str, Any]],
                                 waiting: bool, cause: Envelope) -> None:
    """When the last call of a step closes, write every closure next to its call,
    in the order the model made them, and ask for the next model step, once.

    `calls` are all the step's calls as this transition leaves them; `waiting`
    whether the session then has a pending approval request."""
    if any(call["status"] != "closed" for call in calls):
        session.status = "waiting" if waiting else "running"
        return
    for call in calls:
        closure = call["closure"]
        _append(uow, session, domain.closure_entry(
            call_id=call["id"],
            provider_call_id=call["provider_call_id"],
            tool=call["tool"],
            kind=closure["kind"],
            output=(closure["output"] or {}).get("value"),
            reason_text=closure["reason_text"],
        ))
    for call in calls:
        if call["note"] is not None:  # a decision's message, said to the model once
            _append(uow, session, domain.decision_note(*call["note"]))
    await _request_step(ledger, uow, session, calls[0]["turn_id"], cause)


async def _stored_pending_request_ids(uow: UnitOfWork, session_id: str) -> list[str]:
    """The session's pending requests as stored before this transition, oldest first."""
    return list(await uow.db.scalars(_PENDING, {"session_id": session_id}))


# --- handlers ----------------------------------------------------------------


def transition(handler):
    """Run a handler as one unit of work: lock the session, record the message in
    the inbox (a duplicate ends here, silently), apply, commit state and outbox."""

    @functools.wraps(handler)
    async def apply(ledger: Ledger, message: Envelope) -> None:
        # A turn may open a session; no other message may.
        provider = (message.provider or ledger.default_provider) if isinstance(message, StartTurn) else None
        async with ledger.unit_of_work() as uow:
            try:
                session = await uow.lock_session(message.session_id, create_with_provider=provider)
                await uow.receive(message)
                await handler(ledger, uow, session, message)
                await uow.commit()
            except Duplicate:
                return

    return apply


@transition
async def start_turn(ledger: Ledger, uow: UnitOfWork, session: SessionState | None, command: StartTurn) -> None:
    assert session is not None, "a turn opens its session"
    if session.status in domain.BUSY_STATUSES:
        _reject(uow, session, command, "session_busy",
                f"The session is {session.status}; a new turn can start when it is idle.")
        return
    turn_id = mint("trn")
    uow.add(TURNS, {"id": turn_id, "session_id": session.id, "status": "running", "final_text": None,
                    "created_at": uow.now, "completed_at": None})
    _append(uow, session, TranscriptEntry(role="user", text=command.text))
    session.updated_at = uow.now
    await _request_step(ledger, uow, session, turn_id, command)


@transition
async def model_step_completed(ledger: Ledger, uow: UnitOfWork, session: SessionState | None,
                               event: ModelStepCompleted) -> None:
    step = (await uow.db.execute(_STEP, {"step_id": event.step_id, "session_id": event.session_id})).first()
    if session is None or step is None or step.session_id != session.id:
        _reject(uow, session, event, "unknown_step", "No such model step in this session.")
        return
    # A report for a step already completed is a duplicate (a model-step
    # died after reporting): keep its attempts, counted as discarded (invariant 7).
    duplicate_report = step.status != "requested"
    for attempt in event.attempts:
        if duplicate_report and attempt.status == "abandoned":
            # The "lost" delivery is the one whose report is already on record.
            continue
        uow.add(PROVIDER_ATTEMPTS, {
            "session_id": session.id,
            "step_id": step.id,
            "number": attempt.number,
            "status": "discarded" if duplicate_report else attempt.status,
            "provider": attempt.provider,
            "input_tokens": attempt.usage.input_tokens,
            "output_tokens": attempt.usage.output_tokens,
            "report_message_id": event.message_id,
            "recorded_at": uow.now,
        })
    if duplicate_report:
        log.info("discarded a second report for step %s", step.id)
        return
    uow.update(STEPS, step.id, status="completed", completed_at=uow.now)
    turn_id = step.turn_id
    session.updated_at = uow.now

    if event.error is not None:
        uow.update(TURNS, turn_id, status="failed", completed_at=uow.now)
        session.status = "idle"
        uow.emit(session, TurnFailed(session_id=session.id, causation_id=event.message_id, turn_id=turn_id,
                                     reason_code="provider_failed", reason_text=event.error))
        return

    plans = domain.plan_calls(event.tool_calls, ledger.catalogue)
    calls = [
        {
            "id": mint("call"),
            "session_id": session.id,
            "step_id": step.id,
            "position": i,
            "provider_call_id": plan.proposed.provider_call_id,
            "tool": plan.proposed.name,
            "arguments": plan.proposed.arguments,
            "args_digest": arguments_digest(plan.proposed.arguments),
            "status": "executing",
            "idempotency_key": mint("idk"),
            "created_at": uow.now,
        }
        for i, plan in enumerate(plans)
    ]
    _append(uow, session, TranscriptEntry(
        role="assistant",
        text=event.text,
        tool_calls=[TranscriptCall(call_id=c["id"], provider_call_id=c["provider_call_id"], name=c["tool"],
                                   arguments=c["arguments"]) for c in calls],
    ))
    if not calls:
        uow.update(TURNS, turn_id, status="completed", final_text=event.text, completed_at=uow.now)
        session.status = "idle"
        uow.emit(session, TurnCompleted(session_id=session.id, causation_id=event.message_id,
                                        turn_id=turn_id, text=event.text))
        return

    # The session waits on every pending request; each `approval.requested` names
    # them all (invariant 5), so a channel adapter needs no separate "waiting"
    # event. Earlier requests (not expected: a step is only requested once every
    # call before it closed) come first; this step's are minted in ascending
    # order so that the ledger's order (created_at, id) is the model's call order.
    asks = [call for plan, call in zip(plans, calls, strict=True) if plan.action == "ask"]
    earlier = await _stored_pending_request_ids(uow, session.id) if step.waiting else []
    request_ids = dict(zip((call["id"] for call in asks), sorted(mint("apr") for _ in asks), strict=True))
    pending = earlier + list(request_ids.values())
    closures = {}
    for call in calls:
        uow.add(TOOL_CALLS, call)  # inserted with the status it ends this transition in
    for plan, call in zip(plans, calls, strict=True):
        if plan.action == "close":
            closures[call["id"]] = _close(uow, session, call, "error", event, reason_code=plan.reason_code,
                                          reason_text=plan.reason_text)
        elif plan.action == "ask":
            call["status"] = "awaiting_approval"
            request = uow.add(APPROVAL_REQUESTS, {
                "id": request_ids[call["id"]],
                "call_id": call["id"],
                "session_id": session.id,
                "status": "pending",
                "args_digest": call["args_digest"],
                "card": plan.spec.card(call["arguments"]).model_dump(mode="json"),
                "created_at": uow.now,
            })
            uow.emit(session, ApprovalRequested(
                session_id=session.id,
                causation_id=event.message_id,
                request_id=request["id"],
                call_id=call["id"],
                step_id=step.id,
                card=request["card"],
                args_digest=request["args_digest"],
                pending_request_ids=pending,
            ))
        else:
            _execute(uow, session, call, event)
    # The step's calls are exactly these (made once, here), none decided yet: nothing to read back.
    steps_calls = [{"id": c["id"], "provider_call_id": c["provider_call_id"], "tool": c["tool"],
                    "status": c["status"], "closure": closures.get(c["id"]), "note": None, "turn_id": turn_id}
                   for c in calls]
    await _resume_if_step_closed(ledger, uow, session, steps_calls, bool(pending), event)


def _execute(uow: UnitOfWork, session: SessionState, call: dict[str, Any], cause: Envelope) -> None:
    uow.change(TOOL_CALLS, call, status="executing")
    uow.emit(session, ExecuteTool(
        session_id=session.id,
        causation_id=cause.message_id,
        call_id=call["id"],
        tool=call["tool"],
        arguments=call["arguments"],
        idempotency_key=call["idempotency_key"],
    ))


@transition
async def respond_to_approval(ledger: Ledger, uow: UnitOfWork, session: SessionState | None,
                              response: RespondToApproval) -> None:
    rows = (await uow.db.execute(_REQUEST_AND_CALLS, {"request_id": response.request_id,
                                                      "session_id": response.session_id})).all()
    request = rows[0] if rows else None
    found = request is not None
    verdict = domain.judge_response(
        request_found=found and session is not None,
        request_session_id=request.request_session_id if found else None,
        request_status=request.request_status if found else None,
        expected_digest=request.request_args_digest if found else None,
        session_id=response.session_id,
        decision=response.decision,
        args_digest=response.args_digest,
    )
    if not verdict.accepted:
        _reject(uow, session, response, verdict.reason_code, verdict.reason_text)
        return
    calls = [_step_call(row) for row in rows]
    call = next(c for c in calls if c["id"] == request.request_call_id)
    uow.update(APPROVAL_REQUESTS, request.request_id,
               status="approved" if response.decision == "approve" else "denied")
    uow.add(DECISIONS, {
        "request_id": request.request_id,
        "decision": response.decision,
        "reason": response.reason,
        "message": response.message,
        "responder": response.responder,
        "message_id": response.message_id,
        "decided_at": uow.now,
    })
    call["note"] = (response.responder, response.message) if response.message else None
    uow.emit(session, ApprovalDecided(
        session_id=session.id,
        causation_id=response.message_id,
        request_id=request.request_id,
        call_id=call["id"],
        decision=response.decision,
        reason=response.reason,
        responder=response.responder,
    ))
    session.updated_at = uow.now
    if response.decision == "approve":
        _execute(uow, session, call, response)
    else:
        call["closure"] = _close(uow, session, call, "denied", response, reason_code="denied_by_person",
                                 reason_text=response.reason or None)
    await _resume_if_step_closed(ledger, uow, session, calls, request.waiting, response)


@transition
async def tool_executed(ledger: Ledger, uow: UnitOfWork, session: SessionState | None, event: ToolExecuted) -> None:
    rows = (await uow.db.execute(_CALL_AND_SIBLINGS, {"call_id": event.call_id,
                                                      "session_id": event.session_id})).all()
    calls = [_step_call(row) for row in rows]
    call = next((c for c in calls if c["id"] == event.call_id), None)
    if session is None or call is None or call["session_id"] != session.id:
        _reject(uow, session, event, "unknown_call", "No such tool call in this session.")
        return
    if call["status"] != "executing":
        # Already closed (a repeated report) or never approved: nothing to do,
        # but the inbox row keeps it from being looked at again.
        log.info("ignored a report for call %s in status %s", call["id"], call["status"])
        return
    if event.outcome == "output":
        call["closure"] = _close(uow, session, call, "output", event, output=event.output)
    elif event.outcome == "error":
        call["closure"] = _close(uow, session, call, "error", event, reason_code="tool_failed",
                                 reason_text=event.error)
    else:
        reason = event.error or "The executor stopped mid-call; whether the call happened is unknown."
        call["closure"] = _close(uow, session, call, "outcome_unknown", event, reason_code="outcome_unknown",
                                 reason_text=reason)
        uow.emit(session, OperatorAlerted(session_id=session.id, causation_id=event.message_id, call_id=call["id"],
                                          tool=call["tool"], reason_code="outcome_unknown", reason_text=reason))
    session.updated_at = uow.now
    await _resume_if_step_closed(ledger, uow, session, calls, rows[0].waiting, event)
