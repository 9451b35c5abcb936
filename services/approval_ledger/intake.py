"""The intake's transitions: a program files a call (`call.file`), claims it when it
runs the call itself (`call.claim`), and reports how it ended (`call.report`); and the
sweep that closes a claim whose lease ended with no result. Each is one transaction
on the ledger's store, as every handler (`handlers.py`); the rules are in
`intake_rules`.

A filed call lives in a session of its own (`filed_session_id(program, call id)`,
provider `intake`): one turn, one step, one call, and its request when a person must
approve. No model ever steps in it; when the call closes, the turn completes.
"""

from __future__ import annotations

import logging
from typing import Any

from shared.audit import digest_of
from shared.consuming import sender
from shared.messages import (
    ClaimCall,
    Envelope,
    FileCall,
    FiledBy,
    ReportCallResult,
    RespondToApproval,
    TurnCompleted,
    mint,
)
from shared.observability import counting_on_commit
from shared.signatures import arguments_fingerprint

from . import domain, intake_rules, records
from .intake_rules import INTAKE, FilingPlan
from .store import LedgerStore, SessionState, StepCalls

log = logging.getLogger("signoff.ledger")


def is_filed(session: SessionState | None) -> bool:
    """Whether the session holds a filed call (no model steps in it)."""
    return session is not None and session.provider == INTAKE


def judge(ledger: Any, message: Envelope) -> domain.Refusal | None:
    """What is refused before the message may open a session: a filing the catalogue
    does not admit, or a program the sending channel may not speak for."""
    if not isinstance(message, FileCall | ClaimCall | ReportCallResult):
        return None
    if ledger.check_senders:
        channel = ledger.topology.channel_of(sender.get())
        refused = domain.judge_speaker(ledger.authority.channels, channel, message.program, "file or run calls")
        if refused:
            return refused
    if isinstance(message, FileCall):
        judged = intake_rules.judge_filing(ledger.catalogue, message)
        return judged if isinstance(judged, domain.Refusal) else None
    return None


async def file_call(ledger: Any, store: LedgerStore, session: SessionState | None, command: FileCall) -> None:
    assert session is not None, "a filing opens its session"
    fingerprint = arguments_fingerprint(command.arguments)
    filed = await store.filed_call_by_caller(command.program, command.caller_call_id)
    if filed is not None:
        refused = intake_rules.judge_refiling(filed, fingerprint)
        if refused:
            records.refusal(store, session, command, refused)
            return
        # The first filing stands; this one is on record as the same call, filed again.
        store.audit(
            session,
            session.id,
            "call.refiled",
            subject=filed.call_id,
            actor=command.program,
            message_id=command.message_id,
        )
        return
    plan = intake_rules.judge_filing(ledger.catalogue, command)
    assert not isinstance(plan, domain.Refusal), "judged before the session opened"
    _record_filing(ledger, store, session, command, plan, fingerprint)


