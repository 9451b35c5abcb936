"""One handler per inbound message; each is one unit of work."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

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
    SessionWaiting,
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
from .models import (
    ApprovalRequest,
    Closure,
    Decision,
    ProviderAttemptRow,
    Session,
    Step,
    ToolCall,
    TranscriptRow,
    Turn,
)
from .unit_of_work import Duplicate, UnitOfWork

log = logging.getLogger("signoff.ledger")


@dataclass
class Ledger:
    sessions: async_sessionmaker
    topology: Topology
    catalogue: ToolCatalogue
    default_provider: str
    notify_channel: str | None = None

    def unit_of_work(self) -> UnitOfWork:
        return UnitOfWork(self.sessions, self.topology, self.notify_channel)


# --- helpers shared by the handlers -----------------------------------------


async def _transcript(uow: UnitOfWork, session_id: str) -> list[TranscriptEntry]:
    rows = await uow.db.scalars(
        select(TranscriptRow.entry).where(TranscriptRow.session_id == session_id).order_by(TranscriptRow.position)
    )
    return [TranscriptEntry.model_validate(r) for r in rows]


def _append(uow: UnitOfWork, session: Session, entry: TranscriptEntry) -> None:
    session.transcript_len += 1
    uow.db.add(
        TranscriptRow(session_id=session.id, position=session.transcript_len, entry=entry.model_dump(mode="json"))
    )


async def _request_step(ledger: Ledger, uow: UnitOfWork, session: Session, turn_id: str, cause: Envelope) -> None:
    step = Step(id=mint("stp"), session_id=session.id, turn_id=turn_id, status="requested", created_at=uow.now)
    uow.db.add(step)
    await uow.db.flush()
    uow.emit(
        session,
        RequestModelStep(
            session_id=session.id,
            causation_id=cause.message_id,
            step_id=step.id,
            provider=session.provider,
            transcript=await _transcript(uow, session.id),
            tools=ledger.catalogue.descriptions(),
        ),
    )
    session.status = "running"


def _reject(uow: UnitOfWork, session: Session | None, message: Envelope, code: str, text: str) -> None:
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


def _close(uow: UnitOfWork, session: Session, call: ToolCall, kind: str, cause: Envelope, *,
           output=None, reason_code: str | None = None, reason_text: str | None = None) -> None:
    call.status = "closed"
    uow.db.add(
        Closure(
            call_id=call.id,
            session_id=session.id,
            kind=kind,
            reason_code=reason_code,
            reason_text=reason_text,
            output=None if output is None else {"value": output},
            created_at=uow.now,
        )
    )
    uow.emit(
        session,
        ToolCallClosed(
            session_id=session.id,
            causation_id=cause.message_id,
            call_id=call.id,
            kind=kind,
            reason_code=reason_code,
            reason_text=reason_text,
        ),
    )


async def _resume_if_step_closed(ledger: Ledger, uow: UnitOfWork, session: Session, step_id: str, cause: Envelope) -> None:
    """When the last call of a step closes, write every closure next to its call,
    in the order the model made them, and ask for the next model step, once."""
    await uow.db.flush()
    calls = (await uow.db.scalars(select(ToolCall).where(ToolCall.step_id == step_id).order_by(ToolCall.position))).all()
    if any(c.status != "closed" for c in calls):
        pending = await _pending_request_ids(uow, session.id)
        session.status = "waiting" if pending else "running"
        return
    closures = {
        c.call_id: c
        for c in await uow.db.scalars(select(Closure).where(Closure.call_id.in_([c.id for c in calls])))
    }
    for call in calls:
        closure = closures[call.id]
        _append(uow, session, domain.closure_entry(
            call_id=call.id,
            provider_call_id=call.provider_call_id,
            tool=call.tool,
            kind=closure.kind,
            output=(closure.output or {}).get("value"),
            reason_text=closure.reason_text,
        ))
    notes = await uow.db.execute(
        select(Decision.responder, Decision.message)
        .join(ApprovalRequest, ApprovalRequest.id == Decision.request_id)
        .join(ToolCall, ToolCall.id == ApprovalRequest.call_id)
        .where(ToolCall.step_id == step_id, Decision.message != "")
        .order_by(ToolCall.position)
    )
    for responder, message in notes:
        _append(uow, session, domain.decision_note(responder, message))
    step = await uow.db.get(Step, step_id)
    await _request_step(ledger, uow, session, step.turn_id, cause)


async def _pending_request_ids(uow: UnitOfWork, session_id: str) -> list[str]:
    return list(
        await uow.db.scalars(
            select(ApprovalRequest.id)
            .where(ApprovalRequest.session_id == session_id, ApprovalRequest.status == "pending")
            .order_by(ApprovalRequest.created_at, ApprovalRequest.id)
        )
    )


# --- handlers ----------------------------------------------------------------


def transition(handler):
    """Run a handler as one unit of work: lock the session, record the message in
    the inbox (a duplicate ends here, silently), apply, commit state and outbox."""

    @functools.wraps(handler)
    async def apply(ledger: Ledger, message: Envelope) -> None:
        async with ledger.unit_of_work() as uow:
            try:
                session = await uow.lock_session(message.session_id)
                await uow.receive(message)
                await handler(ledger, uow, session, message)
                await uow.commit()
            except Duplicate:
                return

    return apply


@transition
async def start_turn(ledger: Ledger, uow: UnitOfWork, session: Session | None, command: StartTurn) -> None:
    if session is None:
        session = Session(
            id=command.session_id,
            status="idle",
            provider=command.provider or ledger.default_provider,
            event_seq=0,
            transcript_len=0,
            created_at=uow.now,
            updated_at=uow.now,
        )
        uow.db.add(session)
        await uow.db.flush()  # rows of different tables are not ordered by foreign key otherwise
    if session.status in domain.BUSY_STATUSES:
        _reject(uow, session, command, "session_busy",
                f"The session is {session.status}; a new turn can start when it is idle.")
        return
    turn = Turn(id=mint("trn"), session_id=session.id, status="running", created_at=uow.now)
    uow.db.add(turn)
    await uow.db.flush()
    _append(uow, session, TranscriptEntry(role="user", text=command.text))
    session.updated_at = uow.now
    await _request_step(ledger, uow, session, turn.id, command)


@transition
async def model_step_completed(ledger: Ledger, uow: UnitOfWork, session: Session | None,
                               event: ModelStepCompleted) -> None:
    step = await uow.db.get(Step, event.step_id)
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
        uow.db.add(ProviderAttemptRow(
            session_id=session.id,
            step_id=step.id,
            number=attempt.number,
            status="discarded" if duplicate_report else attempt.status,
            provider=attempt.provider,
            input_tokens=attempt.usage.input_tokens,
            output_tokens=attempt.usage.output_tokens,
            report_message_id=event.message_id,
            recorded_at=uow.now,
        ))
    if duplicate_report:
        log.info("discarded a second report for step %s", step.id)
        return
    step.status = "completed"
    step.completed_at = uow.now
    turn = await uow.db.get(Turn, step.turn_id)
    session.updated_at = uow.now

    if event.error is not None:
        turn.status = "failed"
        turn.completed_at = uow.now
        session.status = "idle"
        uow.emit(session, TurnFailed(session_id=session.id, causation_id=event.message_id, turn_id=turn.id,
                                     reason_code="provider_failed", reason_text=event.error))
        return

    plans = domain.plan_calls(event.tool_calls, ledger.catalogue)
    calls = [
        ToolCall(
            id=mint("call"),
            session_id=session.id,
            step_id=step.id,
            position=i,
            provider_call_id=plan.proposed.provider_call_id,
            tool=plan.proposed.name,
            arguments=plan.proposed.arguments,
            args_digest=arguments_digest(plan.proposed.arguments),
            status="executing",
            idempotency_key=mint("idk"),
            created_at=uow.now,
        )
        for i, plan in enumerate(plans)
    ]
    _append(uow, session, TranscriptEntry(
        role="assistant",
        text=event.text,
        tool_calls=[TranscriptCall(call_id=c.id, provider_call_id=c.provider_call_id, name=c.tool,
                                   arguments=c.arguments) for c in calls],
    ))
    if not calls:
        turn.status = "completed"
        turn.final_text = event.text
        turn.completed_at = uow.now
        session.status = "idle"
        uow.emit(session, TurnCompleted(session_id=session.id, causation_id=event.message_id,
                                        turn_id=turn.id, text=event.text))
        return

    uow.db.add_all(calls)
    await uow.db.flush()
    for plan, call in zip(plans, calls, strict=True):
        if plan.action == "close":
            _close(uow, session, call, "error", event, reason_code=plan.reason_code, reason_text=plan.reason_text)
        elif plan.action == "ask":
            call.status = "awaiting_approval"
            request = ApprovalRequest(
                id=mint("apr"),
                call_id=call.id,
                session_id=session.id,
                status="pending",
                args_digest=call.args_digest,
                card=plan.spec.card(call.arguments).model_dump(mode="json"),
                created_at=uow.now,
            )
            uow.db.add(request)
            uow.emit(session, ApprovalRequested(
                session_id=session.id,
                causation_id=event.message_id,
                request_id=request.id,
                call_id=call.id,
                step_id=step.id,
                card=request.card,
                args_digest=request.args_digest,
            ))
        else:
            _execute(uow, session, call, event)
    await _resume_if_step_closed(ledger, uow, session, step.id, event)
    if session.status == "waiting":
        uow.emit(session, SessionWaiting(session_id=session.id, causation_id=event.message_id,
                                         pending_request_ids=await _pending_request_ids(uow, session.id)))


def _execute(uow: UnitOfWork, session: Session, call: ToolCall, cause: Envelope) -> None:
    call.status = "executing"
    uow.emit(session, ExecuteTool(
        session_id=session.id,
        causation_id=cause.message_id,
        call_id=call.id,
        tool=call.tool,
        arguments=call.arguments,
        idempotency_key=call.idempotency_key,
    ))


@transition
async def respond_to_approval(ledger: Ledger, uow: UnitOfWork, session: Session | None,
                              response: RespondToApproval) -> None:
    request = await uow.db.get(ApprovalRequest, response.request_id)
    verdict = domain.judge_response(
        request_found=request is not None and session is not None,
        request_session_id=request.session_id if request else None,
        request_status=request.status if request else None,
        expected_digest=request.args_digest if request else None,
        session_id=response.session_id,
        decision=response.decision,
        args_digest=response.args_digest,
    )
    if not verdict.accepted:
        _reject(uow, session, response, verdict.reason_code, verdict.reason_text)
        return
    call = await uow.db.get(ToolCall, request.call_id)
    request.status = "approved" if response.decision == "approve" else "denied"
    uow.db.add(Decision(
        request_id=request.id,
        decision=response.decision,
        reason=response.reason,
        message=response.message,
        responder=response.responder,
        message_id=response.message_id,
        decided_at=uow.now,
    ))
    uow.emit(session, ApprovalDecided(
        session_id=session.id,
        causation_id=response.message_id,
        request_id=request.id,
        call_id=call.id,
        decision=response.decision,
        reason=response.reason,
        responder=response.responder,
    ))
    session.updated_at = uow.now
    if response.decision == "approve":
        _execute(uow, session, call, response)
    else:
        _close(uow, session, call, "denied", response, reason_code="denied_by_person",
               reason_text=response.reason or None)
    await _resume_if_step_closed(ledger, uow, session, call.step_id, response)


@transition
async def tool_executed(ledger: Ledger, uow: UnitOfWork, session: Session | None, event: ToolExecuted) -> None:
    call = await uow.db.get(ToolCall, event.call_id)
    if session is None or call is None or call.session_id != session.id:
        _reject(uow, session, event, "unknown_call", "No such tool call in this session.")
        return
    if call.status != "executing":
        # Already closed (a repeated report) or never approved: nothing to do,
        # but the inbox row keeps it from being looked at again.
        log.info("ignored a report for call %s in status %s", call.id, call.status)
        return
    if event.outcome == "output":
        _close(uow, session, call, "output", event, output=event.output)
    elif event.outcome == "error":
        _close(uow, session, call, "error", event, reason_code="tool_failed", reason_text=event.error)
    else:
        reason = event.error or "The executor stopped mid-call; whether the call happened is unknown."
        _close(uow, session, call, "outcome_unknown", event, reason_code="outcome_unknown", reason_text=reason)
        uow.emit(session, OperatorAlerted(session_id=session.id, causation_id=event.message_id, call_id=call.id,
                                          tool=call.tool, reason_code="outcome_unknown", reason_text=reason))
    session.updated_at = uow.now
    await _resume_if_step_closed(ledger, uow, session, call.step_id, event)


