"""Every rule of the ledger, as pure functions over typed values: no I/O, no
clock, no randomness.

A handler loads what it needs through its store (the port, `store.py`), asks
these functions what follows, and records the answer through the same store
(`records`). Where a rule lives is
listed in docs/design.md, "Where each rule lives".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from services.approval_ledger.decision_rules import (
    CardOnRecord,
    Grant,
    RememberAsked,
    Verdict,
    grant_covering,
    may_remember,
    verdict,
)
from shared.catalogue import ToolCatalogue, ToolSpec
from shared.keyring import TOKEN_RESPONDER_PREFIX, Channel, speaks_for
from shared.ledger import held_back
from shared.messages import ProposedToolCall, ProviderAttempt, RespondToApproval, TranscriptEntry
from shared.signatures import verify
from shared.topology import Topology

# Closure kinds and the reasons that are not a person's decision (invariant 5).
CLOSURE_KINDS = ("output", "error", "denied", "answered", "expired", "cancelled", "outcome_unknown")
BUSY_STATUSES = ("running", "waiting")


# --- what the ledger knows, as loaded -----------------------------------------


@dataclass(frozen=True)
class ClosureOnRecord:
    """A call's terminal result, as stored."""

    kind: str
    output: Any = None
    reason_code: str | None = None
    reason_text: str | None = None


@dataclass(frozen=True)
class Note:
    """A person's message sent with a decision, said to the model once."""

    responder: str
    message: str


@dataclass
class Call:
    """A tool call of a step, with what resuming the step needs: its closure and its decision's note."""

    id: str
    session_id: str
    step_id: str
    turn_id: str
    provider_call_id: str
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    # awaiting_approval | executing | closed
    status: str
    closure: ClosureOnRecord | None = None
    note: Note | None = None
    # The grant that authorized it with no card (approve and remember), if one did.
    grant_id: str | None = None


@dataclass(frozen=True)
class Step:
    id: str
    session_id: str
    turn_id: str
    # requested | completed
    status: str


@dataclass(frozen=True)
class RequestOnRecord:
    """An approval request and the call it asks about, with what deciding who may
    answer it needs."""

    id: str
    session_id: str
    status: str
    args_digest: str
    call_id: str
    tool: str = ""
    # The hash of its one-time response token, and whether that token was redeemed.
    token_hash: str | None = None
    token_used: bool = False
    # Who started the session and the call's turn, as far as recorded.
    starters: frozenset[str] = frozenset()
    # Distinct approvals counted so far, and whether the responder at hand gave one of them.
    approvals: int = 0
    approved_by_responder: bool = False
    # When it closes as expired if nobody decides (None: never).
    expires_at: datetime | None = None
    # Whether it was announced again to its tool's escalation group (who may then approve it).
    escalated: bool = False
    # The card it was shown with, for announcing it again.
    card: dict[str, Any] | None = None
    # When it was committed (for the time a decision took).
    created_at: datetime | None = None
    # How many distinct people must approve, as the tool's rule decided when the request
    # was made (None: made before rules; the tool's count applies).
    approvals_required: int | None = None


@dataclass(frozen=True)
class Refusal:
    """A message that does not fit the state: answered with `message.rejected`, changing nothing else."""

    reason_code: str
    reason_text: str


# --- senders ----------------------------------------------------------------------


def refuse_sender(message_type: str, user_id: str | None, topology: Topology) -> Refusal | None:
    """A command counts only from the broker identity that may send it: a turn or a
    response from a channel, a step's result from the model-step, a tool's from the
    executor (RabbitMQ vouches for the `user_id`)."""
    if topology.may_send(message_type, user_id):
        return None
    return Refusal("unauthorized_sender", f"{user_id or 'a sender without a user id'} may not send {message_type}.")


# --- whom a channel speaks for ----------------------------------------------------
#
# A channel is trusted only for the principals it is registered for
# (`keys/channels.yaml`). Which channel sent a message is known from its broker
# user, `<ns>.channel.<name>`, which RabbitMQ vouches for (`Topology.channel_of`).


def judge_speaker(
    channels: Mapping[str, Channel], channel_name: str | None, principal: str | None, doing: str
) -> Refusal | None:
    """A turn's starter, or whoever a cancel names, must be a principal the sending
    channel may assert: a channel registered for alice may not start a turn as carol
    (and so pass carol off as the starter a tool's separation of duties excludes), nor
    cancel in bob's name. A turn that names nobody names nobody (its starter stays
    unknown: `starters_of`). None: it may."""
    if principal is None:
        return None
    channel = channels.get(channel_name) if channel_name else None
    if channel is None:
        return Refusal(
            "wrong_principal", f"{channel_name or 'The sender'!r} is no registered channel; it may not {doing}."
        )
    if not speaks_for(channel, principal):
        return Refusal("wrong_principal", f"Channel {channel.name!r} may not {doing} as {principal!r}.")
    return None


def judge_key_channel(key_id: str | None, channel_name: str | None) -> Refusal | None:
    """A response counts only from the channel whose key signed it: another channel's
    broker user may not pass on (or replay) a response it did not sign. None: the
    same channel."""
    if key_id is not None and key_id == channel_name:
        return None
    return Refusal(
        "wrong_channel",
        f"The response is signed with channel {key_id!r}'s key but was sent by "
        + (f"channel {channel_name!r}." if channel_name else "no channel."),
    )