def _record_filing(
    ledger: Any, store: LedgerStore, session: SessionState, command: FileCall, plan: FilingPlan, fingerprint: str
) -> None:
    """One turn, one step (done: no model steps here), one call; its filing row; then
    ask a person, or run it, as the tool's rule says."""
    turn_id, step_id = mint("trn"), mint("stp")
    store.add(
        "turns",
        {
            "id": turn_id,
            "session_id": session.id,
            "status": "running",
            "final_text": None,
            "started_by": command.program,
            "created_at": store.now,
            "completed_at": None,
        },
    )
    store.add(
        "steps",
        {
            "id": step_id,
            "session_id": session.id,
            "turn_id": turn_id,
            "status": "completed",
            "created_at": store.now,
            "completed_at": store.now,
        },
    )
    # The program is the session's starter: a tool that forbids its starter's approval
    # (separation of duties) never lets the filing program approve its own call.
    records.session_starter(store, session, command.program)
    call = domain.Call(
        id=mint("call"),
        session_id=session.id,
        step_id=step_id,
        turn_id=turn_id,
        provider_call_id=command.caller_call_id,
        tool=plan.tool,
        arguments=command.arguments,
        idempotency_key=mint("idk"),
        status="executing",
    )
    request_id = mint("apr") if plan.asks else None
    store.audit(
        session,
        session.id,
        "call.filed",
        subject=call.id,
        actor=command.program,
        message_id=command.message_id,
        origin=command.origin,
        program=command.program,
        caller_call_id=command.caller_call_id,
        thread=command.thread,
        tool=plan.tool,
        declared_by_caller=plan.declared_by_caller,
        runs=plan.spec.runs,
        summary_digest=digest_of(command.summary) if command.summary else None,
        call_digest=ledger.authority.digest(call.id, call.tool, plan.spec.version, call.arguments),
        plan="ask" if plan.asks else "run",
        reason=plan.verdict.reason,
    )
    if plan.asks:
        assert request_id is not None
        call.status = "awaiting_approval"
        filed_by = FiledBy(
            program=command.program,
            origin=command.origin,
            caller_call_id=command.caller_call_id,
            thread=command.thread,
            summary=command.summary,
            declared_by_caller=plan.declared_by_caller,
        )
        card = plan.spec.card(call.arguments, reason=plan.verdict.reason).model_copy(update={"filed": filed_by})
        records.new_call(store, call, 0, fingerprint)
        records.approval_request(
            store,
            session,
            call,
            request_id,
            card,
            ledger.authority.digest(request_id, call.tool, plan.spec.version, call.arguments),
            [request_id],
            command,
            verdict=plan.verdict,
            expires_at=domain.deadline(store.now, plan.spec.expires_after_seconds, ledger.approval_timeout),
            escalate_at=domain.escalation_time(store.now, plan.spec),
            attempt=None,
            run_id=ledger.run_id,
            call_seal=ledger.authority.seal_request(request_id, call.id, session.id, call.tool, call.arguments),
        )
        session.status = "waiting"
    else:
        records.new_call(store, call, 0, fingerprint)
        session.status = "running"
    store.add(
        "filed_calls",
        {
            "id": call.id,
            "session_id": session.id,
            "program": command.program,
            "caller_call_id": command.caller_call_id,
            "origin": command.origin,
            "thread": command.thread,
            "summary": command.summary,
            "tool": command.tool,
            "args_fingerprint": fingerprint,
            "runs": plan.spec.runs,
            "request_id": request_id,
            "created_at": store.now,
            "claim_token_hash": None,
            "claim_holder": None,
            "claimed_at": None,
            "lease_expires_at": None,
            "reported_at": None,
            "verdict": None,
        },
    )
    if not plan.asks and plan.spec.runs == "signoff":
        records.execution(store, session, call, command, ledger.authority, request_id=None, stored=False)
    session.updated_at = store.now


def approved(
    ledger: Any,
    store: LedgerStore,
    session: SessionState,
    call: domain.Call,
    request: domain.RequestOnRecord,
    response: RespondToApproval,
) -> bool:
    """A filed call's request decided as approved: the ledger signs what was approved.
    True: the caller runs it (it claims the call next, the call `executing` meanwhile),
    so no `tool.execute` is sent."""
    _seal(ledger, store, session, call, request, response, "approve")
    spec = ledger.catalogue.get(call.tool)
    if spec is None or spec.runs != "caller":
        return False
    store.update("tool_calls", call.id, status="executing")
    call.status = "executing"
    return True


def not_approved(
    ledger: Any,
    store: LedgerStore,
    session: SessionState,
    call: domain.Call,
    request: domain.RequestOnRecord,
    response: RespondToApproval,
) -> None:
    """A filed call's request denied, or answered in the tool's place: the ledger signs
    that too (with the person's reason or answer), so the caller can tell it from a
    call nobody decided."""
    _seal(ledger, store, session, call, request, response, response.decision)


def _seal(
    ledger: Any,
    store: LedgerStore,
    session: SessionState,
    call: domain.Call,
    request: domain.RequestOnRecord,
    response: RespondToApproval,
    decision: str,
) -> None:
    """The verdict, sealed with the ledger's key and kept on the filing: what a person
    decided, with the arguments that run (edited ones included)."""
    card = request.card or {}
    claims = intake_rules.verdict_claims(
        filed_call_id=call.id,
        program=session.started_by or "",
        caller_call_id=call.provider_call_id,
        request_id=request.id,
        tool=call.tool,
        decision=decision,
        arguments=call.arguments,
        args_fingerprint=arguments_fingerprint(call.arguments),
        responder=response.responder,
        reason=response.reason,
        message=response.message if response.decision == "respond" else "",
        edited_by=card.get("edited_by"),
        decided_at=store.now,
    )
    store.update("filed_calls", call.id, verdict=ledger.authority.seal_verdict(claims))


