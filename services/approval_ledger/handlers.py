"""One handler per inbound message; each is one transaction on the ledger's store
(the port, `store.py`) that reads as load (the store's typed reads) → decide
(`domain`) → record (`records`, handing the writes to the store, applied at
commit). Handlers orchestrate only: every rule is in `domain`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from shared import faults
from shared.audit import digest_of
from shared.catalogue import ToolCatalogue
from shared.consuming import sender
from shared.dead_letters import UNPROVEN, ParkedMessage, proven_sender
from shared.messages import (
    ApprovalCard,
    CancelTurn,
    Envelope,
    FileCall,
    ModelStepCompleted,
    ProposedToolCall,
    ProviderAttempt,
    RefuseExecution,
    RespondToApproval,
    RevokeGrant,
    StartTurn,
    ToolExecuted,
    TranscriptEntry,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    mint,
)
from shared.observability import (
    LEDGER_TRANSACTION,
    TURNS_BOUNDED,
    counting_on_commit,
    timed,
    when_committed,
)
from shared.signatures import arguments_fingerprint
from shared.topology import Topology

from . import decision_rules, domain, grants, intake, records
from .authority import Authority
from .intake_rules import INTAKE
from .store import NO_OPEN_TURN, Duplicate, LedgerStore, SessionState, StepCalls

log = logging.getLogger("signoff.ledger")


@dataclass
class Ledger:
    # Opens one transaction on the ledger's store (the port, `store.py`): a database's
    # (`store_sql.database_store`), or a memory database's in the handlers' unit tests.
    open_store: Callable[[], LedgerStore]
    topology: Topology
    catalogue: ToolCatalogue
    authority: Authority
    default_provider: str
    # With broker identities, a message counts only from the service or channel that may send it.
    check_senders: bool
    # Seconds a request waits for a decision unless its tool says otherwise.
    approval_timeout: float = 24 * 3600.0
    # How much of a tool's result the model reads (the closure keeps all of it).
    tool_output_model_chars: int = domain.OUTPUT_LIMIT
    # How far one turn may go before it ends as `step_limit`.
    turn_bounds: domain.TurnBounds = field(default_factory=domain.TurnBounds)
    # This ledger process's run, recorded on each request it commits (provenance).
    run_id: str = field(default_factory=lambda: mint("run"))

    def unit_of_work(self) -> LedgerStore:
        return self.open_store()


def transition(handler):
    """Run a handler as one unit of work: lock the session, record the message in
    the inbox (a duplicate ends here, silently), refuse it if its sender may not
    send it, else apply; commit state and outbox.

    `apply.within(ledger, store, message)` is the same transition on a unit of work
    that is already open and that the caller commits: a group commit applies
    several that way in one transaction (`group_commit.py`). It raises Duplicate."""

    @functools.wraps(handler)
    async def apply(ledger: Ledger, message: Envelope) -> None:
        # Counts implied by the transition move only once it commits (shared/observability.py).
        with counting_on_commit() as committed, timed(LEDGER_TRANSACTION.labels(message.type)):
            async with ledger.unit_of_work() as store:
                try:
                    await _within(handler, ledger, store, message)
                    await store.commit()
                except Duplicate:
                    return
            committed()

    apply.within = functools.partial(_within, handler)  # type: ignore[attr-defined]
    return apply


async def _within(handler, ledger: Ledger, store: LedgerStore, message: Envelope) -> None:
    """One transition in a unit of work the caller commits: receive and lock, then refuse or apply."""
    refused = domain.refuse_sender(message.type, sender.get(), ledger.topology) if ledger.check_senders else None
    refused = refused or _unspoken_for(ledger, message) or intake.judge(ledger, message)
    # A turn opens its session, and so does a filed call (in a session of its own).
    is_turn = isinstance(message, StartTurn | FileCall)
    named = message.provider if isinstance(message, StartTurn) else INTAKE if isinstance(message, FileCall) else None
    provider = domain.provider_of_new_session(is_turn, refused, named, ledger.default_provider)
    session = await store.receive_and_lock(message, create_with_provider=provider)
    if refused:
        records.refusal(store, session, message, refused)
    else:
        await handler(ledger, store, session, message)
    if message.message_id not in store.rejected:
        # One line per transition at INFO, once it is durable (a refusal logs its own).
        when_committed(
            functools.partial(
                log.info,
                "applied %s %s: session %s is %s",
                message.type,
                message.message_id,
                message.session_id,
                session.status if session is not None else "unknown",
            )
        )


def _unspoken_for(ledger: Ledger, message: Envelope) -> domain.Refusal | None:
    """A turn's starter and a cancel's canceller must be principals the sending channel
    may assert (`domain.judge_speaker`), judged before a refused turn could open a
    session. Without broker identities every sender is one user: no channel is known,
    and the names are taken as said (docs/design.md, "Trust boundaries")."""
    if not ledger.check_senders:
        return None
    if isinstance(message, StartTurn):
        principal, doing = message.started_by, "start a turn"
    elif isinstance(message, CancelTurn):
        principal, doing = message.cancelled_by, "cancel a turn"
    elif isinstance(message, RevokeGrant):
        principal, doing = message.revoked_by, "revoke a grant"
    else:
        return None
    return domain.judge_speaker(ledger.authority.channels, _sending_channel(ledger), principal, doing)


def _sending_channel(ledger: Ledger) -> str | None:
    """The channel whose broker user sent the message at hand (RabbitMQ vouches for it)."""
    return ledger.topology.channel_of(sender.get())


async def _start_turn(ledger: Ledger, store: LedgerStore, session: SessionState | None, command: StartTurn) -> None:
    assert session is not None, "a turn opens its session"
    if command.idempotency_key is not None:
        earlier = await store.turn_of_key(session.id, command.idempotency_key)
        if earlier is not None:
            refused = domain.judge_repeated_start(earlier, command.started_by, digest_of(command.text))
            if refused:
                records.refusal(store, session, command, refused)
            else:
                records.start_repeated(store, session, command, earlier.turn_id)
            return
    busy = domain.refuse_turn(session.status)
    refused = busy and domain.refuse_turn(session.status, (await store.open_turn(session.id)).turn_id)
    if refused:
        records.refusal(store, session, command, refused)
        return
    turn_id = records.new_turn(store, session, command)
    records.session_starter(store, session, domain.session_starter(session.started_by, command.started_by))
    records.append(store, session, TranscriptEntry(role="user", text=command.text))
    session.updated_at = store.now
    await records.step_request(store, session, turn_id, ledger.catalogue, command)


async def _model_step_completed(
    ledger: Ledger, store: LedgerStore, session: SessionState | None, report: ModelStepCompleted
) -> None:
    loaded = await store.step(report.step_id, report.session_id)
    judged = domain.judge_step_report(loaded.step if session else None, report.session_id, report.attempts)
    if judged.refusal:
        records.refusal(store, session, report, judged.refusal)
        return
    assert session is not None and loaded.step is not None
    step = loaded.step
    records.attempts(store, step, report.message_id, judged.attempts)
    if judged.verdict == "duplicate":
        log.info("discarded a second report for step %s", step.id)
        return
    records.step_completed(store, session, step)
    failure = domain.provider_failure(report.error)
    if failure is not None:
        code, text = failure
        failed = TurnFailed(
            session_id=session.id,
            causation_id=report.message_id,
            turn_id=step.turn_id,
            reason_code=code,
            reason_text=text,
        )
        records.end_turn(store, session, failed)
        return
    calls = [_new_call(session, step, proposed) for proposed in report.tool_calls]
    records.assistant_entry(store, session, report.text, calls, ledger.catalogue)
    if not calls:
        completed = TurnCompleted(
            session_id=session.id, causation_id=report.message_id, turn_id=step.turn_id, text=report.text
        )
        records.end_turn(store, session, completed)
        return
    earlier = await store.pending_request_ids(session.id) if loaded.session_waits else []
    # The session's grants: a call one covers runs with no card (approve and remember).
    remembered = await store.grants(session.id)
    pending = _plan_and_record_calls(ledger, store, session, calls, earlier, report, remembered)
    resumed = domain.resume(calls, session_waits=bool(pending), output_limit=ledger.tool_output_model_chars)
    await _resume(
        ledger, store, session, step.turn_id, resumed, report, last_words=report.text, spent_now=judged.attempts
    )


async def _resume(
    ledger: Ledger,
    store: LedgerStore,
    session: SessionState,
    turn_id: str,
    resumed: domain.Resumption,
    cause: Envelope | None,
    *,
    last_words: str = "",
    spent_now: tuple[tuple[ProviderAttempt, str], ...] = (),
) -> None:
    """The step's calls as this transition leaves them; a step done asks for the next
    one, unless the turn reached its bound: then it ends (`step_limit`), an operator
    is told, and the provider is not called again. `spent_now`: the provider attempts
    this transition records (not yet in the rows it reads)."""
    if intake.is_filed(session):
        intake.resumed(store, session, turn_id, resumed, cause)
        return
    if resumed.entries is not None and (ledger.turn_bounds.steps or ledger.turn_bounds.tokens):
        spent = domain.spent_with(await store.turn_spend(session.id, turn_id), spent_now)
        reached = domain.turn_bound_reached(ledger.turn_bounds, spent, last_words)
        if reached is not None:
            for entry in resumed.entries:
                records.append(store, session, entry)
            _end_bounded_turn(store, session, turn_id, reached, cause)
            return
    await records.resumption(store, session, turn_id, resumed, ledger.catalogue, cause)


def _end_bounded_turn(
    store: LedgerStore, session: SessionState, turn_id: str, reached: domain.BoundReached, cause: Envelope | None
) -> None:
    failed = TurnFailed(
        session_id=session.id,
        causation_id=cause.message_id if cause is not None else None,
        turn_id=turn_id,
        reason_code=domain.STEP_LIMIT,
        reason_text=reached.text,
    )
    records.end_turn(store, session, failed)
    records.alert(store, session, None, domain.STEP_LIMIT, reached.text, cause, turn_id=turn_id)
    when_committed(TURNS_BOUNDED.labels(reached.bound).inc)
    log.warning("turn %s of session %s ended at its bound: %s", turn_id, session.id, reached.bound)


def _new_call(session: SessionState, step: domain.Step, proposed: ProposedToolCall) -> domain.Call:
    return domain.Call(
        id=mint("call"),
        session_id=session.id,
        step_id=step.id,
        turn_id=step.turn_id,
        provider_call_id=proposed.provider_call_id,
        tool=proposed.name,
        arguments=proposed.arguments,
        idempotency_key=mint("idk"),
        status="executing",
    )


def _plan_and_record_calls(
    ledger: Ledger,
    store: LedgerStore,
    session: SessionState,
    calls: list[domain.Call],
    earlier: list[str],
    cause: ModelStepCompleted,
    remembered: list[decision_rules.Grant],
) -> list[str]:
    """Ask, run or close each new call as planned; the session's pending request ids after it.

    The session waits on every pending request and each `approval.requested` names
    them all (invariant 5). Earlier requests come first; this step's are minted in
    ascending order so that the ledger's order (created_at, id) is the model's. A call
    one of the session's grants (`remembered`) covers runs with no card."""
    plans = domain.plan_calls(cause.tool_calls, ledger.catalogue, remembered, session_id=session.id, at=store.now)
    asks = [call for plan, call in zip(plans, calls, strict=True) if plan.action == "ask"]
    request_ids = dict(zip((call.id for call in asks), sorted(mint("apr") for _ in asks), strict=True))
    pending = earlier + list(request_ids.values())
    for position, (plan, call) in enumerate(zip(plans, calls, strict=True)):
        _record_call(ledger, store, session, plan, call, cause, request_ids.get(call.id), pending)
        records.new_call(store, call, position, arguments_fingerprint(call.arguments))
    return pending