# --- turns ------------------------------------------------------------------------


def provider_of_new_session(is_turn: bool, refused: Refusal | None, named: str | None, default: str) -> str | None:
    """The provider of the session a message may open: a turn may open its session; no
    other message, nor a refused turn, may (None)."""
    if not is_turn or refused is not None:
        return None
    return named or default


PROVIDER_FAILED = "provider_failed"


def provider_failure(error: str | None) -> tuple[str, str] | None:
    """A model step the provider failed (an error reported) fails its turn: the
    reason's code and text; None: the step has an answer."""
    return None if error is None else (PROVIDER_FAILED, error)


def may_escalate(request: RequestOnRecord | None, spec: ToolSpec | None) -> bool:
    """A request is escalated once, and only while it is pending and its tool names an
    escalation group (and the request has its card to show them)."""
    if request is None or request.status != "pending" or request.escalated:
        return False
    return spec is not None and spec.escalation is not None and request.card is not None


def may_expire(request: RequestOnRecord | None, at: datetime) -> bool:
    """A request closes as expired once: while pending, once its deadline passed."""
    return request is not None and request.status == "pending" and has_expired(request, at)


def refuse_turn(session_status: str, open_turn: str | None = None) -> Refusal | None:
    """A new turn starts only on an idle session: one that runs or waits on a person is
    busy, and the refusal names the turn that keeps it so."""
    if session_status in BUSY_STATUSES:
        turn = f" on turn {open_turn}" if open_turn else ""
        return Refusal("session_busy", f"The session is {session_status}{turn}; a new turn can start when it is idle.")
    return None


@dataclass(frozen=True)
class KeyedTurn:
    """A turn started with an idempotency key: who started it and the digest of its text."""

    turn_id: str
    started_by: str | None
    text_digest: str | None


def judge_repeated_start(earlier: KeyedTurn, started_by: str | None, text_digest: str) -> Refusal | None:
    """A start whose key the session's turns already used is a repeat of that start (None:
    answer it with that turn) only when the same person asks the same thing; a key
    reused for another text or by another person is refused, never answered with
    someone else's turn."""
    if earlier.started_by != started_by or earlier.text_digest != text_digest:
        return Refusal(
            "idempotency_key_reused",
            f"This idempotency key already started turn {earlier.turn_id} with another text or starter.",
        )
    return None


# --- model steps ------------------------------------------------------------------


@dataclass(frozen=True)
class StepReport:
    """What a step report may do: be refused, be counted only (a duplicate), or be applied."""

    verdict: Literal["unknown", "duplicate", "apply"]
    # Attempts to record, each with the status it is recorded as (invariant 7).
    attempts: tuple[tuple[ProviderAttempt, str], ...] = ()
    refusal: Refusal | None = None


UNKNOWN_STEP = Refusal("unknown_step", "No such model step in this session.")


def judge_step_report(step: Step | None, session_id: str, attempts: Sequence[ProviderAttempt]) -> StepReport:
    """A report for a step of another session, or none, is refused. A report for a
    step already completed is a duplicate (a model-step died after reporting): its
    attempts are kept, counted as discarded, except its abandoned one, which is
    the delivery whose report is already on record."""
    if step is None or step.session_id != session_id:
        return StepReport("unknown", refusal=UNKNOWN_STEP)
    if step.status != "requested":
        return StepReport("duplicate", tuple((a, "discarded") for a in attempts if a.status != "abandoned"))
    return StepReport("apply", tuple((a, a.status) for a in attempts))


@dataclass(frozen=True)
class CallPlan:
    """What happens to one tool call the model asked for."""

    proposed: ProposedToolCall
    action: Literal["ask", "execute", "close"]
    spec: ToolSpec | None = None
    reason_code: str | None = None
    reason_text: str | None = None
    # For a call that asks or runs: what the tool's approval rule decided for its
    # arguments (how many must approve, 0 for none, and why).
    verdict: Verdict | None = None
    # For a call that would ask but runs: the person's remembered approval that covers it.
    grant: Grant | None = None


