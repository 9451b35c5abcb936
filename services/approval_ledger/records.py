"""What a ledger transition writes: rows handed to its unit of work and the
messages it emits to the outbox, committed together (invariant 1).

Each function records one decision already taken by `domain`; none decides.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from datetime import datetime
from typing import Any

from sqlalchemy import select, update

from shared.audit import digest_of
from shared.catalogue import ToolCatalogue
from shared.consuming import sender
from shared.ledger import transcripts
from shared.ledger.database import insert_unless_present
from shared.ledger.tables import TABLES
from shared.messages import (
    ApprovalCard,
    ApprovalCounted,
    ApprovalRequested,
    Envelope,
    ExecuteTool,
    MessageRejected,
    OperatorAlerted,
    ProviderAttempt,
    RequestModelStep,
    RespondToApproval,
    ToolCallClosed,
    TranscriptCall,
    TranscriptEntry,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    mint,
)
from shared.observability import (
    APPROVAL_OUTCOMES,
    APPROVALS_REQUESTED,
    CALLS_CLOSED,
    MESSAGES_REJECTED,
    tool_label,
    when_committed,
)
from shared.redaction import redact_text, redact_value

from . import reads
from .authority import Authority
from .domain import (
    CANCELLED_BEFORE_RUNNING,
    Call,
    ClaimOnRecord,
    ClosureOnRecord,
    Refusal,
    RequestOnRecord,
    Resumption,
    Step,
    Tally,
    token_hash,
)
from .unit_of_work import SessionState, UnitOfWork

log = logging.getLogger("signoff.ledger")

TURNS = TABLES["turns"]
STEPS = TABLES["steps"]
TRANSCRIPT = TABLES["transcript"]
TOOL_CALLS = TABLES["tool_calls"]
APPROVAL_REQUESTS = TABLES["approval_requests"]
DECISIONS = TABLES["decisions"]
APPROVALS = TABLES["approvals"]
SESSIONS = TABLES["sessions"]
CLOSURES = TABLES["closures"]
CLAIMS = TABLES["execution_claims"]
PROVIDER_ATTEMPTS = TABLES["provider_attempts"]


def _id_of(cause: Envelope | None) -> str | None:
    """The message a record answers; None for the ledger's own doing (a deadline passing)."""
    return cause.message_id if cause is not None else None


def refusal(uow: UnitOfWork, session: SessionState | None, message: Envelope, refused: Refusal) -> None:
    log.info("rejected %s %s: %s", message.type, message.message_id, refused.reason_code)
    uow.rejected.add(message.message_id)
    when_committed(MESSAGES_REJECTED.labels(message.type, refused.reason_code).inc)
    if isinstance(message, RespondToApproval):
        uow.audit(
            session,
            message.session_id,
            "response.rejected",
            subject=message.request_id,
            actor=message.responder,
            message_id=message.message_id,
            decision=message.decision,
            channel=message.key_id,
            response_id=message.response_id,
            reason_code=refused.reason_code,
            reason_text=refused.reason_text,
        )
    else:
        uow.audit(
            session,
            message.session_id,
            "message.rejected",
            actor=sender.get(),
            message_id=message.message_id,
            type=message.type,
            reason_code=refused.reason_code,
            reason_text=refused.reason_text,
        )
    uow.emit(
        session,
        MessageRejected(
            session_id=message.session_id,
            causation_id=message.message_id,
            rejected_message_id=message.message_id,
            rejected_type=message.type,
            reason_code=refused.reason_code,
            reason_text=refused.reason_text,
        ),
    )


def append(uow: UnitOfWork, session: SessionState, entry: TranscriptEntry) -> None:
    """Stored once, and the session's digest chain extended with it (a session from
    before digests keeps None until a step computes it from its rows)."""
    stored = entry.model_dump(mode="json")
    if session.transcript_len == 0:
        session.transcript_digest = transcripts.extended(transcripts.EMPTY, stored)
    elif session.transcript_digest is not None:
        session.transcript_digest = transcripts.extended(session.transcript_digest, stored)
    session.transcript_len += 1
    session.appended.append(entry)
    uow.add(TRANSCRIPT, {"session_id": session.id, "position": session.transcript_len, "entry": stored})