def resumed(store: LedgerStore, session: SessionState, turn_id: str, resumption: domain.Resumption, cause) -> None:
    """A filed call's session after a transition: while its call is open it waits or
    runs; once closed, its turn completes (no model step follows)."""
    session.status = resumption.status
    if resumption.entries is None:
        return
    completed = TurnCompleted(
        session_id=session.id, causation_id=cause.message_id if cause is not None else None, turn_id=turn_id, text=""
    )
    records.end_turn(store, session, completed)


async def caller_claim(store: LedgerStore, call: domain.Call) -> domain.ClaimOnRecord | None:
    """The caller's live claim on a filed call, as a cancellation weighs it (the caller may
    be running it: an outward call then closes as outcome unknown); None: not claimed."""
    filed = await store.filed_call(call.id)
    if filed is None or filed.claim_token_hash is None or filed.reported_at is not None:
        return None
    return domain.ClaimOnRecord("claimed", holder=filed.claim_holder or filed.program, claimed_at=filed.claimed_at)


async def claim_call(ledger: Any, store: LedgerStore, session: SessionState | None, command: ClaimCall) -> None:
    filed = await store.filed_call(command.call_id) if session else None
    step = await store.call_and_siblings(command.call_id, command.session_id) if filed else StepCalls([], False)
    call = step.find(command.call_id)
    judged = intake_rules.judge_claim(filed, call, command, store.now)
    if isinstance(judged, domain.Refusal):
        records.refusal(store, session, command, judged)
        return
    assert session is not None and filed is not None
    lease = intake_rules.lease_end(store.now, command.lease_seconds)
    if judged == "grant":
        store.update(
            "filed_calls",
            filed.call_id,
            claim_token_hash=command.claim_token_hash,
            claim_holder=command.holder,
            claimed_at=store.now,
            lease_expires_at=lease,
        )
    store.audit(
        session,
        session.id,
        "call.claimed" if judged == "grant" else "call.claimed.again",
        subject=filed.call_id,
        actor=command.program,
        message_id=command.message_id,
        holder=command.holder,
        lease_expires_at=lease.isoformat() if judged == "grant" else None,
    )


async def report_call_result(
    ledger: Any, store: LedgerStore, session: SessionState | None, command: ReportCallResult
) -> None:
    filed = await store.filed_call(command.call_id) if session else None
    step = await store.call_and_siblings(command.call_id, command.session_id) if filed else StepCalls([], False)
    call = step.find(command.call_id)
    refused = intake_rules.judge_report(filed, call, command, store.now)
    if refused:
        records.refusal(store, session, command, refused)
        return
    assert session is not None and filed is not None and call is not None
    store.update("filed_calls", filed.call_id, reported_at=store.now)
    if command.outcome == "output":
        closed = domain.ClosureOnRecord("output", output=command.output)
    else:
        closed = domain.ClosureOnRecord("error", reason_code="tool_error", reason_text=command.error or "")
    store.audit(
        session,
        session.id,
        "call.reported",
        subject=call.id,
        actor=command.program,
        message_id=command.message_id,
        outcome=command.outcome,
    )
    records.closure(store, session, call, closed, command)
    session.updated_at = store.now
    resumed(store, session, call.turn_id, domain.resume(step.calls, session_waits=False), command)


async def lapse_claim(ledger: Any, call_id: str, session_id: str) -> bool:
    """Close a filed call whose claim's lease ended with no result: outcome unknown, and
    a person is asked (an operator alert), never a second grant. One unit of work under
    the session's lock: two ledgers sweeping at once close it once. True: closed now."""
    with counting_on_commit() as committed:
        async with ledger.unit_of_work() as store:
            session = await store.lock_session(session_id)
            filed = await store.filed_call(call_id) if session else None
            step = await store.call_and_siblings(call_id, session_id)
            call = step.find(call_id)
            if session is None or filed is None or not intake_rules.may_lapse(filed, call, store.now):
                return False
            assert call is not None
            closed = domain.ClosureOnRecord(
                "outcome_unknown", reason_code="claim_lapsed", reason_text=intake_rules.lapsed_text(filed)
            )
            records.closure(store, session, call, closed, None)
            records.operator_alert(store, session, call, closed, None)
            session.updated_at = store.now
            resumed(store, session, call.turn_id, domain.resume(step.calls, session_waits=False), None)
            await store.commit()
        committed()
        log.warning("filed call %s: its claim lapsed with no result; outcome unknown", call_id)
        return True