def plan_calls(
    calls: Sequence[ProposedToolCall],
    catalogue: ToolCatalogue,
    grants: Sequence[Grant] = (),
    *,
    session_id: str = "",
    at: datetime | None = None,
) -> list[CallPlan]:
    """Decide, per call, whether to ask a person, run it now, or close it with an error.

    Invalid calls are closed before anyone is asked: a person should never be
    asked to approve a call that cannot run. A call that would ask runs instead when
    one of the session's `grants` covers it at `at` (`decision_rules.grant_covering`).
    """
    plans = []
    for call in calls:
        spec = catalogue.get(call.name)
        if spec is None:
            plans.append(CallPlan(call, "close", None, "unknown_tool", f"There is no tool named {call.name!r}."))
            continue
        if spec.implementation is None:
            plans.append(
                CallPlan(call, "close", spec, "no_implementation", f"The tool {call.name!r} has no implementation.")
            )
            continue
        unexpected, errors = spec.argument_problems(call.arguments)
        if unexpected:
            # Refused before anyone is asked: an argument the card would not explain
            # must never ride along into the request (tool schemas are closed by default).
            plans.append(
                CallPlan(
                    call,
                    "close",
                    spec,
                    "unexpected_arguments",
                    f"The tool {call.name!r} takes no argument named " + ", ".join(map(repr, unexpected)) + "; "
                    "the call was not run and nobody was asked. Call it again with only its declared parameters.",
                )
            )
            continue
        if errors:
            plans.append(
                CallPlan(
                    call,
                    "close",
                    spec,
                    "invalid_arguments",
                    f"Invalid arguments for {call.name!r}: " + "; ".join(errors),
                )
            )
            continue
        # The tool's rule over these arguments decides (a plain `always` or `never` too).
        decided = verdict(spec, call.arguments)
        if not decided.needs_approval:
            plans.append(CallPlan(call, "execute", spec, verdict=decided))
            continue
        covering = (
            grant_covering(
                grants,
                session_id,
                spec,
                spec.target_of(call.arguments),
                at,
                approvals_required=decided.approvals_required,
            )
            if grants and at is not None
            else None
        )
        plans.append(CallPlan(call, "ask" if covering is None else "execute", spec, verdict=decided, grant=covering))
    return plans


# --- approve and remember ---------------------------------------------------------


def judge_remember(
    spec: ToolSpec | None, request: RequestOnRecord, response: RespondToApproval, *, decides: bool
) -> Refusal | None:
    """Whether the grant a response asks for may be given (`decision_rules.may_remember`),
    judged before anything of the response is recorded: refused, the whole response is
    refused, so a forged or widened grant never slips through as a plain approval. Only
    an approval that decides its request may remember (the grant is made as the call
    runs; an earlier approver's wish would otherwise be dropped unsaid). None: it may."""
    asked = response.remember
    if asked is None:
        return None
    if response.decision != "approve":
        return Refusal("remember_with_denial", "Only an approval can be remembered.")
    if response.edited_arguments is not None:
        # A grant is given on the call as the card showed it; an edit changes what it would cover.
        return Refusal(
            "remember_with_edit", "An edited approval cannot be remembered: approve the card as shown to remember it."
        )
    if not decides:
        return Refusal(
            "remember_before_decided",
            f"{request.tool!r} needs more approvals: the approval that decides it may be remembered, not this one.",
        )
    if spec is None:
        return Refusal("tool_not_rememberable", f"{request.tool!r} is no longer in the catalogue.")
    target = str((request.card or {}).get("target", ""))
    refused = may_remember(
        spec,
        CardOnRecord(request.session_id, request.tool, target),
        RememberAsked(response.session_id, request.tool, asked.target, asked.hours),
    )
    if refused is None:
        return None
    return Refusal(refused, REMEMBER_REFUSALS[refused].format(tool=request.tool))


REMEMBER_REFUSALS = {
    "tool_not_rememberable": "{tool!r} may not be remembered: every call of it needs its own approval.",
    "other_session": "A grant covers only the session of the card it was given on.",
    "other_tool": "A grant covers only the tool of the card it was given on.",
    "other_target": "A grant covers the card's own target, or any target of its tool; not another one.",
    "bad_duration": "A grant lasts a positive number of hours, up to a year, or the rest of the session.",
}


def judge_revoker(
    revoker: str,
    grant: Grant | None,
    session_id: str,
    policy: ApprovalPolicy,
    starters: frozenset[str],
    operators: frozenset[str],
) -> Refusal | None:
    """Who may revoke a grant: whoever granted it, whoever started its session, anyone
    who may approve its tool now (`policy`, as the catalogue has it now), or an
    operator; and only a grant of this session that is not revoked yet. None: they may
    (a revocation only takes authority away)."""
    if grant is None or grant.session_id != session_id:
        return Refusal("unknown_grant", "There is no such grant in this session.")
    if grant.revoked_at is not None:
        return Refusal("grant_revoked", "The grant was revoked already.")
    if revoker in (grant.granted_by, *starters, *operators):
        return None
    if policy.approvers is None or revoker in policy.approvers:
        # A tool that names no approvers lets anyone its channel vouches for approve, so revoke too.
        return None
    return Refusal(
        "may_not_revoke",
        f"{revoker!r} neither granted it, started the session, may approve {grant.tool!r}, nor is an operator.",
    )


# --- approvals --------------------------------------------------------------------


def authenticate_response(
    response: RespondToApproval, channels: Mapping[str, Channel], *, at: datetime, window: timedelta
) -> Refusal | None:
    """Only a registered channel adapter speaks for a person: a response must be
    signed by a registered key, over everything it decides, by a channel allowed to
    assert that responder, and issued within `window` of the ledger's clock. None:
    it is authentic (whether it may decide the request is `judge_response`'s)."""
    if not response.signature or not response.key_id:
        return Refusal("unsigned", "The response carries no signature; only a registered channel may respond.")
    channel = channels.get(response.key_id)
    if channel is None:
        return Refusal("unknown_key", f"No channel is registered as {response.key_id!r}.")
    if not verify(channel.public_key, response.signed_part(), response.signature):
        return Refusal("bad_signature", "The signature does not match the response or the channel's key.")
    if not may_name(channel, response):
        return Refusal("wrong_principal", f"Channel {channel.name!r} may not respond as {response.responder!r}.")
    if abs(response.issued_at - at) > window:
        return Refusal(
            "stale",
            f"The response was issued at {response.issued_at.isoformat()}, outside the "
            f"{window.total_seconds():.0f} s the ledger accepts.",
        )
    return None