def new_turn(uow: UnitOfWork, session: SessionState, started_by: str | None) -> str:
    turn_id = mint("trn")
    uow.add(
        TURNS,
        {
            "id": turn_id,
            "session_id": session.id,
            "status": "running",
            "final_text": None,
            "started_by": started_by,
            "created_at": uow.now,
            "completed_at": None,
        },
    )
    return turn_id


def session_starter(uow: UnitOfWork, session: SessionState, starter: str | None) -> None:
    """Who started the session, as `domain.session_starter` says; written if it changed."""
    if starter != session.started_by:
        session.started_by = starter
        uow.update(SESSIONS, session.id, started_by=starter)


def end_turn(uow: UnitOfWork, session: SessionState, ended: TurnCompleted | TurnFailed | TurnCancelled) -> None:
    """The turn ends as the event says, and the session can take a new one (idle, or
    cancelled: it says so until then)."""
    said: dict[str, str | None]
    if isinstance(ended, TurnCompleted):
        uow.update(TURNS, ended.turn_id, status="completed", final_text=ended.text, completed_at=uow.now)
        session.status = "idle"
        said = {"status": "completed", "text_digest": digest_of(ended.text)}
    elif isinstance(ended, TurnFailed):
        # The reason's text on the turn's row: the session goes back to idle, so without
        # it only the event said why (the audit entry keeps its digest, not the text).
        uow.update(
            TURNS,
            ended.turn_id,
            status="failed",
            final_text=None,
            completed_at=uow.now,
            reason_code=ended.reason_code,
            reason_text=ended.reason_text,
        )
        session.status = "idle"
        said = {"status": "failed", "reason_code": ended.reason_code, "reason_digest": digest_of(ended.reason_text)}
    else:
        uow.update(
            TURNS,
            ended.turn_id,
            status="cancelled",
            final_text=None,
            completed_at=uow.now,
            reason_text=ended.reason,
            ended_by=ended.cancelled_by,
        )
        session.status = "cancelled"
        said = {"status": "cancelled", "by": ended.cancelled_by, "reason": ended.reason}
    uow.audit(session, session.id, "turn.ended", subject=ended.turn_id, message_id=ended.causation_id, **said)
    uow.emit(session, ended)


async def hold_back(uow: UnitOfWork, call: Call) -> ClaimOnRecord | None:
    """Keep a call that is being cancelled from running: the ledger takes the call's
    claim itself, finished as cancelled, so an executor that comes later finds it
    done (the claim's primary key decides who was first). None: the call had not
    started and now never will; else the executor's claim, locked, as it stands."""
    fresh = await uow.db.execute(
        insert_unless_present(CLAIMS, "call_id", uow.db.dialect.name),
        {
            "call_id": call.id,
            "idempotency_key": call.idempotency_key,
            "status": "finished",
            "holder": "ledger",
            "lease_expires_at": uow.now,
            "attempts": 0,
            "outcome": "error",
            "result": {"error": CANCELLED_BEFORE_RUNNING},
            "claimed_at": uow.now,
            "finished_at": uow.now,
        },
    )
    if fresh.rowcount == 1:
        return None
    row = (await uow.db.execute(select(CLAIMS).where(CLAIMS.c.call_id == call.id).with_for_update())).one()
    return ClaimOnRecord(row.status, row.outcome, row.result)


async def withdraw_request(uow: UnitOfWork, call: Call) -> None:
    """The call's pending request closes as cancelled."""
    await uow.db.execute(
        update(APPROVAL_REQUESTS)
        .where(APPROVAL_REQUESTS.c.call_id == call.id, APPROVAL_REQUESTS.c.status == "pending")
        .values(status="cancelled")
    )
    if call.status == "awaiting_approval":
        when_committed(APPROVAL_OUTCOMES.labels(tool_label(call.tool), "cancelled").inc)