def _record_call(
    ledger: Ledger,
    store: LedgerStore,
    session: SessionState,
    plan: domain.CallPlan,
    call: domain.Call,
    cause: ModelStepCompleted,
    request_id: str | None,
    pending: list[str],
) -> None:
    """One new call: proposed (in the audit log), then closed, asked or run as planned."""
    version = plan.spec.version if plan.spec else ""
    call_digest = ledger.authority.digest(call.id, call.tool, version, call.arguments)
    records.call_proposed(store, session, call, plan, cause, call_digest=call_digest)
    if plan.action == "close":
        closed = domain.ClosureOnRecord("error", reason_code=plan.reason_code, reason_text=plan.reason_text)
        records.closure(store, session, call, closed, cause, stored=False)
    elif plan.action == "ask":
        assert request_id is not None
        _ask(ledger, store, session, plan, call, request_id, pending, cause)
    else:
        if plan.grant is not None:
            grants.used(store, session, call, plan.grant, cause.message_id)
        records.execution(
            store, session, call, cause, ledger.authority, request_id=None, stored=False, grant_id=call.grant_id
        )


def _ask(
    ledger: Ledger,
    store: LedgerStore,
    session: SessionState,
    plan: domain.CallPlan,
    call: domain.Call,
    request_id: str,
    pending: list[str],
    cause: ModelStepCompleted,
) -> None:
    """The call waits for approval: its request, with the card, digest and seal of its arguments."""
    assert plan.spec is not None and plan.verdict is not None
    call.status = "awaiting_approval"
    digest = ledger.authority.digest(request_id, call.tool, plan.spec.version, call.arguments)
    records.approval_request(
        store,
        session,
        call,
        request_id,
        plan.spec.card(call.arguments, reason=plan.verdict.reason),
        digest,
        pending,
        cause,
        verdict=plan.verdict,
        expires_at=domain.deadline(store.now, plan.spec.expires_after_seconds, ledger.approval_timeout),
        escalate_at=domain.escalation_time(store.now, plan.spec),
        attempt=domain.producing_attempt(cause.attempts),
        run_id=ledger.run_id,
        call_seal=ledger.authority.seal_request(request_id, call.id, session.id, call.tool, call.arguments),
    )


