"""The intake's rules (calls filed by programs, docs/design.md "The intake"), as pure
functions over typed values: no I/O, no clock, no randomness.

Policy is the operator's, never the caller's: a filing is judged by the catalogue
alone (the origin it names, the programs that origin admits, the tools it may file,
a default for tools the catalogue does not know), then the tool's own rule decides
whether a person must approve, exactly as for a call of Signoff's own model. A claim
(`runs: caller`) is granted once, to one token; a result is taken once, with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from shared import intake as shared_intake
from shared.catalogue import ToolCatalogue, ToolSpec
from shared.messages import ClaimCall, FileCall, ReportCallResult

from .decision_rules import Verdict, verdict
from .domain import Call, Refusal

# The provider of a filed call's session: no model ever steps in it.
INTAKE = "intake"


@dataclass(frozen=True)
class FiledOnRecord:
    """A filed call as stored (`filed_calls`), with its call's status."""

    call_id: str
    session_id: str
    program: str
    caller_call_id: str
    origin: str
    tool: str
    args_fingerprint: str
    runs: str
    request_id: str | None
    claim_token_hash: str | None
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    reported_at: datetime | None
    claim_holder: str | None = None


@dataclass(frozen=True)
class FilingPlan:
    """A filing the catalogue admits: the tool as recorded (`<origin>/<tool>` for one
    the caller declared), its spec, and whether a person must approve (`verdict`)."""

    tool: str
    spec: ToolSpec
    verdict: Verdict
    declared_by_caller: bool

    @property
    def asks(self) -> bool:
        return self.verdict.needs_approval


def judge_filing(catalogue: ToolCatalogue, command: FileCall) -> FilingPlan | Refusal:
    """Whether the catalogue admits this filing (`shared.intake.judge_filing`, which the
    gateway asks too, before it sends anything), and what the tool's rule says it needs."""
    judged = shared_intake.judge_filing(catalogue, command)
    if isinstance(judged, shared_intake.Refused):
        return Refusal(judged.reason_code, judged.reason_text)
    return FilingPlan(judged.tool, judged.spec, verdict(judged.spec, command.arguments), judged.declared_by_caller)


def judge_refiling(filed: FiledOnRecord, fingerprint: str) -> Refusal | None:
    """The same call filed again: nothing happens (the first filing stands); with other
    arguments it is refused, never a second card."""
    if filed.args_fingerprint == fingerprint:
        return None
    return Refusal(
        "call_id_reused",
        f"The call id {filed.caller_call_id!r} was filed before with other arguments (as {filed.call_id}).",
    )


def _whose(filed: FiledOnRecord | None, call: Call | None, program: str, call_id: str) -> Refusal | None:
    if filed is None or call is None:
        return Refusal("unknown_call", f"No filed call {call_id}.")
    if filed.program != program:
        # Said as for a call that does not exist: one program learns nothing of another's.
        return Refusal("unknown_call", f"No filed call {call_id} of {program!r}.")
    return None


def holder_said(filed: FiledOnRecord) -> str:
    """Who holds the claim, and until when, as a refusal names them."""
    who = filed.claim_holder or filed.program
    since = filed.claimed_at.isoformat() if filed.claimed_at else "?"
    until = filed.lease_expires_at.isoformat() if filed.lease_expires_at else "?"
    return f"{who} (for {filed.program}) since {since}, its lease until {until}"


def judge_claim(
    filed: FiledOnRecord | None, call: Call | None, command: ClaimCall, at: datetime
) -> Refusal | Literal["grant", "again"]:
    """A claim of a filed call its caller runs: granted once, to one token, after
    approval and before the call is closed; the same token claiming again is the same
    claim ("again"); any other claim while one was granted is refused naming its holder,
    and a lapsed claim is never granted again (the call closes as outcome unknown)."""
    refused = _whose(filed, call, command.program, command.call_id)
    if refused:
        return refused
    assert filed is not None and call is not None
    if filed.runs != "caller":
        return Refusal("runs_by_signoff", "Signoff's executor runs this call; collect its result instead.")
    if call.status == "awaiting_approval":
        return Refusal("not_approved", "The call waits for a person's approval; claim it once it is approved.")
    if call.status == "closed":
        kind = call.closure.kind if call.closure else "closed"
        if filed.claim_token_hash == command.claim_token_hash and filed.reported_at is not None:
            return Refusal("already_reported", "This claim's result was reported; the call is closed.")
        return Refusal("call_closed", f"The call is closed ({kind}); it may not be claimed.")
    if filed.claim_token_hash is not None:
        if filed.claim_token_hash == command.claim_token_hash:
            return "again"
        return Refusal("claim_held", f"The call is claimed by {holder_said(filed)}.")
    return "grant"


def lease_end(at: datetime, seconds: int) -> datetime:
    return at + timedelta(seconds=seconds)


def judge_report(
    filed: FiledOnRecord | None, call: Call | None, command: ReportCallResult, at: datetime
) -> Refusal | None:
    """A result counts once, from the program that filed the call, with the token its
    claim was granted to, before the claim's lease ended."""
    refused = _whose(filed, call, command.program, command.call_id)
    if refused:
        return refused
    assert filed is not None and call is not None
    if filed.claim_token_hash is None:
        return Refusal("not_claimed", "The call was never claimed: claim it before reporting its result.")
    if filed.claim_token_hash != command.claim_token_hash:
        return Refusal("wrong_claim_token", "That is not the token this call's claim was granted to.")
    if filed.reported_at is not None:
        return Refusal("already_reported", "This call's result was reported once already.")
    if call.status == "closed" or (filed.lease_expires_at is not None and at > filed.lease_expires_at):
        return Refusal(
            "claim_lapsed",
            "The claim's lease ended before the result came: the call closed as outcome unknown, and a person "
            "was asked to settle it.",
        )
    return None


def may_lapse(filed: FiledOnRecord | None, call: Call | None, at: datetime) -> bool:
    """A claim whose lease ended with no result, on a call still open: it closes as outcome unknown."""
    return (
        filed is not None
        and call is not None
        and call.status != "closed"
        and filed.reported_at is None
        and filed.lease_expires_at is not None
        and at >= filed.lease_expires_at
    )


def lapsed_text(filed: FiledOnRecord) -> str:
    return (
        f"The caller claimed the call ({holder_said(filed)}) and did not report how it ended before its lease "
        "ended: whether it ran is unknown. It is never granted again; a person must find out what happened."
    )


def verdict_claims(
    *,
    filed_call_id: str,
    program: str,
    caller_call_id: str,
    request_id: str | None,
    tool: str,
    decision: str,
    arguments: dict[str, Any],
    args_fingerprint: str,
    responder: str | None,
    reason: str,
    edited_by: str | None,
    decided_at: datetime,
    message: str = "",
) -> dict[str, Any]:
    """What the ledger signs when a filed call is decided: enough for a caller outside
    the trust boundary to check that a person decided, and what they approved (the
    arguments to run, edited ones included; for an answer in the tool's place, the
    person's `message`, which the caller hands its model as the tool's result)."""
    return {
        "kind": "signoff.verdict",
        "call_id": filed_call_id,
        "program": program,
        "caller_call_id": caller_call_id,
        "request_id": request_id,
        "tool": tool,
        "decision": decision,
        "arguments": arguments,
        "args_fingerprint": args_fingerprint,
        "responder": responder,
        "reason": reason,
        "message": message,
        "edited_by": edited_by,
        "decided_at": decided_at.isoformat(),
    }
