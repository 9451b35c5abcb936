"""Every message Signoff sends or accepts.

Commands are imperative (`RespondToApproval`), events past tense
(`ApprovalRequested`). Each carries the same envelope: a message id (the
deduplication key everywhere), the session it belongs to, the message that
caused it, a schema version and the time it was made.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import unicodedata
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

SCHEMA_VERSION: Literal[1] = 1
Identifier = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
ShortText = Annotated[str, Field(max_length=4000)]
# What a person wrote, as a channel relays it: bounded, and without NUL, which
# PostgreSQL's text refuses (the response would fail on every delivery instead of
# being answered).
PersonText = Annotated[str, Field(max_length=4000, pattern=r"^[^\x00]*$")]
# A tool's or a provider's name, as the catalogue and the settings allow them.
Name = Annotated[str, Field(max_length=256, pattern=r"^[^\x00]*$")]
# How a tool call ended, as its executor knows it.
Outcome = Literal["output", "error", "outcome_unknown"]


def mint(prefix: str) -> str:
    """A fresh id: the prefix and 128 random bits (invariant 2: ids are ours)."""
    return f"{prefix}_{secrets.token_hex(16)}"


def now() -> datetime:
    return datetime.now(UTC)


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

    @field_validator("arguments")
    @classmethod
    def _only_json_numbers(cls, arguments: dict[str, Any]) -> dict[str, Any]:
        # Python's JSON reader takes NaN and Infinity, which no JSON message can carry:
        # the call would be digested as one thing and reach its reader as another (null).
        if not _finite(arguments):
            raise ValueError("tool arguments hold a number JSON cannot carry (NaN or Infinity)")
        return arguments


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


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


class FiledBy(Model):
    """Where a filed call came from, as the card says it: the program (its principal),
    the origin it speaks for, its own call id and thread, its one-line summary, and
    whether the tool (and its schema) is the caller's word rather than the catalogue's."""

    program: str = Field(max_length=256)
    origin: str = Field(max_length=100)
    caller_call_id: str = Field(max_length=256)
    thread: str | None = Field(default=None, max_length=256)
    summary: str | None = Field(default=None, max_length=300)
    declared_by_caller: bool = False


class ApprovalCard(Model):
    """What the person sees (invariant 6): credentials redacted, nothing else hidden."""

    tool: str
    label: str
    description: str
    arguments: dict[str, Any]
    target: str
    effect: Literal["read", "idempotent", "outward"]
    # The paths of the arguments hidden on it (`api_token`, `auth/password`): a person
    # sees that a value is there and is withheld, never the value.
    hidden: list[str] = []
    # Why this call needs approval, and from how many: what the tool's approval rule
    # decided for these arguments ("amount 2,500 > 1,000: two approvers"), recorded with
    # the request. None on cards made before rules.
    reason: str | None = Field(default=None, max_length=300)
    # Set once a person changed the arguments before approving: who, and how (a short
    # diff, secrets hidden). The arguments above are then the edited ones.
    edited_by: str | None = Field(default=None, max_length=256)
    edit: str | None = Field(default=None, max_length=2000)
    # A call filed by a program through the intake (`FileCall`), not made by Signoff's
    # own model: who filed it, for which origin, and what it said. None otherwise.
    filed: FiledBy | None = None


# --- commands ---------------------------------------------------------------


class StartTurn(Envelope):
    type: Literal["turn.start"] = "turn.start"
    text: str = Field(min_length=1, max_length=100_000)
    # The model provider for a new session (e.g. "openai"); the default when unset.
    provider: str | None = Field(default=None, max_length=64, pattern=r"^[a-z0-9_-]+$")
    # The principal who started the turn (the CLI fills it in): kept on the turn, and
    # on the session for its first turn, so that a tool that forbids it can refuse the
    # starter's approval (separation of duties, docs/design.md "Trust boundaries").
    started_by: str | None = Field(default=None, min_length=1, max_length=256)
    # The caller's name for this turn: a start with a key the session's turns already
    # used starts nothing and is answered with that turn (`turn.repeated` in the audit
    # log); the same key with another text or starter is refused (`idempotency_key_reused`).
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")


class CancelTurn(Envelope):
    """Stop the session's open turn: its open requests close as cancelled, a call
    still running closes honestly (an outward one as outcome-unknown, and an
    operator is told), a model step still running is discarded when it reports, and
    the session can start a new turn."""

    type: Literal["turn.cancel"] = "turn.cancel"
    # The turn to cancel; None: whichever turn of the session is open.
    turn_id: Identifier | None = None
    reason: ShortText = ""
    cancelled_by: str = Field(default="unknown", max_length=256)


class Remember(Model):
    """Approve and remember: the approval also grants later calls
    of the same tool in the same session, on `target` (the card's target as shown;
    None: any target of the tool), for `hours` (None: the rest of the session), with no
    card. The ledger decides whether it may (`decision_rules.may_remember`)."""

    target: str | None = Field(default=None, max_length=4000)
    hours: Annotated[float, Field(allow_inf_nan=False)] | None = None


class RevokeGrant(Envelope):
    """Revoke a remembered approval: every call decided after it asks a person again.
    Sent by a channel for a person it may assert (`revoked_by`); the ledger judges
    whether they may (whoever granted it, started the session, may approve its tool,
    or an operator)."""

    type: Literal["grant.revoke"] = "grant.revoke"
    grant_id: Identifier
    revoked_by: str = Field(default="unknown", max_length=256, pattern=r"^[^\x00]*$")
    reason: PersonText = ""


# The intake: calls filed by programs (any agent) rather than made by Signoff's model.
# A caller's own text: bounded, printable (no control or format characters, which a
# card could not show as they are), never empty.
CallerId = Annotated[str, Field(min_length=1, max_length=256)]
OriginName = Annotated[str, Field(max_length=100, pattern=r"^[a-z][a-z0-9-]{0,31}:[A-Za-z0-9._-]{1,64}$")]
CallerToolName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")]
TokenHash = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


def printable(text: str | None) -> str | None:
    """The text, if it holds no control or format character (Unicode Cc, Cf, Zl, Zp):
    a caller's summary, call id or thread is shown on a card and in logs as written."""
    if text is not None and any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text):
        raise ValueError("holds a control or format character")
    return text