async def _respond_to_approval(
    ledger: Ledger, store: LedgerStore, session: SessionState | None, response: RespondToApproval
) -> None:
    authority = ledger.authority
    refused = domain.authenticate_response(response, authority.channels, at=store.now, window=authority.response_window)
    if ledger.check_senders:
        refused = refused or domain.judge_key_channel(response.key_id, _sending_channel(ledger))
    # The request first: on a database its read carries whether the response was used before.
    request, step = await store.request_and_calls(
        response.request_id, response.session_id, response.responder, response_id=response.response_id
    )
    refused = refused or (domain.REPLAYED if await store.response_used(response.response_id) else None)
    refused = refused or domain.judge_response(request if session else None, response, at=store.now)
    policy = (
        domain.approval_policy(
            ledger.catalogue, request.tool, escalated=request.escalated, recorded_required=request.approvals_required
        )
        if request
        else domain.NOBODY
    )
    edition: _Edition | None = None
    if request is not None and not refused and response.decision == "approve" and response.edited_arguments is not None:
        # An edit is judged first: if it changes the arguments, the approver is judged for
        # the edited version (its own count; a new version, so one who approved before may).
        judged = _judge_edit(ledger, request, step, response)
        if isinstance(judged, domain.Refusal):
            refused = judged
        elif judged is not None:
            edition = judged
            request = edition.request
            policy = dataclasses.replace(policy, approvals_required=edition.request.approvals_required or 1)
    refused = refused or (domain.judge_approver(policy, request, response) if request else None)
    # A remember the ledger may not give refuses the whole response, before anything of it
    # is recorded: nothing is edited, counted or run.
    refused = refused or (_judge_remember(ledger, policy, request, response) if request else None)
    if refused:
        records.refusal(store, session, response, refused)
        return
    assert session is not None and request is not None
    if response.decision == "approve":
        altered = _judge_arguments_on_record(ledger, request, step, response)
        if altered:
            await _close_altered(ledger, store, session, request, step, response, altered)
            return
        if edition is not None:
            _edit(ledger, store, session, edition, step, response)
    counted = domain.tally(policy, request, response.decision)
    records.accepted(store, session, request, response, counted)
    if not counted.decides:
        if edition is not None:
            # Channels that only listen to events see the edited card and its digest (the
            # one an approval must now carry), like a new request's, without a token.
            call = step.find(request.call_id)
            assert call is not None
            records.edited_card(
                store, session, call, request, await store.pending_request_ids(session.id), response, ledger.run_id
            )
        records.approval_counted(store, session, request, response, counted)
        return
    await _decide(ledger, store, session, request, step, response, counted.required)


