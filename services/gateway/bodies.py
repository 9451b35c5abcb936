"""The gateway's request bodies and answers: what docs/openapi.json describes.

Bodies refuse unknown fields (`Strict`); every refusal is a problem document (PROBLEMS).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .problems import PROBLEM

ID = r"^[A-Za-z0-9_-]{1,64}$"


class Strict(BaseModel):
    # Unknown fields are refused: a misspelt `reason` must not be silently dropped.
    model_config = ConfigDict(extra="forbid")


class LoginBody(Strict):
    name: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)


class Me(BaseModel):
    principal: str
    operator: bool
    groups: list[str]
    csrf_token: str
    expires_at: float


class StartBody(Strict):
    text: str = Field(min_length=1, max_length=100_000)
    # The id of a new session, or of one the caller started (a new turn in it); empty: a new one.
    session_id: str | None = Field(default=None, pattern=ID)
    provider: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[a-z0-9_-]+$",
        description="The model provider of a new session (scripted, openai, anthropic): one the model-step holds, "
        "as its settings say; unset: SIGNOFF_PROVIDER. A turn in an existing session keeps the session's.",
    )


class Started(BaseModel):
    session_id: str
    message_id: str
    links: dict[str, str]
    # The turn the ledger started, or the one this Idempotency-Key started before
    # (`repeated`: nothing new started). None: not judged within the wait; see the session.
    turn_id: str | None = None
    repeated: bool = False


class CancelBody(Strict):
    reason: str = Field(default="", max_length=4000, pattern=r"^[^\x00]*$")


class Cancelled(BaseModel):
    session_id: str
    message_id: str


class DecisionBody(Strict):
    # `respond`: answer in the tool's place with `message` (required); the call does not
    # run and the model reads the message as the tool's result.
    decision: Literal["approve", "deny", "respond"]
    reason: str = Field(default="", max_length=4000, pattern=r"^[^\x00]*$")
    message: str = Field(default="", max_length=4000, pattern=r"^[^\x00]*$")
    # The digest on the card the person read; the ledger refuses an approval of other arguments.
    # Empty: the request's digest as the ledger holds it.
    args_digest: str | None = Field(default=None, max_length=100)
    # Edit before approve: the whole argument object as edited from the card (fields as
    # shown are unchanged). Relayed as sent: the ledger judges it against the tool's
    # declaration and schema, and the approval then binds these arguments.
    arguments: dict[str, Any] | None = None
    # Approve and remember: also allow later calls of this tool in this session, on the
    # card's target (`target` as the card shows it) or any (`target` null), for `hours`
    # (null: the rest of the session). Relayed as sent: the ledger decides whether it may.
    remember: RememberBody | None = None

    @model_validator(mode="after")
    def _an_answer_says_something(self) -> DecisionBody:
        if self.decision == "respond" and not self.message.strip():
            raise ValueError("a respond decision needs the answer in `message`")
        return self


class RememberBody(Strict):
    target: str | None = Field(default=None, max_length=4000)
    hours: float | None = Field(default=None, allow_inf_nan=False)


class GrantShown(BaseModel):
    id: str
    session_id: str
    request_id: str
    granted_by: str
    tool: str
    tool_version: str
    # None: any target of the tool.
    target: str | None
    approvals_required: int
    granted_at: datetime
    # None: for the rest of the session.
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None
    # Whether it still covers calls (neither revoked nor expired).
    live: bool


class Grants(BaseModel):
    grants: list[GrantShown]


class RevokeBody(Strict):
    reason: str = Field(default="", max_length=4000, pattern=r"^[^\x00]*$")


class Revoking(BaseModel):
    grant_id: str
    message_id: str


class Verdict(BaseModel):
    response_id: str
    request_id: str
    decision: Literal["approve", "deny", "respond"]
    responder: str
    outcome: Literal["accepted"]
    # Whether this response decided the request; when it needs more approvals, how many so far.
    decided: bool
    approvals: int | None = None
    approvals_required: int | None = None


class Pending(BaseModel):
    response_id: str
    request_id: str
    status: Literal["pending"]
    links: dict[str, str]


class Card(BaseModel):
    id: str
    session_id: str
    status: str
    tool: str
    label: str
    description: str
    effect: str
    target: str
    arguments: dict[str, Any]
    hidden: list[str]
    args_digest: str
    created_at: datetime
    expires_at: datetime | None
    approvers: list[str] | None
    approvals: int
    approvals_required: int
    # Why the call needs approval, and from how many (the tool's rule over its arguments).
    reason: str | None = None
    # Set once a person changed the arguments before approving: who, and how (a short diff).
    edited_by: str | None = None
    edit: str | None = None
    # A call a program filed (the intake): who, for which origin, its call id, thread and summary.
    filed: dict[str, Any] | None = None
    starter_may_approve: bool
    # Whether the tool may be remembered ("approve and remember"); the ledger still judges.
    rememberable: bool = False


class Cards(BaseModel):
    requests: list[Card]
    # The next page: pass it back as `cursor` (None: this was the last).
    next: str | None = None


class TranscriptEntryShown(BaseModel):
    role: str
    text: str
    tool_calls: list[dict[str, Any]]
    call_id: str | None
    closure: str | None


class LastTurnShown(BaseModel):
    id: str
    # running | completed | failed | cancelled
    status: str
    started_by: str | None
    started_at: datetime
    ended_at: datetime | None
    # Why it failed or was cancelled, as its `turn.failed` or `turn.cancelled` said (redacted).
    reason_code: str | None
    reason: str | None
    ended_by: str | None


class SessionShown(BaseModel):
    id: str
    status: str
    # Why it is as it is: an idle session whose last turn failed or was cancelled says so.
    status_reason: str | None
    # Its newest turn, running or ended (None: no turn yet).
    last_turn: LastTurnShown | None = None
    started_by: str | None
    created_at: datetime
    updated_at: datetime
    transcript: list[TranscriptEntryShown]
    pending_requests: list[Card]
    usage: dict[str, int]
    # Its remembered approvals, live or not.
    grants: list[GrantShown] = []


class ProblemDocument(BaseModel):
    """RFC 9457: `type` is machine-readable (`urn:signoff:problem:<kind>`; a ledger refusal's
    kind is its reason code), `title` and `detail` are for people."""

    type: str
    title: str
    status: int
    detail: str | None = None
    # A ledger refusal: its reason code and the response it refused.
    reason_code: str | None = None
    response_id: str | None = None
    # A start refused because the session is busy: the turn that keeps it so.
    turn_id: str | None = None
    # Validation: where and what, never the input itself.
    errors: list[dict[str, Any]] | None = None


PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"description": "A problem document", "content": {PROBLEM: {"schema": ProblemDocument.model_json_schema()}}}
    for code in (400, 401, 403, 404, 409, 413, 422, 429)
}
