"""What a ledger transition writes: rows handed to its store (the port, `store.py`)
and the messages it emits to the outbox, committed together (invariant 1).

Each function records one decision already taken by `domain`; none decides.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import secrets
from datetime import datetime
from typing import Any

from shared.audit import digest_of
from shared.catalogue import ToolCatalogue
from shared.consuming import sender
from shared.ledger import transcripts
from shared.messages import (
    ApprovalCard,
    ApprovalCounted,
    ApprovalDecided,
    ApprovalEscalated,
    ApprovalExpired,
    ApprovalRequested,
    Envelope,
    ExecuteTool,
    MessageRejected,
    OperatorAlerted,
    ProviderAttempt,
    RefuseExecution,
    RequestModelStep,
    RespondToApproval,
    StartTurn,
    ToolCallClosed,
    TranscriptCall,
    TranscriptEntry,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRepeated,
    mint,
)
from shared.observability import (
    APPROVAL_OUTCOMES,
    APPROVALS_REQUESTED,
    CALLS_CLOSED,
    ESCALATIONS,
    MESSAGES_REJECTED,
    TIME_TO_DECISION,
    tool_label,
    when_committed,
)
from shared.redaction import redact_text, redact_value
from shared.signatures import arguments_fingerprint

from .authority import Authority
from .decision_rules import Verdict
from .domain import (
    Call,
    CallPlan,
    ClaimOnRecord,
    ClosureOnRecord,
    Refusal,
    RequestOnRecord,
    Resumption,
    Step,
    Tally,
    token_hash,
)
from .store import LedgerStore, SessionState

log = logging.getLogger("signoff.ledger")


def _id_of(cause: Envelope | None) -> str | None:
    """The message a record answers; None for the ledger's own doing (a deadline passing)."""
    return cause.message_id if cause is not None else None


