"""The ledger's rules, as pure functions: no I/O, no clock, no randomness.

Handlers load rows, ask these functions what follows, and write the answer in
one unit of work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from shared.catalogue import ToolCatalogue, ToolSpec
from shared.messages import ProposedToolCall, TranscriptEntry

# Closure kinds and the reasons that are not a person's decision (invariant 5).
CLOSURE_KINDS = ("output", "error", "denied", "expired", "cancelled", "outcome_unknown")
BUSY_STATUSES = ("running", "waiting")


@dataclass(frozen=True)
class CallPlan:
    """What happens to one tool call the model asked for."""

    proposed: ProposedToolCall
    action: Literal["ask", "execute", "close"]
    spec: ToolSpec | None = None
    reason_code: str | None = None
    reason_text: str | None = None


def plan_calls(calls: list[ProposedToolCall], catalogue: ToolCatalogue) -> list[CallPlan]:
    """Decide, per call, whether to ask a person, run it now, or close it with an error.

    Invalid calls are closed before anyone is asked: a person should never be
    asked to approve a call that cannot run.
    """
    plans = []
    for call in calls:
        spec = catalogue.get(call.name)
        if spec is None:
            plans.append(CallPlan(call, "close", None, "unknown_tool", f"There is no tool named {call.name!r}."))
            continue
        if spec.implementation is None:
            plans.append(CallPlan(call, "close", spec, "no_implementation", f"The tool {call.name!r} has no implementation."))
            continue
        errors = spec.argument_errors(call.arguments)
        if errors:
            plans.append(
                CallPlan(call, "close", spec, "invalid_arguments", f"Invalid arguments for {call.name!r}: " + "; ".join(errors))
            )
            continue
        plans.append(CallPlan(call, "ask" if spec.approval == "always" else "execute", spec))
    return plans


@dataclass(frozen=True)
class ResponseVerdict:
    accepted: bool
    reason_code: str | None = None
    reason_text: str | None = None


def judge_response(
    *,
    request_found: bool,
    request_session_id: str | None,
    request_status: str | None,
    expected_digest: str | None,
    session_id: str,
    decision: str,
    args_digest: str,
) -> ResponseVerdict:
    """Whether a response may decide a request: it must name a pending request of
    its own session, and an approval must carry the digest of the arguments shown."""
    if not request_found or request_session_id != session_id:
        return ResponseVerdict(False, "unknown_request", "No approval request with that id exists in this session.")
    if request_status != "pending":
        return ResponseVerdict(False, "already_decided", f"The request is already {request_status}.")
    if decision == "approve" and args_digest != expected_digest:
        return ResponseVerdict(
            False,
            "digest_mismatch",
            "The approval names different arguments from the ones shown; refusing to run them.",
        )
    return ResponseVerdict(True)


def closure_text(kind: str, output: Any, reason_text: str | None) -> str:
    """What the model reads as a tool call's result. Every closure goes through here."""
    if kind == "output":
        return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
    if kind == "denied":
        return "The user denied this tool call." + (f" Reason: {reason_text}" if reason_text else "")
    if kind == "outcome_unknown":
        return (
            "Error: the tool may or may not have run (its executor stopped mid-call); "
            "it will not be retried automatically and an operator was told."
        )
    label = {"error": "Error", "expired": "Expired", "cancelled": "Cancelled"}.get(kind, kind)
    return f"{label}: {reason_text or 'no reason given'}"


def closure_entry(
    *, call_id: str, provider_call_id: str, tool: str, kind: str, output: Any, reason_text: str | None
) -> TranscriptEntry:
    if kind not in CLOSURE_KINDS:
        raise ValueError(f"unknown closure kind {kind!r}")
    return TranscriptEntry(
        role="tool",
        call_id=call_id,
        provider_call_id=provider_call_id,
        text=closure_text(kind, output, reason_text),
        closure=kind,
    )


def decision_note(responder: str, message: str) -> TranscriptEntry:
    """A person's message sent with a decision, for the very next model call."""
    return TranscriptEntry(role="user", text=f"[{responder}, with their decision] {message}")


def session_status(*, pending_requests: int, open_calls: int, turn_running: bool) -> str:
    if pending_requests:
        return "waiting"
    if open_calls or turn_running:
        return "running"
    return "idle"