def assistant_entry(
    uow: UnitOfWork, session: SessionState, text: str, calls: list[Call], catalogue: ToolCatalogue
) -> None:
    """What the model said, with each call it made under the ids Signoff gave it, its
    secrets hidden as on the card: the transcript is shown (`signoff session show`) and
    sent back to the model; only the call's own row keeps the arguments that run."""
    made = [
        TranscriptCall(
            call_id=c.id, provider_call_id=c.provider_call_id, name=c.tool, arguments=shown_arguments(catalogue, c)
        )
        for c in calls
    ]
    append(uow, session, TranscriptEntry(role="assistant", text=text, tool_calls=made))


async def step_request(
    uow: UnitOfWork, session: SessionState, turn_id: str, catalogue: ToolCatalogue, cause: Envelope | None
) -> None:
    """A new model step, asked for by reference: the transcript's length and digest,
    which the model-step reads from the ledger (claim-check; the command and its
    outbox row stay the same size however long the session grows)."""
    step_id = mint("stp")
    uow.add(
        STEPS,
        {
            "id": step_id,
            "session_id": session.id,
            "turn_id": turn_id,
            "status": "requested",
            "created_at": uow.now,
            "completed_at": None,
        },
    )
    uow.emit(
        session,
        RequestModelStep(
            session_id=session.id,
            causation_id=_id_of(cause),
            step_id=step_id,
            provider=session.provider,
            transcript_length=session.transcript_len,
            transcript_digest=await _transcript_digest(uow, session),
            tools=catalogue.descriptions(),
        ),
    )
    session.status = "running"


async def _transcript_digest(uow: UnitOfWork, session: SessionState) -> str:
    if session.transcript_len == 0:
        return transcripts.EMPTY
    if session.transcript_digest is None:
        # A session from before digests: computed from its rows once, then kept and extended.
        session.transcript_digest = transcripts.digest_of(await reads.transcript_rows(uow, session))
    return session.transcript_digest


def attempts(
    uow: UnitOfWork, step: Step, report_message_id: str, judged: tuple[tuple[ProviderAttempt, str], ...]
) -> None:
    for attempt, status in judged:
        uow.add(
            PROVIDER_ATTEMPTS,
            {
                "session_id": step.session_id,
                "step_id": step.id,
                "number": attempt.number,
                "status": status,
                "provider": attempt.provider,
                "input_tokens": attempt.usage.input_tokens,
                "output_tokens": attempt.usage.output_tokens,
                "report_message_id": report_message_id,
                "recorded_at": uow.now,
            },
        )


def new_call(uow: UnitOfWork, call: Call, position: int, args_digest: str) -> None:
    """Inserted with the status it ends this transition in."""
    uow.add(
        TOOL_CALLS,
        {
            "id": call.id,
            "session_id": call.session_id,
            "step_id": call.step_id,
            "position": position,
            "provider_call_id": call.provider_call_id,
            "tool": call.tool,
            "arguments": call.arguments,
            "args_digest": args_digest,
            "status": call.status,
            "idempotency_key": call.idempotency_key,
            "created_at": uow.now,
        },
    )