def _judge_remember(
    ledger: Ledger, policy: domain.ApprovalPolicy, request: domain.RequestOnRecord, response: RespondToApproval
) -> domain.Refusal | None:
    """Whether the grant the response asks for may be given (`domain.judge_remember`),
    judged on the request as it stands: only an approval that would decide it may remember."""
    decides = domain.tally(policy, request, response.decision).decides
    return domain.judge_remember(ledger.catalogue.get(request.tool), request, response, decides=decides)


def _judge_arguments_on_record(
    ledger: Ledger, request: domain.RequestOnRecord, step: StepCalls, response: RespondToApproval
) -> domain.Refusal | None:
    """The request's digest recomputed from the call's row as it stands (what an approval
    would seal and run), against the digest the person approved (invariant 6)."""
    call = step.find(request.call_id)
    spec = ledger.catalogue.get(request.tool)
    if call is None or spec is None:
        return domain.ALTERED
    on_record = ledger.authority.digest(request.id, call.tool, spec.version, call.arguments)
    return domain.judge_arguments(on_record, response.args_digest)


@dataclass(frozen=True)
class _Edition:
    """An edit that changes the arguments, judged and not yet recorded: the request as
    its edited version (`domain.edited_version`), what the edit changed, the tool's
    verdict for the edited arguments and their card."""

    request: domain.RequestOnRecord
    original: domain.RequestOnRecord
    judged: decision_rules.EditAccepted
    verdict: decision_rules.Verdict
    card: ApprovalCard


