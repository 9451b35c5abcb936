"""Every message Signoff sends or accepts.

Commands are imperative (`RespondToApproval`), events past tense
(`ApprovalRequested`). Each carries the same envelope: a message id (the
deduplication key everywhere), the session it belongs to, the message that
caused it, a schema version and the time it was made.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

SCHEMA_VERSION: Literal[1] = 1
Identifier = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
ShortText = Annotated[str, Field(max_length=4000)]
# How a tool call ended, as its executor knows it.
Outcome = Literal["output", "error", "outcome_unknown"]


def mint(prefix: str) -> str:
    """A fresh id: the prefix and 128 random bits (invariant 2: ids are ours)."""
    return f"{prefix}_{secrets.token_hex(16)}"


def now() -> datetime:
    return datetime.now(UTC)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def arguments_digest(arguments: dict[str, Any]) -> str:
    """The digest a decision is bound to (invariant 6): the exact, unredacted arguments."""
    return "sha256:" + hashlib.sha256(canonical_json(arguments).encode()).hexdigest()


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Envelope(Model):
    # Each message narrows it to its own literal (`turn.start`, `approval.requested`, …).
    type: str
    message_id: Identifier = Field(default_factory=lambda: mint("msg"))
    session_id: Identifier
    causation_id: Identifier | None = None
    schema_version: Literal[1] = SCHEMA_VERSION
    occurred_at: datetime = Field(default_factory=now)
    # Per-session order of events published from the ledger's outbox.
    sequence: int | None = None


# --- parts -----------------------------------------------------------------


class Usage(Model):
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)


class ProviderAttempt(Model):
    number: int = Field(ge=1)
    status: Literal["completed", "failed", "abandoned"]
    provider: str
    usage: Usage = Usage()
    error: ShortText | None = None


class ProposedToolCall(Model):
    """A tool call as the model asked for it; the provider's id is for correlation only."""

    provider_call_id: str = Field(max_length=256)
    name: str = Field(max_length=256)
    arguments: dict[str, Any]


class TranscriptCall(Model):
    call_id: Identifier
    provider_call_id: str
    name: str
    arguments: dict[str, Any]


class TranscriptEntry(Model):
    role: Literal["user", "assistant", "tool"]
    text: str = ""
    tool_calls: list[TranscriptCall] = []
    # Tool results only: which call this closes and how.
    call_id: Identifier | None = None
    provider_call_id: str | None = None
    closure: str | None = None


class ToolDescription(Model):
    name: str
    description: str
    parameters: dict[str, Any]


class ApprovalCard(Model):
    """What the person sees (invariant 6): credentials redacted, nothing else hidden."""

    tool: str
    label: str
    description: str
    arguments: dict[str, Any]
    target: str
    effect: Literal["read", "idempotent", "outward"]


# --- commands ---------------------------------------------------------------


class StartTurn(Envelope):
    type: Literal["turn.start"] = "turn.start"
    text: str = Field(min_length=1, max_length=100_000)
    # The model provider for a new session (e.g. "openai"); the default when unset.
    provider: str | None = Field(default=None, max_length=64, pattern=r"^[a-z0-9_-]+$")


class RespondToApproval(Envelope):
    type: Literal["approval.respond"] = "approval.respond"
    request_id: Identifier
    decision: Literal["approve", "deny"]
    args_digest: str = Field(max_length=100)
    reason: ShortText = ""
    message: ShortText = ""
    responder: str = Field(default="unknown", max_length=256)


class RequestModelStep(Envelope):
    type: Literal["step.requested"] = "step.requested"
    step_id: Identifier
    provider: str
    transcript: list[TranscriptEntry]
    tools: list[ToolDescription]


class ExecuteTool(Envelope):
    type: Literal["tool.execute"] = "tool.execute"
    call_id: Identifier
    tool: str
    arguments: dict[str, Any]
    idempotency_key: Identifier


# --- events -----------------------------------------------------------------


class ModelStepCompleted(Envelope):
    type: Literal["step.completed"] = "step.completed"
    step_id: Identifier
    text: str = ""
    tool_calls: list[ProposedToolCall] = []
    attempts: list[ProviderAttempt] = Field(min_length=1)
    # Set when the provider could not answer at all; the turn fails with it.
    error: ShortText | None = None


class ToolExecuted(Envelope):
    type: Literal["tool.completed"] = "tool.completed"
    call_id: Identifier
    outcome: Outcome
    output: Any = None
    error: ShortText | None = None


class ApprovalRequested(Envelope):
    type: Literal["approval.requested"] = "approval.requested"
    request_id: Identifier
    call_id: Identifier
    step_id: Identifier
    card: ApprovalCard
    args_digest: str
    # The session now waits on a person for these requests, this one included
    # (invariant 5): every card also says what else is open in its session.
    pending_request_ids: list[Identifier]


class ApprovalDecided(Envelope):
    type: Literal["approval.decided"] = "approval.decided"
    request_id: Identifier
    call_id: Identifier
    decision: Literal["approve", "deny"]
    reason: str = ""
    responder: str


class ToolCallClosed(Envelope):
    type: Literal["tool.closed"] = "tool.closed"
    call_id: Identifier
    kind: str
    reason_code: str | None = None
    reason_text: str | None = None


class OperatorAlerted(Envelope):
    """Something only a person can settle: e.g. an outward call whose outcome is unknown (invariant 4)."""

    type: Literal["operator.alerted"] = "operator.alerted"
    call_id: Identifier
    tool: str
    reason_code: str
    reason_text: str


class TurnCompleted(Envelope):
    type: Literal["turn.completed"] = "turn.completed"
    turn_id: Identifier
    text: str


class TurnFailed(Envelope):
    type: Literal["turn.failed"] = "turn.failed"
    turn_id: Identifier
    reason_code: str
    reason_text: str


class MessageRejected(Envelope):
    """The machine-readable answer to input that does not fit (invariant 9)."""

    type: Literal["message.rejected"] = "message.rejected"
    rejected_message_id: str
    rejected_type: str
    reason_code: str
    reason_text: str


LEDGER_INPUTS = (StartTurn, RespondToApproval, ModelStepCompleted, ToolExecuted)
SERVICE_COMMANDS = (RequestModelStep, ExecuteTool)
Event = Annotated[
    ApprovalRequested
    | ApprovalDecided
    | ToolCallClosed
    | OperatorAlerted
    | TurnCompleted
    | TurnFailed
    | MessageRejected,
    Field(discriminator="type"),
]
EVENTS: tuple[type[Envelope], ...] = get_args(get_args(Event)[0])
AnyMessage = Annotated[
    StartTurn
    | RespondToApproval
    | ModelStepCompleted
    | ToolExecuted
    | RequestModelStep
    | ExecuteTool
    | ApprovalRequested
    | ApprovalDecided
    | ToolCallClosed
    | OperatorAlerted
    | TurnCompleted
    | TurnFailed
    | MessageRejected,
    Field(discriminator="type"),
]
ANY_MESSAGE: TypeAdapter[Any] = TypeAdapter(AnyMessage)
EVENT: TypeAdapter[Any] = TypeAdapter(Event)
EVENT_TYPES = frozenset(event.model_fields["type"].default for event in EVENTS)


def encode(message: Envelope) -> bytes:
    return message.model_dump_json().encode()