def approval_request(
    uow: UnitOfWork,
    session: SessionState,
    call: Call,
    request_id: str,
    card: ApprovalCard,
    args_digest: str,
    pending_request_ids: list[str],
    cause: Envelope | None,
    *,
    approvals_required: int,
    expires_at: datetime,
    escalate_at: datetime | None,
    attempt: int | None,
    run_id: str,
    call_seal: str,
) -> None:
    """The request, stored with its one-time response token's hash, its deadline,
    where it came from (turn, step, model attempt, ledger run) and the ledger's seal
    over its call (`Authority.seal_request`); the token itself (random, 256 bits)
    leaves only in the request's `approval.requested` event."""
    response_token = secrets.token_urlsafe(32)
    when_committed(APPROVALS_REQUESTED.labels(tool_label(call.tool)).inc)
    uow.audit(
        session,
        session.id,
        "approval.requested",
        subject=request_id,
        message_id=_id_of(cause),
        call_id=call.id,
        tool=call.tool,
        args_digest=args_digest,
        approvals_required=approvals_required,
        expires_at=expires_at.isoformat(),
    )
    uow.add(
        APPROVAL_REQUESTS,
        {
            "id": request_id,
            "call_id": call.id,
            "session_id": session.id,
            "status": "pending",
            "args_digest": args_digest,
            "card": card.model_dump(mode="json"),
            "response_token_hash": token_hash(response_token),
            "token_used_at": None,
            "created_at": uow.now,
            "expires_at": expires_at,
            "escalate_at": escalate_at,
            "escalated_at": None,
            "turn_id": call.turn_id,
            "step_id": call.step_id,
            "attempt": attempt,
            "run_id": run_id,
            "call_seal": call_seal,
        },
    )
    uow.emit(
        session,
        ApprovalRequested(
            session_id=session.id,
            causation_id=_id_of(cause),
            request_id=request_id,
            call_id=call.id,
            step_id=call.step_id,
            card=card,
            args_digest=args_digest,
            pending_request_ids=pending_request_ids,
            approvals_required=approvals_required,
            response_token=response_token,
            expires_at=expires_at,
            turn_id=call.turn_id,
            attempt=attempt,
            run_id=run_id,
        ),
    )


def execution(
    uow: UnitOfWork,
    session: SessionState,
    call: Call,
    cause: Envelope | None,
    authority: Authority,
    *,
    request_id: str | None,
    stored: bool = True,
) -> None:
    """Send a call to the executor, sealed with the ledger's authorization: the
    approved request, or (None) the policy that needs none. `stored`: the call's
    row exists and changes status."""
    if stored:
        uow.update(TOOL_CALLS, call.id, status="executing")
    call.status = "executing"
    uow.audit(
        session,
        session.id,
        "execution.authorized",
        subject=call.id,
        message_id=_id_of(cause),
        tool=call.tool,
        request_id=request_id,
    )
    command = ExecuteTool(
        session_id=session.id,
        causation_id=_id_of(cause),
        call_id=call.id,
        tool=call.tool,
        arguments=call.arguments,
        idempotency_key=call.idempotency_key,
    )
    uow.emit(session, authority.authorize(command, request_id=request_id, at=uow.now))


def accepted(
    uow: UnitOfWork, session: SessionState, request: RequestOnRecord, response: RespondToApproval, counted: Tally
) -> None:
    """What every accepted response leaves: an approval is counted (one row per
    request and responder), a token is redeemed, and the audit log says who
    answered, through which channel (with the count while more are needed)."""
    uow.audit(
        session,
        session.id,
        "response.accepted",
        subject=request.id,
        actor=response.responder,
        message_id=response.message_id,
        decision=response.decision,
        channel=response.key_id,
        response_id=response.response_id,
        reason=response.reason,
        message_digest=digest_of(response.message) if response.message else None,
        count=None if counted.decides else counted.count,
        required=None if counted.decides else counted.required,
    )
    if response.decision == "approve":
        uow.add(
            APPROVALS,
            {
                "request_id": request.id,
                "responder": response.responder,
                "response_id": response.response_id,
                "message_id": response.message_id,
                "channel": response.key_id,
                "reason": response.reason,
                "message": response.message,
                "approved_at": uow.now,
            },
        )
    if response.response_token is not None:
        uow.update(APPROVAL_REQUESTS, request.id, token_used_at=uow.now)


def approval_counted(
    uow: UnitOfWork, session: SessionState, request: RequestOnRecord, response: RespondToApproval, counted: Tally
) -> None:
    """An approval towards a request that needs more: it stays pending, and the
    channels can show how far it got."""
    uow.emit(
        session,
        ApprovalCounted(
            session_id=session.id,
            causation_id=response.message_id,
            request_id=request.id,
            call_id=request.call_id,
            responder=response.responder,
            count=counted.count,
            required=counted.required,
        ),
    )
    session.updated_at = uow.now