def _judge_edit(
    ledger: Ledger, request: domain.RequestOnRecord, step: StepCalls, response: RespondToApproval
) -> _Edition | domain.Refusal | None:
    """Edit before approve: the person's edited arguments, judged by the tool's
    declaration and schema (`decision_rules.judge_edit`). None: the edit changes
    nothing (a plain approval), or the call is gone (the digest check closes it)."""
    call = step.find(request.call_id)
    spec = ledger.catalogue.get(request.tool)
    if call is None or spec is None or response.edited_arguments is None:
        return None
    judged = decision_rules.judge_edit(spec, call.arguments, response.edited_arguments)
    if isinstance(judged, decision_rules.EditRefused):
        return domain.Refusal(judged.reason, judged.detail)
    if not judged.changed:
        return None
    decided = decision_rules.verdict(spec, judged.arguments)
    digest = ledger.authority.digest(request.id, call.tool, spec.version, judged.arguments)
    card = spec.card(judged.arguments, reason=decided.reason).model_copy(
        update={"edited_by": response.responder, "edit": judged.diff[:2000]}
    )
    if request.card and request.card.get("filed"):
        # A filed call's card keeps saying who filed it.
        card = ApprovalCard.model_validate({**card.model_dump(mode="json"), "filed": request.card["filed"]})
    edited = domain.edited_version(request, digest, decided.approvals_required, card.model_dump(mode="json"))
    return _Edition(edited, request, judged, decided, card)


def _edit(
    ledger: Ledger,
    store: LedgerStore,
    session: SessionState,
    edition: _Edition,
    step: StepCalls,
    response: RespondToApproval,
) -> None:
    """An accepted edit becomes the call's (`records.arguments_edited`): the call sent to
    the executor, its row, the request's digest, the ledger's seal and the card name the
    edited arguments, with the count and reason the tool's rule gives them, and the
    count restarts (approvals of the version before no longer count)."""
    call = step.find(edition.request.call_id)
    assert call is not None
    call.arguments = edition.judged.arguments
    records.arguments_edited(
        store,
        session,
        call,
        edition.original,
        edition.request,
        response,
        ledger.authority,
        changed=list(edition.judged.changed),
        edit=edition.card.edit,
        reason=edition.verdict.reason,
    )


async def _close_altered(
    ledger: Ledger,
    store: LedgerStore,
    session: SessionState,
    request: domain.RequestOnRecord,
    step: StepCalls,
    response: RespondToApproval,
    refused: domain.Refusal,
) -> None:
    """The call's row no longer holds what the person approved: nothing is decided or
    run, the request and its call close honestly, an operator is told, and the step
    resumes if it can."""
    call = step.find(request.call_id)
    assert call is not None, f"request {request.id} without its call"
    log.error("call %s: its arguments on record differ from the ones approved in %s", call.id, request.id)
    records.refusal(store, session, response, refused)
    records.request_closed(store, request, "altered")
    records.closure(store, session, call, domain.closure_of_altered(), response)
    records.alert(store, session, call, refused.reason_code, refused.reason_text, response)
    session.updated_at = store.now
    await _resume_step(ledger, store, session, step, call.turn_id, response)