def refusal(store: LedgerStore, session: SessionState | None, message: Envelope, refused: Refusal) -> None:
    log.info("rejected %s %s: %s", message.type, message.message_id, refused.reason_code)
    store.rejected.add(message.message_id)
    when_committed(MESSAGES_REJECTED.labels(message.type, refused.reason_code).inc)
    if isinstance(message, RespondToApproval):
        store.audit(
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
        store.audit(
            session,
            message.session_id,
            "message.rejected",
            actor=sender.get(),
            message_id=message.message_id,
            type=message.type,
            reason_code=refused.reason_code,
            reason_text=refused.reason_text,
        )
    store.emit(
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


def append(store: LedgerStore, session: SessionState, entry: TranscriptEntry) -> None:
    """Stored once, and the session's digest chain extended with it (a session from
    before digests keeps None until a step computes it from its rows)."""
    stored = entry.model_dump(mode="json")
    if session.transcript_len == 0:
        session.transcript_digest = transcripts.extended(transcripts.EMPTY, stored)
    elif session.transcript_digest is not None:
        session.transcript_digest = transcripts.extended(session.transcript_digest, stored)
    session.transcript_len += 1
    session.appended.append(entry)
    store.add("transcript", {"session_id": session.id, "position": session.transcript_len, "entry": stored})


def new_turn(store: LedgerStore, session: SessionState, command: StartTurn) -> str:
    """A turn, running, and who started it with what (the text as a digest in the audit log)."""
    turn_id = mint("trn")
    store.add(
        "turns",
        {
            "id": turn_id,
            "session_id": session.id,
            "status": "running",
            "final_text": None,
            "started_by": command.started_by,
            "created_at": store.now,
            "completed_at": None,
            "idempotency_key": command.idempotency_key,
            "text_digest": digest_of(command.text),
        },
    )
    store.audit(
        session,
        session.id,
        "turn.started",
        subject=turn_id,
        actor=command.started_by,
        message_id=command.message_id,
        text_digest=digest_of(command.text),
    )
    return turn_id


def start_repeated(store: LedgerStore, session: SessionState, command: StartTurn, turn_id: str) -> None:
    """A repeated start (its idempotency key already started `turn_id`): nothing starts;
    the audit log answers the message with the turn it names, as the first start's
    `turn.started` did, and the channel is told the same (`turn.repeated`)."""
    store.audit(
        session,
        session.id,
        "turn.repeated",
        subject=turn_id,
        actor=command.started_by,
        message_id=command.message_id,
        idempotency_key=command.idempotency_key,
    )
    store.emit(
        session,
        TurnRepeated(
            session_id=session.id,
            causation_id=command.message_id,
            turn_id=turn_id,
            idempotency_key=command.idempotency_key or "",
        ),
    )


def session_starter(store: LedgerStore, session: SessionState, starter: str | None) -> None:
    """Who started the session, as `domain.session_starter` says; written if it changed."""
    if starter != session.started_by:
        session.started_by = starter
        store.update("sessions", session.id, started_by=starter)


def end_turn(store: LedgerStore, session: SessionState, ended: TurnCompleted | TurnFailed | TurnCancelled) -> None:
    """The turn ends as the event says, and the session can take a new one (idle, or
    cancelled: it says so until then)."""
    said: dict[str, str | None]
    if isinstance(ended, TurnCompleted):
        store.update("turns", ended.turn_id, status="completed", final_text=ended.text, completed_at=store.now)
        session.status = "idle"
        said = {"status": "completed", "text_digest": digest_of(ended.text)}
    elif isinstance(ended, TurnFailed):
        # The reason's text on the turn's row: the session goes back to idle, so without
        # it only the event said why (the audit entry keeps its digest, not the text).
        store.update(
            "turns",
            ended.turn_id,
            status="failed",
            final_text=None,
            completed_at=store.now,
            reason_code=ended.reason_code,
            reason_text=ended.reason_text,
        )
        session.status = "idle"
        said = {"status": "failed", "reason_code": ended.reason_code, "reason_digest": digest_of(ended.reason_text)}
    else:
        store.update(
            "turns",
            ended.turn_id,
            status="cancelled",
            final_text=None,
            completed_at=store.now,
            reason_text=ended.reason,
            ended_by=ended.cancelled_by,
        )
        session.status = "cancelled"
        said = {"status": "cancelled", "by": ended.cancelled_by, "reason": ended.reason}
    store.audit(session, session.id, "turn.ended", subject=ended.turn_id, message_id=ended.causation_id, **said)
    store.emit(session, ended)


def withdraw_request(store: LedgerStore, call: Call) -> None:
    """The call's pending request closes as cancelled (at commit)."""
    store.withdraw_request(call.id)
    when_committed(APPROVAL_OUTCOMES.labels(tool_label(call.tool), "cancelled").inc)


def assistant_entry(
    store: LedgerStore, session: SessionState, text: str, calls: list[Call], catalogue: ToolCatalogue
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
    append(store, session, TranscriptEntry(role="assistant", text=text, tool_calls=made))


async def step_request(
    store: LedgerStore, session: SessionState, turn_id: str, catalogue: ToolCatalogue, cause: Envelope | None
) -> None:
    """A new model step, asked for by reference: the transcript's length and digest,
    and the digest of the catalogue's tool menu, which the model-step reads from the
    ledger (claim-check; the command and its outbox row stay the same size however long
    the session grows, and carry no tool descriptions). The menu is stored with the
    command, unless this ledger knows it is stored already."""
    menu = catalogue.menu
    store.keep_tool_menu(menu)
    step_id = mint("stp")
    store.add(
        "steps",
        {
            "id": step_id,
            "session_id": session.id,
            "turn_id": turn_id,
            "status": "requested",
            "created_at": store.now,
            "completed_at": None,
        },
    )
    store.emit(
        session,
        RequestModelStep(
            session_id=session.id,
            causation_id=_id_of(cause),
            step_id=step_id,
            provider=session.provider,
            transcript_length=session.transcript_len,
            transcript_digest=await _transcript_digest(store, session),
            tools_digest=menu.digest,
        ),
    )
    session.status = "running"


async def _transcript_digest(store: LedgerStore, session: SessionState) -> str:
    if session.transcript_len == 0:
        return transcripts.EMPTY
    if session.transcript_digest is None:
        # A session from before digests: computed from its rows once, then kept and extended.
        session.transcript_digest = transcripts.digest_of(await store.transcript_rows(session))
    return session.transcript_digest


def attempts(
    store: LedgerStore, step: Step, report_message_id: str, judged: tuple[tuple[ProviderAttempt, str], ...]
) -> None:
    for attempt, status in judged:
        store.add(
            "provider_attempts",
            {
                "session_id": step.session_id,
                "step_id": step.id,
                "number": attempt.number,
                "status": status,
                "provider": attempt.provider,
                "input_tokens": attempt.usage.input_tokens,
                "output_tokens": attempt.usage.output_tokens,
                "report_message_id": report_message_id,
                "recorded_at": store.now,
            },
        )


def new_call(store: LedgerStore, call: Call, position: int, args_digest: str) -> None:
    """Inserted with the status it ends this transition in."""
    store.add(
        "tool_calls",
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
            "created_at": store.now,
            # The grant that lets it run with no card, if one does (the executor checks it).
            "grant_id": call.grant_id,
        },
    )


def approval_request(
    store: LedgerStore,
    session: SessionState,
    call: Call,
    request_id: str,
    card: ApprovalCard,
    args_digest: str,
    pending_request_ids: list[str],
    cause: Envelope | None,
    *,
    verdict: Verdict,
    expires_at: datetime,
    escalate_at: datetime | None,
    attempt: int | None,
    run_id: str,
    call_seal: str,
) -> None:
    """The request, stored with its one-time response token's hash, its deadline,
    where it came from (turn, step, model attempt, ledger run) and the ledger's seal
    over its call (`Authority.seal_request`); the token itself (random, 256 bits)
    leaves only in the request's `approval.requested` event. What the tool's rule
    decided (how many must approve, and why) is recorded with it and tallied from it."""
    approvals_required = verdict.approvals_required
    response_token = secrets.token_urlsafe(32)
    when_committed(APPROVALS_REQUESTED.labels(tool_label(call.tool)).inc)
    store.audit(
        session,
        session.id,
        "approval.requested",
        subject=request_id,
        message_id=_id_of(cause),
        call_id=call.id,
        tool=call.tool,
        args_digest=args_digest,
        approvals_required=approvals_required,
        reason=verdict.reason,
        # A rule that could not be evaluated for these arguments (the most approvers then ask).
        rule_error=verdict.error,
        expires_at=expires_at.isoformat(),
    )
    store.add(
        "approval_requests",
        {
            "id": request_id,
            "call_id": call.id,
            "session_id": session.id,
            # Kept with the request for the gauge's and the pages' indexes (migration 0015).
            "tool": call.tool,
            "status": "pending",
            "args_digest": args_digest,
            "card": card.model_dump(mode="json"),
            "response_token_hash": token_hash(response_token),
            "token_used_at": None,
            "created_at": store.now,
            "expires_at": expires_at,
            "escalate_at": escalate_at,
            "escalated_at": None,
            "turn_id": call.turn_id,
            "step_id": call.step_id,
            "attempt": attempt,
            "run_id": run_id,
            "call_seal": call_seal,
            "approvals_required": approvals_required,
            "reason": verdict.reason,
        },
    )
    store.emit(
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
    store: LedgerStore,
    session: SessionState,
    call: Call,
    cause: Envelope | None,
    authority: Authority,
    *,
    request_id: str | None,
    stored: bool = True,
    grant_id: str | None = None,
) -> None:
    """Send a call to the executor, sealed with the ledger's authorization: the
    approved request, the grant that covers it, or (neither) the policy that needs
    none. `stored`: the call's row exists and changes status."""
    if stored:
        store.update("tool_calls", call.id, status="executing")
    call.status = "executing"
    store.audit(
        session,
        session.id,
        "execution.authorized",
        subject=call.id,
        message_id=_id_of(cause),
        tool=call.tool,
        request_id=request_id,
        grant_id=grant_id,
    )
    command = ExecuteTool(
        session_id=session.id,
        causation_id=_id_of(cause),
        call_id=call.id,
        tool=call.tool,
        arguments=call.arguments,
        idempotency_key=call.idempotency_key,
    )
    store.emit(session, authority.authorize(command, request_id=request_id, at=store.now, grant_id=grant_id))


def accepted(
    store: LedgerStore, session: SessionState, request: RequestOnRecord, response: RespondToApproval, counted: Tally
) -> None:
    """What every accepted response leaves: an approval is counted (one row per
    request and responder), a token is redeemed, and the audit log says who
    answered, through which channel (with the count while more are needed)."""
    store.audit(
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
        store.add(
            "approvals",
            {
                "request_id": request.id,
                "responder": response.responder,
                "response_id": response.response_id,
                "message_id": response.message_id,
                "channel": response.key_id,
                "reason": response.reason,
                "message": response.message,
                "approved_at": store.now,
            },
        )
    if response.response_token is not None:
        store.update("approval_requests", request.id, token_used_at=store.now)


def approval_counted(
    store: LedgerStore, session: SessionState, request: RequestOnRecord, response: RespondToApproval, counted: Tally
) -> None:
    """An approval towards a request that needs more: it stays pending, and the
    channels can show how far it got."""
    store.emit(
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
    session.updated_at = store.now


def decision(
    store: LedgerStore,
    session: SessionState,
    request: RequestOnRecord,
    response: RespondToApproval,
    *,
    status: str,
    message: str | None = None,
) -> None:
    """The request decided by this response: it leaves `pending` as `status`, its
    decision row is written once, and `approval.decided` says so. `message`: what the
    model is told with the decision (the person's message, and an edit of the
    arguments, if any); the response's message when not given."""
    request_id = request.id
    request_closed(store, request, status)
    if request.created_at is not None:
        waited = _seconds(request.created_at, store.now)
        when_committed(functools.partial(TIME_TO_DECISION.labels(tool_label(request.tool)).observe, waited))
    store.audit(
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
    store.add(
        "decisions",
        {
            "request_id": request_id,
            "decision": response.decision,
            "reason": response.reason,
            "message": response.message if message is None else message,
            "responder": response.responder,
            "message_id": response.message_id,
            "response_id": response.response_id,
            "channel": response.key_id,
            "decided_at": store.now,
        },
    )
    store.emit(
        session,
        ApprovalDecided(
            session_id=session.id,
            causation_id=response.message_id,
            request_id=request_id,
            call_id=request.call_id,
            decision=response.decision,
            reason=response.reason,
            responder=response.responder,
        ),
    )


def _seconds(since: datetime, until: datetime) -> float:
    # A clock stepped back between request and decision counts as no wait, not a negative one.
    return max(0.0, (until - since).total_seconds())


def request_closed(store: LedgerStore, request: RequestOnRecord, status: str) -> None:
    """The request leaves `pending` as `status` (approved, denied, answered, expired,
    altered), counted once committed."""
    store.update("approval_requests", request.id, status=status)
    when_committed(APPROVAL_OUTCOMES.labels(tool_label(request.tool), status).inc)


def expiry(store: LedgerStore, session: SessionState, request: RequestOnRecord) -> None:
    """The request's deadline passed with nobody deciding: it closes as expired, and the channels are told."""
    request_closed(store, request, "expired")
    assert request.expires_at is not None
    store.emit(
        session,
        ApprovalExpired(
            session_id=session.id, request_id=request.id, call_id=request.call_id, expired_at=request.expires_at
        ),
    )


def escalation(store: LedgerStore, session: SessionState, request: RequestOnRecord, escalated_to: list[str]) -> None:
    """The request announced again to its escalation group: when and to whom is kept on
    its row (so it happens once, and they may approve from now on) and counted."""
    store.update("approval_requests", request.id, escalated_at=store.now, escalated_to=escalated_to)
    when_committed(ESCALATIONS.labels(tool_label(request.tool)).inc)
    store.audit(session, session.id, "approval.escalated", subject=request.id, to=escalated_to)
    store.emit(
        session,
        ApprovalEscalated(
            session_id=session.id,
            request_id=request.id,
            call_id=request.call_id,
            card=ApprovalCard.model_validate(request.card),
            args_digest=request.args_digest,
            escalated_to=escalated_to,
        ),
    )


def step_completed(store: LedgerStore, session: SessionState, step: Step) -> None:
    """The model step reported: it is done (a second report is discarded, see `domain.judge_step_report`)."""
    store.update("steps", step.id, status="completed", completed_at=store.now)
    session.updated_at = store.now


def step_discarded(store: LedgerStore, step: Step) -> None:
    """A model step still running when its turn ends: its report, when it comes, changes nothing."""
    store.update("steps", step.id, status="cancelled")


# How the audit log names a call's plan (`domain.CallPlan.action`).
PLAN_SAID = {"ask": "ask", "execute": "run", "close": "close"}


def call_proposed(
    store: LedgerStore, session: SessionState, call: Call, plan: CallPlan, cause: Envelope, *, call_digest: str
) -> None:
    """The model asked for the call, and what the ledger plans for it, in the audit log."""
    store.audit(
        session,
        session.id,
        "call.proposed",
        subject=call.id,
        actor="model",
        message_id=cause.message_id,
        tool=call.tool,
        call_digest=call_digest,
        plan=PLAN_SAID[plan.action],
        reason_code=plan.reason_code,
        # Why it asks, or why it runs unasked (a rule over its arguments may say none is needed).
        reason=plan.verdict.reason if plan.verdict else None,
        # Or the person's remembered approval that lets it run with no card.
        grant_id=plan.grant.grant_id if plan.grant else None,
    )


def execution_finished(
    store: LedgerStore,
    session: SessionState,
    call: Call,
    claim: ClaimOnRecord,
    closed: ClosureOnRecord,
    report: Envelope,
) -> None:
    """The executor's claim, and the run it finished, in the audit log (the result as a digest)."""
    store.audit(
        session,
        session.id,
        "execution.claimed",
        subject=call.id,
        actor=claim.holder,
        message_id=report.message_id,
        attempt=claim.attempts,
        claimed_at=claim.claimed_at.isoformat() if claim.claimed_at else None,
    )
    store.audit(
        session,
        session.id,
        "execution.finished",
        subject=call.id,
        actor=sender.get(),
        message_id=report.message_id,
        outcome=claim.outcome,
        output_digest=None if closed.output is None else digest_of(closed.output),
        error_digest=None if closed.kind == "output" or closed.reason_text is None else digest_of(closed.reason_text),
    )


def execution_refused(store: LedgerStore, session: SessionState | None, refusal: RefuseExecution) -> None:
    """The executor refused a `tool.execute` it could not verify: the audit log says so, and an operator is told."""
    store.audit(
        session,
        refusal.session_id,
        "execution.refused",
        subject=refusal.call_id,
        actor=sender.get(),
        message_id=refusal.message_id,
        tool=refusal.tool,
        reason_code=refusal.reason_code,
        reason_digest=digest_of(refusal.reason_text),
    )
    store.emit(
        session,
        OperatorAlerted(
            session_id=refusal.session_id,
            causation_id=refusal.message_id,
            call_id=refusal.call_id,
            tool=refusal.tool,
            reason_code=refusal.reason_code,
            reason_text=f"The executor refused to run it: {refusal.reason_text}",
        ),
    )


def shown_arguments(catalogue: ToolCatalogue, call: Call) -> dict[str, Any]:
    spec = catalogue.get(call.tool)
    return spec.shown_arguments(call.arguments) if spec else redact_value(call.arguments)


def closure(
    store: LedgerStore,
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
        store.update("tool_calls", call.id, status="closed")
    call.status = "closed"
    call.closure = closed
    # A person's reason or a deadline are said; what a tool, the model or a parked
    # message produced may echo a secret, so it is kept as a digest.
    said = closed.kind in ("denied", "answered", "expired")
    store.audit(
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
    store.add(
        "closures",
        {
            "call_id": call.id,
            "session_id": session.id,
            "kind": closed.kind,
            "reason_code": closed.reason_code,
            "reason_text": closed.reason_text,
            "output": None if closed.output is None else {"value": closed.output},
            "created_at": store.now,
        },
    )
    store.emit(
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
    store: LedgerStore, session: SessionState, call: Call, closed: ClosureOnRecord, cause: Envelope | None
) -> None:
    alert(store, session, call, closed.reason_code or closed.kind, closed.reason_text or "", cause)


def alert(
    store: LedgerStore,
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
    store.emit(
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
    store: LedgerStore,
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
        append(store, session, entry)
    await step_request(store, session, turn_id, catalogue, cause)


def edited_card(
    store: LedgerStore,
    session: SessionState,
    call: Call,
    request: RequestOnRecord,
    pending_request_ids: list[str],
    cause: Envelope,
    run_id: str,
) -> None:
    """An edit that leaves its request pending (the edited version needs more approvers):
    the request is announced again as its edited version, an `approval.requested` like a
    new request's, so a channel that only listens to events shows the edited card and the
    digest an approval must now carry (the card before names arguments that no longer run:
    its digest is refused, `digest_mismatch`). No response token: the one minted with the
    request still counts once, and a pending edited version needs known people anyway."""
    assert request.card is not None and request.approvals_required is not None
    store.emit(
        session,
        ApprovalRequested(
            session_id=session.id,
            causation_id=_id_of(cause),
            request_id=request.id,
            call_id=call.id,
            step_id=call.step_id,
            card=ApprovalCard.model_validate(request.card),
            args_digest=request.args_digest,
            pending_request_ids=pending_request_ids,
            approvals_required=request.approvals_required,
            expires_at=request.expires_at,
            turn_id=call.turn_id,
            run_id=run_id,
        ),
    )


def arguments_edited(
    store: LedgerStore,
    session: SessionState,
    call: Call,
    original: RequestOnRecord,
    edited: RequestOnRecord,
    response: RespondToApproval,
    authority: Authority,
    *,
    changed: list[str],
    edit: str | None,
    reason: str,
) -> None:
    """An approval's edit, accepted: the call's row, the request's digest, the ledger's seal
    over the call and the card name the edited arguments (`call.arguments`), with the
    count and reason the tool's rule gives them. The count restarts: the approvals of the
    version before no longer count, their rows withdrawn (`restart_count`). The audit log
    keeps digests of both versions, the diff (secrets hidden), the editor and how many
    approvals no longer count (each of them is in the log as `response.accepted`)."""
    arguments = call.arguments
    store.update("tool_calls", call.id, arguments=arguments, args_digest=arguments_fingerprint(arguments))
    store.update(
        "approval_requests",
        edited.id,
        args_digest=edited.args_digest,
        card=edited.card,
        call_seal=authority.seal_request(edited.id, call.id, session.id, call.tool, arguments),
        approvals_required=edited.approvals_required,
        reason=reason,
    )
    if original.approvals:
        store.restart_count(edited.id)
    store.audit(
        session,
        session.id,
        "arguments.edited",
        subject=edited.id,
        actor=response.responder,
        message_id=response.message_id,
        call_id=call.id,
        tool=call.tool,
        original_digest=original.args_digest,
        edited_digest=edited.args_digest,
        changed=changed,
        # How they changed, as the card shows it (secrets hidden): with both digests, the
        # original and the edited arguments as far as anyone may read them.
        edit=edit,
        approvals_required=edited.approvals_required,
        reason=reason,
        # The approvals given for the version before: they no longer count (each is in this log).
        approvals_withdrawn=original.approvals,
    )