def decision(uow: UnitOfWork, session: SessionState, request: RequestOnRecord, response: RespondToApproval) -> None:
    request_id = request.id
    uow.audit(
        session,
        session.id,
        "approval.decided",
        subject=request_id,
        actor=response.responder,
        message_id=response.message_id,
        decision=response.decision,
        reason=response.reason,
        call_id=request.call_id,
    )
    uow.add(
        DECISIONS,
        {
            "request_id": request_id,
            "decision": response.decision,
            "reason": response.reason,
            "message": response.message,
            "responder": response.responder,
            "message_id": response.message_id,
            "response_id": response.response_id,
            "channel": response.key_id,
            "decided_at": uow.now,
        },
    )


def shown_arguments(catalogue: ToolCatalogue, call: Call) -> dict[str, Any]:
    spec = catalogue.get(call.tool)
    return spec.shown_arguments(call.arguments) if spec else redact_value(call.arguments)


def closure(
    uow: UnitOfWork,
    session: SessionState,
    call: Call,
    closed: ClosureOnRecord,
    cause: Envelope | None,
    *,
    stored: bool = True,
) -> None:
    """Close a call: its status and its one closure row (invariant 3), and say so.
    The reason is said with credential shapes hidden, whoever wrote it."""
    when_committed(CALLS_CLOSED.labels(tool_label(call.tool), closed.kind).inc)
    if closed.reason_text:
        closed = dataclasses.replace(closed, reason_text=redact_text(closed.reason_text))
    if stored:
        uow.update(TOOL_CALLS, call.id, status="closed")
    call.status = "closed"
    call.closure = closed
    # A person's reason or a deadline are said; what a tool, the model or a parked
    # message produced may echo a secret, so it is kept as a digest.
    said = closed.kind in ("denied", "expired")
    uow.audit(
        session,
        session.id,
        "call.closed",
        subject=call.id,
        message_id=_id_of(cause),
        closed_as=closed.kind,
        reason_code=closed.reason_code,
        reason_text=closed.reason_text if said else None,
        reason_digest=None if said or closed.reason_text is None else digest_of(closed.reason_text),
        output_digest=None if closed.output is None else digest_of(closed.output),
    )
    uow.add(
        CLOSURES,
        {
            "call_id": call.id,
            "session_id": session.id,
            "kind": closed.kind,
            "reason_code": closed.reason_code,
            "reason_text": closed.reason_text,
            "output": None if closed.output is None else {"value": closed.output},
            "created_at": uow.now,
        },
    )
    uow.emit(
        session,
        ToolCallClosed(
            session_id=session.id,
            causation_id=_id_of(cause),
            call_id=call.id,
            kind=closed.kind,
            reason_code=closed.reason_code,
            reason_text=closed.reason_text,
        ),
    )


def operator_alert(
    uow: UnitOfWork, session: SessionState, call: Call, closed: ClosureOnRecord, cause: Envelope | None
) -> None:
    alert(uow, session, call, closed.reason_code or closed.kind, closed.reason_text or "", cause)


def alert(
    uow: UnitOfWork,
    session: SessionState,
    call: Call | None,
    reason_code: str,
    reason_text: str,
    cause: Envelope | None,
    *,
    turn_id: str | None = None,
) -> None:
    """Tell an operator about a call only a person can settle, someone forging or
    rewriting, or (no call) a turn that reached its bound."""
    uow.emit(
        session,
        OperatorAlerted(
            session_id=session.id,
            causation_id=_id_of(cause),
            call_id=call.id if call is not None else None,
            tool=call.tool if call is not None else "",
            reason_code=reason_code,
            reason_text=redact_text(reason_text),
            turn_id=turn_id,
        ),
    )


async def resumption(
    uow: UnitOfWork,
    session: SessionState,
    turn_id: str,
    resumed: Resumption,
    catalogue: ToolCatalogue,
    cause: Envelope | None,
) -> None:
    """The step's calls as this transition leaves them: the session's status, or
    (the step done) its closures and notes, then the next model step."""
    session.status = resumed.status
    if resumed.entries is None:
        return
    for entry in resumed.entries:
        append(uow, session, entry)
    await step_request(uow, session, turn_id, catalogue, cause)