async def _decide(
    ledger: Ledger,
    store: LedgerStore,
    session: SessionState,
    request: domain.RequestOnRecord,
    step: StepCalls,
    response: RespondToApproval,
    required: int,
) -> None:
    """The request is decided by this response: an approval runs the call (and, asked
    to, is remembered as a grant for calls needing no more than `required` approvers),
    a denial closes it with the person's reason, an answer in the tool's place with their
    message (the call does not run); then the step resumes if it can."""
    call = step.find(request.call_id)
    assert call is not None, f"request {request.id} without its call"
    call.note = domain.note_of(response, edit=domain.edit_of(request.card))
    status = domain.request_status_after(response.decision)
    records.decision(store, session, request, response, status=status, message=call.note.message if call.note else "")
    session.updated_at = store.now
    filed = intake.is_filed(session)
    if response.decision == "approve":
        spec = ledger.catalogue.get(request.tool)
        if response.remember is not None and spec is not None:
            grants.remembered(store, session, ledger.authority, spec, request, response, approvals_required=required)
        if filed and intake.approved(ledger, store, session, call, request, response):
            pass  # its caller runs it: it claims the call next (`call.claim`); nothing goes to the executor
        else:
            records.execution(store, session, call, response, ledger.authority, request_id=request.id)
    else:
        if filed:
            intake.not_approved(ledger, store, session, call, request, response)
        records.closure(store, session, call, domain.closure_of_decision(response), response)
    await _resume_step(ledger, store, session, step, call.turn_id, response)


async def _resume_step(
    ledger: Ledger, store: LedgerStore, session: SessionState, step: StepCalls, turn_id: str, cause: Envelope | None
) -> None:
    """A call of the step closed or runs now: the step resumes if it can (`_resume`)."""
    resumed = domain.resume(step.calls, session_waits=step.session_waits, output_limit=ledger.tool_output_model_chars)
    await _resume(ledger, store, session, turn_id, resumed, cause)


async def _tool_executed(
    ledger: Ledger, store: LedgerStore, session: SessionState | None, report: ToolExecuted
) -> None:
    step = await store.call_and_siblings(report.call_id, report.session_id)
    call = step.find(report.call_id)
    verdict = domain.judge_tool_report(call if session else None, report.session_id)
    if verdict == "unknown":
        records.refusal(store, session, report, domain.UNKNOWN_CALL)
        return
    assert session is not None and call is not None
    if verdict == "stale":
        # Already closed (a repeated report) or never approved: nothing to do,
        # but the inbox row keeps it from being looked at again.
        log.info("ignored a report for call %s in status %s", call.id, call.status)
        return
    claim = await _finished_claim(ledger, store, session, call, report)
    if claim is None:
        return
    closed = domain.closure_of_claim(claim)
    records.execution_finished(store, session, call, claim, closed, report)
    records.closure(store, session, call, closed, report)
    if domain.needs_operator(closed):
        records.operator_alert(store, session, call, closed, report)
    session.updated_at = store.now
    await _resume_step(ledger, store, session, step, call.turn_id, report)


async def _finished_claim(
    ledger: Ledger, store: LedgerStore, session: SessionState, call: domain.Call, report: ToolExecuted
) -> domain.ClaimOnRecord | None:
    """The result is the one the executor recorded in its claim, taken under the ledger's
    own authorization of this call: the report only says it is there (and may be forged).
    None: the report is refused, and an operator told."""
    claim = await store.claim(call.id)
    sealed = claim is not None and ledger.authority.sealed_claim(
        claim.authorization, call_id=call.id, session_id=call.session_id, tool=call.tool, arguments=call.arguments
    )
    refused = domain.judge_claim(claim, sealed=sealed)
    if refused:
        log.warning("refused a report for call %s: %s", call.id, refused.reason_code)
        records.refusal(store, session, report, refused)
        records.alert(
            store, session, call, refused.reason_code, f"A tool.completed was refused: {refused.reason_text}", report
        )
        return None
    return claim


async def _execution_refused(
    ledger: Ledger, store: LedgerStore, session: SessionState | None, refusal: RefuseExecution
) -> None:
    """The executor refused a `tool.execute` it could not verify: nothing ran, and
    only a person can tell whether someone is forging commands."""
    log.warning("the executor refused call %s: %s", refusal.call_id, refusal.reason_code)
    records.execution_refused(store, session, refusal)