# A program's principal (the gateway's API tokens): never a person (people's names hold no `:`).
PROGRAM_PREFIX = "bot:"


def token_responder(channel: str) -> str:
    """Who a token response is recorded as: no person, the channel that received it."""
    return TOKEN_RESPONDER_PREFIX + channel


def may_name(channel: Channel, response: RespondToApproval) -> bool:
    """A response with a token names `token:<its channel>` and nobody else; one
    without names a principal the channel may assert, never a `token:` one (so no
    channel can pass a person's answer off as a token's, or the other way round)."""
    if response.response_token is not None:
        return response.responder == token_responder(channel.name)
    return speaks_for(channel, response.responder)


def token_hash(token: str) -> str:
    """What the ledger keeps of a response token: its SHA-256, never the token."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


REPLAYED = Refusal("replayed", "This response id was used before; a response counts once.")

UNKNOWN_REQUEST = Refusal("unknown_request", "No approval request with that id exists in this session.")


def judge_response(
    request: RequestOnRecord | None, response: RespondToApproval, *, at: datetime | None = None
) -> Refusal | None:
    """Whether a response may decide a request: it must name a pending request of
    its own session that has not expired (by `at`, even before the sweep closed
    it), a token must be that request's and unused, and an approval must carry the
    digest of the arguments shown (invariant 6). None: it may."""
    if request is None or request.session_id != response.session_id:
        return UNKNOWN_REQUEST
    refused = judge_token(request, response.response_token)
    if refused:
        return refused
    if request.status == "expired" or (request.status == "pending" and has_expired(request, at)):
        return Refusal("expired", "The request expired before this answer; nothing was decided.")
    if request.status != "pending":
        return Refusal("already_decided", f"The request is already {request.status}.")
    if response.decision == "approve" and response.args_digest != request.args_digest:
        return Refusal(
            "digest_mismatch", "The approval names different arguments from the ones shown; refusing to run them."
        )
    return None


ALTERED = Refusal(
    "altered",
    "The call's arguments on record are not the ones the person approved (or its tool changed version since); "
    "it was not run and is closed.",
)


def judge_arguments(on_record: str, approved: str) -> Refusal | None:
    """An approval seals the call as its row holds it now, so the ledger recomputes the
    request's digest from the row (`on_record`) and compares it with the digest the
    person approved: a row rewritten in the database since the card was shown (by
    anyone with the ledger's role, or the SQLite file) is refused, never run."""
    return None if hmac.compare_digest(on_record, approved) else ALTERED


def closure_of_altered() -> ClosureOnRecord:
    """The call whose row no longer holds what the person approved closes honestly, unrun."""
    return ClosureOnRecord(
        "error",
        reason_code="altered",
        reason_text="Not run: its arguments on record were changed after the person was asked; an operator was told.",
    )


def has_expired(request: RequestOnRecord, at: datetime | None) -> bool:
    return at is not None and request.expires_at is not None and request.expires_at <= at


def deadline(created_at: datetime, tool_expires_after: float | None, default_seconds: float) -> datetime:
    """When a new request expires: the tool's own wait, or the deployment's."""
    return created_at + timedelta(seconds=tool_expires_after or default_seconds)


def producing_attempt(attempts: Sequence[ProviderAttempt]) -> int | None:
    """The provider attempt whose reply made the step's calls: its completed one."""
    return next((a.number for a in attempts if a.status == "completed"), None)


def closure_of_expiry(request: RequestOnRecord) -> ClosureOnRecord:
    """An expired request closes its call with a reason a person (and the model) can read."""
    assert request.expires_at is not None
    when = request.expires_at.isoformat(timespec="seconds")
    return ClosureOnRecord(
        "expired", reason_code="expired", reason_text=f"Nobody decided in time: it expired at {when}."
    )


def judge_token(request: RequestOnRecord, token: str | None) -> Refusal | None:
    """A response token counts only for the request it was minted with (its hash,
    compared in constant time) and only once. None: no token, or a good one."""
    if token is None:
        return None
    if request.token_hash is None or not hmac.compare_digest(token_hash(token), request.token_hash):
        return Refusal("bad_token", "The response token is not this request's.")
    if request.token_used:
        return Refusal("token_used", "The response token was used before; a token counts once.")
    return None


# --- who may approve ----------------------------------------------------------------


@dataclass(frozen=True)
class ApprovalPolicy:
    """Who may approve a tool's calls, and how many must."""

    # The principals who may approve; None: anyone a registered channel may assert.
    approvers: frozenset[str] | None = None
    starter_may_approve: bool = True
    approvals_required: int = 1


# A request whose tool left the catalogue: nobody may approve or deny it (it expires, or its turn is cancelled).
NOBODY = ApprovalPolicy(approvers=frozenset())


def approval_policy(
    catalogue: ToolCatalogue, tool: str, *, escalated: bool = False, recorded_required: int | None = None
) -> ApprovalPolicy:
    """The tool's declaration as the catalogue has it now (groups resolved now, so
    a person taken out of a group can no longer approve a pending request); once a
    request was escalated, its escalation group may approve it too. How many must
    approve is the count recorded with the request, what the tool's rule decided for
    its arguments (`recorded_required`; None for requests made before rules: the
    tool's own count)."""
    spec = catalogue.get(tool)
    if spec is None:
        return NOBODY
    approvers = catalogue.approvers_of(spec)
    if escalated and spec.escalation is not None and approvers is not None:
        approvers = approvers | catalogue.principals(spec.escalation.to)
    required = spec.approvals_required if recorded_required is None else recorded_required
    return ApprovalPolicy(approvers, spec.starter_may_approve, required)


def escalation_time(created_at: datetime, spec: ToolSpec) -> datetime | None:
    """When a new request is announced again if nobody decided (None: never)."""
    return created_at + timedelta(seconds=spec.escalation.after_seconds) if spec.escalation else None


def judge_approver(policy: ApprovalPolicy, request: RequestOnRecord, response: RespondToApproval) -> Refusal | None:
    """Whether this responder may answer: approve or deny, only one of the tool's
    approvers (a denial ends a person's work as surely as an approval starts it, so a
    stranger may not deny; a tool gone from the catalogue has no approver and waits
    for its expiry or a cancel). An approval, further: not the session's or the
    turn's starter when the tool forbids it (which a token, naming no person, and an
    unrecorded starter cannot show), and not one who approved the request already.
    Those two rules keep an approval from counting wrongly; they do not bind a
    denial, which counts nothing (a starter may stop their own call, as a cancel
    would). None: the response may count."""
    responder = response.responder
    anonymous = response.response_token is not None
    if policy.approvers is not None and responder not in policy.approvers:
        return Refusal("not_an_approver", f"{responder!r} is not among the approvers of {request.tool!r}.")
    if policy.approvers is None and responder.startswith(PROGRAM_PREFIX):
        # A program (an API token, `bot:NAME`) approves only where the tool's approvers name
        # it: a tool open to "anyone a channel vouches for" means any person, never a program.
        return Refusal("not_an_approver", f"{responder!r} is a program; {request.tool!r} names no programs.")
    if anonymous and (not policy.starter_may_approve or policy.approvals_required > 1):
        return Refusal(
            "anonymous_approval",
            f"A response token names no person; {request.tool!r} needs answers from known people.",
        )
    if response.decision != "approve":
        return None
    if not policy.starter_may_approve:
        if not request.starters:
            return Refusal(
                "starter_unknown",
                f"Who started the session is not on record, so {request.tool!r} cannot be approved "
                "by someone other than its starter.",
            )
        if responder in request.starters:
            return Refusal(
                "starter_may_not_approve", f"{responder!r} started the session; {request.tool!r} needs someone else."
            )
    if request.approved_by_responder:
        return Refusal("already_approved", f"{responder!r} approved this request already; it needs another person.")
    return None


@dataclass(frozen=True)
class Tally:
    """Where a request stands after an accepted response."""

    # Distinct approvals, this response's included (0 for a denial).
    count: int
    required: int
    # Whether the response decides the request (a denial, or the last approval needed).
    decides: bool


def tally(policy: ApprovalPolicy, request: RequestOnRecord, decision: str) -> Tally:
    """One denial decides; approvals are counted until the tool's required number
    of distinct people have approved, and the last of them decides."""
    if decision != "approve":
        return Tally(request.approvals, policy.approvals_required, decides=True)
    count = request.approvals + 1
    return Tally(count, policy.approvals_required, decides=count >= policy.approvals_required)


def edited_version(
    request: RequestOnRecord, args_digest: str, approvals_required: int, card: dict[str, Any] | None = None
) -> RequestOnRecord:
    """An approval whose edit changes the arguments makes a new version of the request,
    and the count restarts: approvals of the version before were given for other
    arguments and no longer count (the audit log keeps them), so every approver
    approves the same edited version, the editor first; one who approved the version
    before may approve this one (it is not the same approval twice). The edited
    arguments' digest is the one an approval must now carry, and the count is what the
    tool's rule decides for them, at least one (the editor's own approval is needed
    even where the rule would ask nobody: a person chose these arguments)."""
    return replace(
        request,
        args_digest=args_digest,
        approvals=0,
        approved_by_responder=False,
        card=request.card if card is None else card,
        approvals_required=max(1, approvals_required),
    )


def starters_of(session_started_by: str | None, turn_started_by: str | None) -> frozenset[str]:
    """Who started a call's session and its turn, as separation of duties sees them.
    A turn that names no starter leaves its starter unknown (empty: `starter_unknown`)
    even when the session's is known: otherwise a channel could open a turn in
    someone else's session without saying for whom, and then approve its call as
    the very person who asked for it."""
    if turn_started_by is None:
        return frozenset()
    return frozenset(s for s in (session_started_by, turn_started_by) if s)


def session_starter(current: str | None, turn_starter: str | None) -> str | None:
    """The session's starter is whoever started its first turn that names one."""
    return current or turn_starter


# A request leaves `pending` by a person's decision as one of these.
STATUS_AFTER = {"approve": "approved", "deny": "denied", "respond": "answered"}


def request_status_after(decision: str) -> str:
    return STATUS_AFTER[decision]


def note_of(response: RespondToApproval, edit: str | None = None) -> Note | None:
    """A decision's message goes to the model; a decision without one says nothing more.
    A person who changed the arguments before approving: the model is told so, and how.
    An answer in the tool's place is no note: its message is the call's result
    (`closure_of_answer`), said once."""
    if response.decision == "respond":
        return None
    message = "\n".join(part for part in (edit, response.message) if part)
    return Note(response.responder, message) if message else None


# How much of the edited arguments the model is told (the whole call is on the card and in the row).
EDITED_CALL_CHARS = 1000


def edit_of(card: Mapping[str, Any] | None) -> str | None:
    """What the model is told of an edit on record on the card: who changed which arguments,
    and the call as it was approved (its transcript keeps the call as the model proposed
    it), as the card shows it: secrets hidden."""
    if not card or not card.get("edit"):
        return None
    approved = json.dumps(card.get("arguments"), ensure_ascii=False, sort_keys=True)
    if len(approved) > EDITED_CALL_CHARS:
        approved = approved[:EDITED_CALL_CHARS] + "…"
    return (
        f"{card.get('edited_by') or 'A person'} changed the arguments before approving: {card['edit']}. "
        f"The call was approved with these arguments: {approved}"
    )


def closure_of_denial(reason: str) -> ClosureOnRecord:
    """A denied call closes with the person's reason, if they gave one."""
    return ClosureOnRecord("denied", reason_code="denied_by_person", reason_text=reason or None)


def closure_of_answer(message: str) -> ClosureOnRecord:
    """A person who answered in the tool's place: the call did not run, and what they
    said is its result, for the model to read as the tool's answer."""
    return ClosureOnRecord("answered", reason_code="answered_by_person", reason_text=message)


def closure_of_decision(response: RespondToApproval) -> ClosureOnRecord:
    """How a request decided without an approval closes its call: denied with the
    person's reason, or answered with their message."""
    if response.decision == "respond":
        return closure_of_answer(response.message)
    return closure_of_denial(response.reason)


# --- tool results -----------------------------------------------------------------

UNKNOWN_CALL = Refusal("unknown_call", "No such tool call in this session.")
OUTCOME_UNKNOWN_TEXT = "The executor stopped mid-call; whether the call happened is unknown."


def judge_tool_report(call: Call | None, session_id: str) -> Literal["unknown", "stale", "apply"]:
    """A report for a call of another session, or none, is refused; one for a call
    not executing (already closed by an earlier report, or never approved) is
    stale and changes nothing."""
    if call is None or call.session_id != session_id:
        return "unknown"
    if call.status != "executing":
        return "stale"
    return "apply"


NOT_CLAIMED = Refusal(
    "not_claimed",
    "No finished execution claim, taken under the ledger's authorization of this call, is on record: a tool's "
    "result is read from its claim, never from the report; nothing was closed.",
)


def judge_claim(claim: ClaimOnRecord | None, *, sealed: bool) -> Refusal | None:
    """A tool's result counts only once the executor durably claimed the call, under
    the ledger's authorization of exactly this call, tool and arguments (`sealed`), and
    recorded the result in that claim: the report is a notice, never the result. A
    report with no such claim behind it can only be forged (a tool holds the executor's
    broker identity): refused, and the real run closes the call later."""
    if claim is None or claim.status != "finished" or not sealed:
        return NOT_CLAIMED
    return None


def closure_of_claim(claim: ClaimOnRecord) -> ClosureOnRecord:
    """A finished claim's recorded outcome → the call's closure: the output, the tool's
    error, or outcome-unknown (invariant 4). Read from the claim row, kept whole there
    whatever the report carried."""
    result = claim.result or {}
    if claim.outcome == "output":
        return ClosureOnRecord("output", output=result.get("output"))
    error = result.get("error")
    error = None if error is None else str(error)[:ERROR_CHARS]
    if claim.outcome == "error":
        return ClosureOnRecord("error", reason_code="tool_failed", reason_text=error)
    return ClosureOnRecord("outcome_unknown", reason_code="outcome_unknown", reason_text=error or OUTCOME_UNKNOWN_TEXT)


# As much of a tool's error as a report could carry.
ERROR_CHARS = 4000


def needs_operator(closure: ClosureOnRecord) -> bool:
    """Only a person can settle a call that may or may not have happened."""
    return closure.kind == "outcome_unknown"


# --- messages that could not be handled -----------------------------------------------

_IDENTIFIER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def is_identifier(value: str) -> bool:
    return bool(_IDENTIFIER.match(value))


def stalls_the_turn(message_type: str, envelope: Mapping[str, Any], step: Step | None, calls: Sequence[Call]) -> bool:
    """Whether the open turn waits on a message that was parked: its model step's
    request or report (the step still requested), or the execution or result of one
    of its calls still executing. Then only failing the turn unsticks the session."""
    if message_type in ("step.requested", "step.completed"):
        return step is not None and step.status == "requested" and envelope.get("step_id") == step.id
    if message_type in ("tool.execute", "tool.completed"):
        return any(c.id == envelope.get("call_id") and c.status == "executing" for c in calls)
    return False


# --- cancelling a turn ------------------------------------------------------------

NOTHING_TO_CANCEL = Refusal("nothing_to_cancel", "The session has no open turn to cancel.")
# The tools file's group whose principals may cancel any turn (docs/design.md, "Trust boundaries").
OPERATORS_GROUP = "operators"


def operators(catalogue: ToolCatalogue) -> frozenset[str]:
    """Who may cancel any session's turn: the catalogue's group `operators` (nobody
    when it declares none), read as it is now, like approvers."""
    return frozenset(catalogue.groups.get(OPERATORS_GROUP, ()))


def judge_canceller(
    canceller: str,
    starters: frozenset[str],
    pending: Sequence[ApprovalPolicy],
    operators: frozenset[str],
) -> Refusal | None:
    """Who may stop a turn: whoever started it or its session (`starters`), anyone
    who may approve one of the session's pending requests (`pending`: their tools'
    policies now; a tool that names no approvers lets anyone its channel vouches for
    approve, so cancel too), or an operator. Anyone else could otherwise stop other
    people's work in their own name. None: they may."""
    if canceller in starters or canceller in operators:
        return None
    if any(policy.approvers is None or canceller in policy.approvers for policy in pending):
        return None
    return Refusal(
        "may_not_cancel",
        f"{canceller!r} neither started this session or its turn, nor may approve what it waits on, "
        "nor is an operator; only they may cancel it.",
    )


NO_SUCH_SESSION = Refusal("unknown_session", "There is no such session.")


def refuse_cancellation(
    open_turn_id: str | None, asked_turn_id: str | None, *, session_exists: bool = True
) -> Refusal | None:
    """Only the session's open turn can be cancelled, and only if it is the one named."""
    if not session_exists:
        return NO_SUCH_SESSION
    if open_turn_id is None:
        return NOTHING_TO_CANCEL
    if asked_turn_id is not None and asked_turn_id != open_turn_id:
        return Refusal("unknown_turn", f"Turn {asked_turn_id} is not the session's open turn.")
    return None


@dataclass(frozen=True)
class ClaimOnRecord:
    """The executor's claim on a call as the ledger found it (cancelling, or recording its report)."""

    status: str  # claimed | finished
    outcome: str | None = None
    result: dict[str, Any] | None = None
    holder: str | None = None
    attempts: int = 0
    claimed_at: datetime | None = None
    # The ledger's authorization it was taken under (None: the ledger's own hold-back, or older).
    authorization: str | None = None


# What the ledger's own claim on a call it held back says (shared/ledger/held_back.py).
CANCELLED_BEFORE_RUNNING = held_back.CANCELLED_BEFORE_RUNNING


def effect_of(spec: ToolSpec | None) -> str:
    """A tool's effect; a tool no longer in the catalogue counts as outward (the
    cautious answer: whether a running call of it happened is unknown)."""
    return spec.effect if spec is not None else "outward"


def cancellation_closure(
    call: Call, claim: ClaimOnRecord | None, effect: str, *, by: str, reason: str
) -> ClosureOnRecord:
    """How each open call of a cancelled turn closes, honestly. Waiting for a person,
    or not yet taken by the executor (`claim` None: the ledger's own tombstone claim
    now keeps it from ever running): cancelled. Finished: its recorded result.
    Running: an outward call may or may not have happened (outcome-unknown, for an
    operator); a read or idempotent one is cancelled, its late result ignored."""
    said = f"Cancelled by {by}" + (f": {reason}" if reason else ".")
    cancelled = ClosureOnRecord("cancelled", reason_code="cancelled", reason_text=said)
    if call.status == "awaiting_approval" or claim is None:
        return cancelled
    if claim.status == "finished":
        result = claim.result or {}
        if claim.outcome == "output":
            return ClosureOnRecord("output", output=result.get("output"))
        if claim.outcome == "error":
            return ClosureOnRecord("error", reason_code="tool_failed", reason_text=result.get("error"))
        return ClosureOnRecord("outcome_unknown", reason_code="outcome_unknown", reason_text=OUTCOME_UNKNOWN_TEXT)
    if effect == "outward":
        return ClosureOnRecord(
            "outcome_unknown",
            reason_code="outcome_unknown",
            reason_text=f"{said} It was running; whether it happened is unknown.",
        )
    return cancelled


# --- resuming a step and the session's status ----------------------------------


@dataclass(frozen=True)
class Resumption:
    """What follows when a transition leaves a step's calls as they are."""

    # The session's status after the transition, unless a new model step is requested.
    status: str
    # Entries to append before the next model step; None: the step is not done yet.
    entries: list[TranscriptEntry] | None = field(default=None)


@dataclass(frozen=True)
class TurnBounds:
    """How far one turn may go (SIGNOFF_TURN_MAX_STEPS, SIGNOFF_TURN_MAX_TOKENS; 0: no bound)."""

    steps: int = 100
    tokens: int = 2_000_000


@dataclass(frozen=True)
class TurnSpend:
    """What a turn has used so far: its model steps, the provider calls they made, and their tokens."""

    steps: int
    provider_calls: int
    tokens: int


def spent_with(stored: TurnSpend, spent_now: Sequence[tuple[ProviderAttempt, str]]) -> TurnSpend:
    """What the turn used, counting the provider attempts the transition at hand records
    (not yet in the rows the stored spend was read from)."""
    return TurnSpend(
        stored.steps,
        stored.provider_calls + len(spent_now),
        stored.tokens + sum(a.usage.input_tokens + a.usage.output_tokens for a, _ in spent_now),
    )


@dataclass(frozen=True)
class BoundReached:
    bound: Literal["steps", "tokens"]
    text: str


STEP_LIMIT = "step_limit"


def turn_bound_reached(bounds: TurnBounds, spent: TurnSpend, last_words: str) -> BoundReached | None:
    """Whether a turn whose step is done may ask for another. A model that keeps
    asking for a tool that does not exist (each call closed at once) would otherwise
    call, and bill, the provider forever. The model's last words are kept in the reason."""
    said = f" The model's last words: {last_words[:500]!r}." if last_words else ""
    spent_text = f"{spent.steps} model steps, {spent.provider_calls} provider calls, {spent.tokens} tokens"
    if bounds.steps and spent.steps >= bounds.steps:
        return BoundReached("steps", f"The turn reached its bound of {bounds.steps} model steps ({spent_text}).{said}")
    if bounds.tokens and spent.tokens >= bounds.tokens:
        return BoundReached(
            "tokens", f"The turn reached its bound of {bounds.tokens} provider tokens ({spent_text}).{said}"
        )
    return None


# How much of a tool's result the model reads by default (SIGNOFF_TOOL_OUTPUT_MODEL_CHARS).
OUTPUT_LIMIT = 16_000


def resume(calls: Sequence[Call], *, session_waits: bool, output_limit: int = OUTPUT_LIMIT) -> Resumption:
    """When the last call of a step closes, every closure is written next to its call,
    in the order the model made them, then every decision's note, and the next model
    step is asked for, once (invariant 3). Until then the session waits while any
    request is pending (invariant 5), and runs otherwise."""
    if any(call.status != "closed" for call in calls):
        return Resumption(session_status(waiting=session_waits))
    entries = []
    for call in calls:
        closure = call.closure
        assert closure is not None, f"closed call {call.id} without a closure"
        entries.append(
            closure_entry(
                call_id=call.id,
                provider_call_id=call.provider_call_id,
                tool=call.tool,
                kind=closure.kind,
                output=closure.output,
                reason_text=closure.reason_text,
                limit=output_limit,
            )
        )
    entries.extend(decision_note(call.note) for call in calls if call.note is not None)
    return Resumption("running", entries)


def session_status(*, waiting: bool) -> str:
    """While a turn is open: waiting on a person if any request is pending, else running."""
    return "waiting" if waiting else "running"


# --- what the model reads -------------------------------------------------------


def closure_text(kind: str, output: Any, reason_text: str | None) -> str:
    """What the model reads as a tool call's result. Every closure goes through here."""
    if kind == "output":
        return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
    if kind == "denied":
        return "The user denied this tool call." + (f" Reason: {reason_text}" if reason_text else "")
    if kind == "answered":
        # The tool did not run; the person answered in its place, and that is its result.
        return reason_text or ""
    if kind == "outcome_unknown":
        return (
            "Error: the tool may or may not have run (its executor stopped mid-call); "
            "it will not be retried automatically and an operator was told."
        )
    label = {"error": "Error", "expired": "Expired", "cancelled": "Cancelled"}.get(kind, kind)
    return f"{label}: {reason_text or 'no reason given'}"


def truncated(text: str, limit: int, call_id: str) -> str:
    """A result as long as `limit` characters at most, with a marker that says it was
    cut and where the whole of it is: the closure row keeps the output whole."""
    if len(text) <= limit:
        return text
    return (
        f"{text[:limit]}\n[Signoff truncated this result: the first {limit} of {len(text)} characters are shown; "
        f"the whole output is kept in the ledger (call {call_id}).]"
    )


def closure_entry(
    *,
    call_id: str,
    provider_call_id: str,
    tool: str,
    kind: str,
    output: Any,
    reason_text: str | None,
    limit: int = OUTPUT_LIMIT,
) -> TranscriptEntry:
    if kind not in CLOSURE_KINDS:
        raise ValueError(f"unknown closure kind {kind!r}")
    return TranscriptEntry(
        role="tool",
        call_id=call_id,
        provider_call_id=provider_call_id,
        text=truncated(closure_text(kind, output, reason_text), limit, call_id),
        closure=kind,
    )


def decision_note(note: Note) -> TranscriptEntry:
    """A person's message sent with a decision, for the very next model call."""
    return TranscriptEntry(role="user", text=f"[{note.responder}, with their decision] {note.message}")