def filed_session_id(program: str, caller_call_id: str) -> str:
    """The session a filed call lives in, from who filed it and their own call id: the
    same call filed again, by any route, any number of times, locks the same session
    row, so the ledger sees each filing of it one after the other."""
    digest = hashlib.sha256(b"signoff-filed-call\0" + program.encode() + b"\0" + caller_call_id.encode())
    return "ses_" + digest.hexdigest()[:32]


def claim_token_hash(token: str) -> str:
    """What the ledger keeps of a claim token, and what claims and reports carry: the
    token itself stays with the caller (and the gateway that relays it)."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


class FileCall(Envelope):
    """A program files a tool call for sign-off (the intake). The ledger judges it by the
    operator's catalogue only: the origin must be declared there and name the program,
    the tool must be in the origin's declared set (or the origin must declare a default
    for tools the catalogue does not know), and the arguments must fit the tool's
    schema. Idempotent by (program, caller_call_id): `session_id` must be
    `filed_session_id(program, caller_call_id)`, and the same call filed again changes
    nothing (with other arguments it is refused, `call_id_reused`)."""

    type: Literal["call.file"] = "call.file"
    program: str = Field(min_length=1, max_length=256, pattern=r"^[^\x00]*$")
    origin: OriginName
    tool: CallerToolName
    arguments: dict[str, Any]
    caller_call_id: CallerId
    thread: str | None = Field(default=None, min_length=1, max_length=256)
    summary: str | None = Field(default=None, min_length=1, max_length=300)

    @field_validator("caller_call_id", "thread", "summary")
    @classmethod
    def _printable(cls, text: str | None) -> str | None:
        return printable(text)

    @field_validator("arguments")
    @classmethod
    def _only_json_numbers(cls, arguments: dict[str, Any]) -> dict[str, Any]:
        if not _finite(arguments):
            raise ValueError("tool arguments hold a number JSON cannot carry (NaN or Infinity)")
        return arguments


class ClaimCall(Envelope):
    """`runs: caller`: the program that filed an approved call claims it, to run it itself.
    Granted once, to one token (its hash here), for `lease_seconds`; claimed again with the
    same token it is the same claim; any other claim is refused, naming the holder."""

    type: Literal["call.claim"] = "call.claim"
    call_id: Identifier
    program: str = Field(min_length=1, max_length=256, pattern=r"^[^\x00]*$")
    claim_token_hash: TokenHash
    lease_seconds: int = Field(default=300, ge=5, le=24 * 3600)
    # Who claims, as the caller names itself (a host, a worker): a second claim's refusal names it.
    holder: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("holder")
    @classmethod
    def _printable(cls, text: str | None) -> str | None:
        return printable(text)


class ReportCallResult(Envelope):
    """`runs: caller`: how the claimed call ended, reported with its claim token (its hash),
    once. The ledger closes the call with it (an `output` or an `error`)."""

    type: Literal["call.report"] = "call.report"
    call_id: Identifier
    program: str = Field(min_length=1, max_length=256, pattern=r"^[^\x00]*$")
    claim_token_hash: TokenHash
    outcome: Literal["output", "error"]
    output: Any = None
    error: ShortText | None = None


class RespondToApproval(Envelope):
    """A person's answer, signed by the channel adapter that authenticated them.

    The signature (Ed25519, by the channel's registered key) covers `signed_part()`:
    everything the decision means, the response's own id (used once) and when it
    was issued. The envelope's message id is not covered: a redelivery keeps it,
    and a replay under a new one is caught by the response id."""

    type: Literal["approval.respond"] = "approval.respond"
    request_id: Identifier
    # `respond`: the person answers in the tool's place; the call does not run, and their
    # `message` is what the model reads as the tool's result.
    decision: Literal["approve", "deny", "respond"]
    args_digest: str = Field(max_length=100)
    reason: PersonText = ""
    message: PersonText = ""
    responder: str = Field(default="unknown", max_length=256, pattern=r"^[^\x00]*$")
    response_id: Identifier = Field(default_factory=lambda: mint("rsp"))
    # With its time zone: a time without one cannot be compared with the ledger's clock.
    issued_at: AwareDatetime = Field(default_factory=now)
    # The registered channel whose key signed it, and the signature.
    key_id: str | None = Field(default=None, max_length=64)
    signature: str | None = Field(default=None, max_length=200)
    # A one-time token from the request's card (a link or button): the channel that
    # received the click signs the response, which names `token:<channel>` as its
    # responder (no person), and the token may be redeemed once, for its request only.
    response_token: str | None = Field(default=None, min_length=1, max_length=100)
    # Edit before approve: the whole argument object as the person sent it from the card
    # (a field as shown is unchanged; a secret shown redacted keeps its real value). The
    # ledger judges it (`decision_rules.judge_edit`) and the approval then binds these
    # arguments; `args_digest` stays the digest of the card the person was shown.
    edited_arguments: dict[str, Any] | None = None
    # Approve and remember: the grant the person asked for with this approval (signed,
    # so a channel cannot widen it; refused as a whole if the ledger may not give it).
    remember: Remember | None = None

    @model_validator(mode="after")
    def _an_answer_says_something(self) -> RespondToApproval:
        # The answer is the tool's result: an empty one would tell the model nothing.
        if self.decision == "respond" and not self.message.strip():
            raise ValueError("a respond decision carries the person's answer in `message`")
        return self

    def signed_part(self) -> dict[str, Any]:
        signed: dict[str, Any] = {
            "response_id": self.response_id,
            "session_id": self.session_id,
            "request_id": self.request_id,
            "decision": self.decision,
            "args_digest": self.args_digest,
            "responder": self.responder,
            "reason": self.reason,
            "message": self.message,
            "issued_at": self.issued_at.isoformat(),
            "key_id": self.key_id,
        }
        # Only when redeemed: an adapter that never uses tokens never signs the field.
        if self.response_token is not None:
            signed["response_token"] = self.response_token
        # Only when set: an adapter that never edits never signs the field.
        if self.edited_arguments is not None:
            signed["edited_arguments"] = self.edited_arguments
        # Only when set: an adapter that never remembers never signs the field.
        if self.remember is not None:
            signed["remember"] = self.remember.model_dump(mode="json")
        return signed


class RequestModelStep(Envelope):
    """A model step, by reference (claim-check): the transcript is not carried but named,
    its first `transcript_length` entries in the ledger with their digest, which the
    model-step reads and checks. The command, and its outbox row, stay the same size
    however long the session grows (docs/design.md, "Bounded messages"). The tools the
    model is offered are named the same way: `tools_digest` names the catalogue's tool
    descriptions, stored once in the ledger (`tool_menus`), which the model-step reads,
    checks and keeps (shared/tool_menu.py)."""

    type: Literal["step.requested"] = "step.requested"
    step_id: Identifier
    provider: str = Field(max_length=64, pattern=r"^[a-z0-9_-]+$")
    transcript_length: int = Field(ge=0)
    transcript_digest: str = Field(max_length=80, pattern=r"^sha256:[0-9a-f]{64}$")
    # The digest of the tool menu offered (sha256 of the descriptions' canonical JSON).
    tools_digest: str | None = Field(default=None, max_length=80, pattern=r"^sha256:[0-9a-f]{64}$")
    # The descriptions themselves, as steps asked for before menus were named: used only
    # when `tools_digest` is None. The ledger no longer fills it.
    tools: list[ToolDescription] = []


class ExecuteTool(Envelope):
    type: Literal["tool.execute"] = "tool.execute"
    call_id: Identifier
    tool: Name
    arguments: dict[str, Any]
    idempotency_key: Identifier
    # The ledger's sealed authorization (shared/signatures.py): call, tool, arguments,
    # the decision or policy that allows it, and an expiry. Nothing runs without it.
    authorization: str = Field(default="", max_length=4000)


class RefuseExecution(Envelope):
    """The executor's report of a `tool.execute` it refused to run (forged, altered
    or expired authorization): the ledger tells an operator."""

    type: Literal["execution.refused"] = "execution.refused"
    call_id: Identifier
    tool: str = Field(max_length=256)
    reason_code: str = Field(max_length=64)
    reason_text: ShortText


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
    # The output was too large for a message: it is not carried (`output` is None) but
    # kept whole in the call's execution claim, where the ledger reads it.
    output_in_claim: bool = False


class ApprovalRequested(Envelope):
    """A call needs a person's approval: its card, and the digest an approval must carry.
    Sent again for the same request when an approver edited its arguments and the edited
    version needs more approvals (the count restarts): the card then names the edited
    arguments, `edited_by` and `edit`, and the digest is the edited arguments' (the one
    before is refused); a card sent again carries no response token."""

    type: Literal["approval.requested"] = "approval.requested"
    request_id: Identifier
    call_id: Identifier
    step_id: Identifier
    card: ApprovalCard
    args_digest: str
    # The session now waits on a person for these requests, this one included
    # (invariant 5): every card also says what else is open in its session.
    pending_request_ids: list[Identifier]
    # How many distinct people must approve (what the tool's rule decided for these
    # arguments when the request was made; the card says why).
    approvals_required: int = Field(default=1, ge=1)
    # The request's one-time response token, shown only here (the ledger keeps its
    # hash): a channel may answer with it instead of naming a person.
    response_token: str | None = None
    # When it closes as expired if nobody decides, and where it came from: the turn,
    # the model attempt that produced the call, and the ledger run that committed it.
    expires_at: datetime | None = None
    turn_id: Identifier | None = None
    attempt: int | None = None
    run_id: Identifier | None = None


class ApprovalEscalated(Envelope):
    """Nobody decided in the tool's escalation time: the request is announced again
    to a second group (`escalated_to`), who may now approve it as well."""

    type: Literal["approval.escalated"] = "approval.escalated"
    request_id: Identifier
    call_id: Identifier
    card: ApprovalCard
    args_digest: str
    escalated_to: list[str]


class ApprovalExpired(Envelope):
    """Nobody decided in time: the request is closed as expired, and the model is told."""

    type: Literal["approval.expired"] = "approval.expired"
    request_id: Identifier
    call_id: Identifier
    expired_at: datetime


class ApprovalCounted(Envelope):
    """An approval counted towards a request that needs several: still pending."""

    type: Literal["approval.counted"] = "approval.counted"
    request_id: Identifier
    call_id: Identifier
    responder: str
    # Distinct approvals so far, this one included, and how many the tool requires.
    count: int = Field(ge=1)
    required: int = Field(ge=1)


class ApprovalDecided(Envelope):
    type: Literal["approval.decided"] = "approval.decided"
    request_id: Identifier
    call_id: Identifier
    decision: Literal["approve", "deny", "respond"]
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
    # The call it concerns; None for an alert about a whole turn (it reached its bound).
    call_id: Identifier | None = None
    tool: str = ""
    reason_code: str
    reason_text: str
    turn_id: Identifier | None = None


class TurnCompleted(Envelope):
    type: Literal["turn.completed"] = "turn.completed"
    turn_id: Identifier
    text: str


class TurnFailed(Envelope):
    type: Literal["turn.failed"] = "turn.failed"
    turn_id: Identifier
    reason_code: str
    reason_text: str


class TurnCancelled(Envelope):
    type: Literal["turn.cancelled"] = "turn.cancelled"
    turn_id: Identifier
    cancelled_by: str
    reason: str = ""


class TurnRepeated(Envelope):
    """The answer to a start whose idempotency key already started a turn of the
    session: nothing new starts; this names the turn that key started."""

    type: Literal["turn.repeated"] = "turn.repeated"
    turn_id: Identifier
    idempotency_key: str = Field(max_length=200)


class MessageRejected(Envelope):
    """The machine-readable answer to input that does not fit (invariant 9)."""

    type: Literal["message.rejected"] = "message.rejected"
    rejected_message_id: str
    rejected_type: str
    reason_code: str
    reason_text: str


LEDGER_INPUTS = (
    StartTurn,
    CancelTurn,
    RespondToApproval,
    RevokeGrant,
    ModelStepCompleted,
    ToolExecuted,
    RefuseExecution,
    FileCall,
    ClaimCall,
    ReportCallResult,
)
SERVICE_COMMANDS = (RequestModelStep, ExecuteTool)
# Every event, written once: `Event` validates any of them, `AnyMessage` any message.
Events = (
    ApprovalRequested
    | ApprovalCounted
    | ApprovalDecided
    | ApprovalEscalated
    | ApprovalExpired
    | ToolCallClosed
    | OperatorAlerted
    | TurnCompleted
    | TurnFailed
    | TurnCancelled
    | TurnRepeated
    | MessageRejected
)
Event = Annotated[Events, Field(discriminator="type")]
EVENTS: tuple[type[Envelope], ...] = get_args(get_args(Event)[0])
AnyMessage = Annotated[
    StartTurn
    | CancelTurn
    | RespondToApproval
    | RevokeGrant
    | ModelStepCompleted
    | ToolExecuted
    | RefuseExecution
    | FileCall
    | ClaimCall
    | ReportCallResult
    | RequestModelStep
    | ExecuteTool
    | Events,
    Field(discriminator="type"),
]
ANY_MESSAGE: TypeAdapter[Any] = TypeAdapter(AnyMessage)
EVENT: TypeAdapter[Any] = TypeAdapter(Event)
EVENT_TYPES = frozenset(event.model_fields["type"].default for event in EVENTS)


def encode(message: Envelope) -> bytes:
    return message.model_dump_json().encode()