async def expire_request(ledger: Ledger, request_id: str, session_id: str) -> bool:
    """Close one request whose deadline passed, if it still waits: its call closes as
    expired, the model is told when the step resumes, and events say so. One unit of
    work under the session's lock, so a sweep killed half-way and run again, or two
    ledgers sweeping at once, close each request once. True: it was closed now."""
    with counting_on_commit() as committed:
        closed = await _expire_request(ledger, request_id, session_id)
        if closed:
            committed()
        return closed


async def _expire_request(ledger: Ledger, request_id: str, session_id: str) -> bool:
    async with ledger.unit_of_work() as store:
        session = await store.lock_session(session_id)
        request, step = await store.request_and_calls(request_id, session_id, responder="")
        if session is None or request is None or not domain.may_expire(request, store.now):
            return False
        call = step.find(request.call_id)
        assert call is not None, f"request {request.id} without its call"
        records.expiry(store, session, request)
        records.closure(store, session, call, domain.closure_of_expiry(request), None)
        session.updated_at = store.now
        await _resume_step(ledger, store, session, step, call.turn_id, None)
        await store.commit()
        return True


async def escalate_request(ledger: Ledger, request_id: str, session_id: str) -> bool:
    """Announce a request nobody decided in its tool's escalation time again, to the
    escalation group, who may approve it from now on. Once: the request row records
    it (when, and to whom) in the same transaction, and the count moves only once that
    transaction committed. True: it was escalated now."""
    with counting_on_commit() as committed:
        escalated = await _escalate_request(ledger, request_id, session_id)
        if escalated:
            committed()
        return escalated


async def _escalate_request(ledger: Ledger, request_id: str, session_id: str) -> bool:
    async with ledger.unit_of_work() as store:
        session = await store.lock_session(session_id)
        request, _ = await store.request_and_calls(request_id, session_id, responder="")
        spec = ledger.catalogue.get(request.tool) if request else None
        if session is None or not domain.may_escalate(request, spec):
            return False
        assert request is not None and spec is not None and spec.escalation is not None
        records.escalation(store, session, request, sorted(ledger.catalogue.principals(spec.escalation.to)))
        await store.commit()
        return True


async def sweep_expired_requests(ledger: Ledger, every: float) -> None:
    """Forever: announce again every request past its escalation time, and close every
    request past its deadline. Any ledger replica may run it."""
    while True:
        try:
            async with ledger.unit_of_work() as store:
                escalations = await store.due_escalations(store.now)
                due = await store.due_requests(store.now)
                lapsed = await store.due_leases(store.now)
            for request_id, session_id in escalations:
                if await escalate_request(ledger, request_id, session_id):
                    log.info("request %s escalated", request_id)
            for request_id, session_id in due:
                if await expire_request(ledger, request_id, session_id):
                    log.info("request %s expired", request_id)
                    await faults.reached("ledger.after_expiry")
            for call_id, session_id in lapsed:
                await intake.lapse_claim(ledger, call_id, session_id)
        except Exception:
            # The database away: the requests stay due, and the next sweep closes them.
            log.exception("expiry sweep failed; retrying")
        await asyncio.sleep(every)


async def _cancel_turn(ledger: Ledger, store: LedgerStore, session: SessionState | None, command: CancelTurn) -> None:
    """Stop the open turn: every open call closes honestly (`cancellation_closure`),
    its closures are written for the model's next turn, a model step still running
    is discarded when it reports, and the session says `cancelled` until a new turn."""
    turn_id, step, calls = await store.open_turn(command.session_id) if session else NO_OPEN_TURN
    refused = domain.refuse_cancellation(turn_id, command.turn_id, session_exists=session is not None)
    if refused is None and session is not None and turn_id is not None:
        starters = frozenset(s for s in (session.started_by, await store.turn_starter(turn_id)) if s)
        pending = [
            domain.approval_policy(ledger.catalogue, tool, escalated=escalated)
            for tool, escalated in await store.pending_tools(session.id)
        ]
        refused = domain.judge_canceller(command.cancelled_by, starters, pending, domain.operators(ledger.catalogue))
    if refused:
        records.refusal(store, session, command, refused)
        return
    assert session is not None and turn_id is not None
    await _close_open_turn(ledger, store, session, step, calls, command, by=command.cancelled_by, reason=command.reason)
    cancelled = TurnCancelled(
        session_id=session.id,
        causation_id=command.message_id,
        turn_id=turn_id,
        cancelled_by=command.cancelled_by,
        reason=command.reason,
    )
    records.end_turn(store, session, cancelled)


async def _close_open_turn(
    ledger: Ledger,
    store: LedgerStore,
    session: SessionState,
    step: domain.Step | None,
    calls: list[domain.Call],
    cause: Envelope | None,
    *,
    by: str,
    reason: str,
) -> None:
    """Every open call of the turn's step closes honestly (`cancellation_closure`),
    the closures go into the transcript for the model's next turn, and a model step
    still running is discarded when it reports."""
    for call in (c for c in calls if c.status != "closed"):
        if call.status == "awaiting_approval":
            records.withdraw_request(store, call)
        claim = await store.hold_back(call) if call.status == "executing" else None
        if claim is None and call.status == "executing" and intake.is_filed(session):
            # A filed call its caller runs: its claim is the caller's, not the executor's.
            claim = await intake.caller_claim(store, call)
        effect = domain.effect_of(ledger.catalogue.get(call.tool))
        closed = domain.cancellation_closure(call, claim, effect, by=by, reason=reason)
        records.closure(store, session, call, closed, cause)
        if domain.needs_operator(closed):
            records.operator_alert(store, session, call, closed, cause)
    if step is not None and step.status == "requested":
        records.step_discarded(store, step)
    for entry in domain.resume(calls, session_waits=False, output_limit=ledger.tool_output_model_chars).entries or []:
        records.append(store, session, entry)
    session.updated_at = store.now


async def _revoke_grant(ledger: Ledger, store: LedgerStore, session: SessionState | None, command: RevokeGrant) -> None:
    await grants.revoke(store, session, command, ledger.catalogue)


async def message_parked(ledger: Ledger, parked: ParkedMessage) -> None:
    """A parked message the session's open turn was waiting on (its model step's
    request or report, a call's execution or result) would leave the session stuck:
    the turn fails with the reason instead, its open calls closed honestly. Anything
    else parked (a bad response, a stale report) changes nothing here. Nor does a
    copy whose parking is not proven: the model-step and the executor may write the
    dead letters, so a copy anybody else could have made acts on no session."""
    if ledger.check_senders and proven_sender(parked, ledger.topology) is None:
        log.warning(
            "a parked %s %s is not acted on: %s (published to the dead letters by %s)",
            parked.message_type,
            parked.message_id,
            UNPROVEN,
            parked.parked_by or "nobody named",
        )
        return
    session_id = parked.session_id
    with counting_on_commit() as committed:
        await _fail_turn_waiting_on(ledger, parked, session_id)
        committed()


async def _fail_turn_waiting_on(ledger: Ledger, parked: ParkedMessage, session_id: str) -> None:
    async with ledger.unit_of_work() as store:
        session = await store.lock_session(session_id) if domain.is_identifier(session_id) else None
        if session is None:
            return
        turn_id, step, calls = await store.open_turn(session_id)
        if turn_id is None or not domain.stalls_the_turn(parked.message_type, parked.envelope, step, calls):
            return
        said = f"{parked.message_type} {parked.message_id} was parked ({parked.reason}): {parked.detail}"
        await _close_open_turn(ledger, store, session, step, calls, None, by="signoff", reason=said)
        failed = TurnFailed(session_id=session.id, turn_id=turn_id, reason_code="message_parked", reason_text=said)
        records.end_turn(store, session, failed)
        await store.commit()
        log.warning("turn %s of session %s failed: %s", turn_id, session_id, said)


# Each message's handler as one transition, as the consumers call it (main.py, ROUTES).
# Wrapped here, not decorated: mutmut mutates no decorated function, and these are
# the functions whose mutants the in-memory handler tests must kill.
start_turn = transition(_start_turn)
model_step_completed = transition(_model_step_completed)
respond_to_approval = transition(_respond_to_approval)
tool_executed = transition(_tool_executed)
execution_refused = transition(_execution_refused)
cancel_turn = transition(_cancel_turn)
revoke_grant = transition(_revoke_grant)
file_call = transition(intake.file_call)
claim_call = transition(intake.claim_call)
report_call_result = transition(intake.report_call_result)
