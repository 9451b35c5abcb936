"""What the gateway answers, as typed objects: one model per response schema of its
OpenAPI document (`GET /v1/openapi.json`, checked in as docs/openapi.json).

They mirror the gateway's own models field for field and type for type
(tests/unit/test_sdk.py compares them with the document), but they accept fields
they do not know: a newer gateway may add some, and an older SDK must still read
its answers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Me(Answer):
    """Who is logged in, and the CSRF token a state-changing request carries."""

    principal: str
    operator: bool
    groups: list[str]
    csrf_token: str
    expires_at: float


class Started(Answer):
    session_id: str
    message_id: str
    links: dict[str, str]
    # The turn started, or the one the same Idempotency-Key started before (`repeated`).
    turn_id: str | None = None
    repeated: bool = False


class Cancelled(Answer):
    session_id: str
    message_id: str


class Verdict(Answer):
    """The ledger's verdict on an accepted decision. `decided` is False while a tool
    that needs several approvals has not had them all (`approvals` of `approvals_required`)."""

    response_id: str
    request_id: str
    decision: Literal["approve", "deny", "respond"]
    responder: str
    outcome: Literal["accepted"]
    decided: bool
    approvals: int | None = None
    approvals_required: int | None = None


class Pending(Answer):
    """A decision sent whose verdict the ledger has not committed yet: poll `links["poll"]`."""

    response_id: str
    request_id: str
    status: Literal["pending"]
    links: dict[str, str]


class Card(Answer):
    """An approval request as a person sees it: credentials redacted (`hidden` names them)."""

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
    # Whether "approve and remember" may be offered for it (the ledger still judges).
    rememberable: bool = False


class Cards(Answer):
    requests: list[Card]
    # The next page's cursor (`requests_page(cursor=…)`); None: this was the last page.
    next: str | None = None


class TranscriptEntryShown(Answer):
    role: str
    text: str
    tool_calls: list[dict[str, Any]]
    call_id: str | None
    closure: str | None


class GrantShown(Answer):
    """A remembered approval: calls of `tool` in `session_id` on `target` (None: any)
    run with no card until `expires_at` (None: the rest of the session) or revoked."""

    id: str
    session_id: str
    request_id: str
    granted_by: str
    tool: str
    tool_version: str
    target: str | None
    approvals_required: int
    granted_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None
    live: bool


class Grants(Answer):
    grants: list[GrantShown]


class Revoking(Answer):
    """A revocation sent; the ledger judges whether the caller may revoke the grant."""

    grant_id: str
    message_id: str


class LastTurnShown(Answer):
    """A session's newest turn: running, or how it ended, when, by whom and why."""

    id: str
    status: str
    started_by: str | None
    started_at: datetime
    ended_at: datetime | None
    reason_code: str | None
    reason: str | None
    ended_by: str | None


class SessionShown(Answer):
    """A session: its status, its transcript as the card shows it, what waits on a person, its usage."""

    id: str
    status: str
    status_reason: str | None
    last_turn: LastTurnShown | None = None
    started_by: str | None
    created_at: datetime
    updated_at: datetime
    transcript: list[TranscriptEntryShown]
    pending_requests: list[Card]
    usage: dict[str, int]
    grants: list[GrantShown] = []


class ProblemDocument(Answer):
    """An RFC 9457 problem: `type` is machine-readable (`urn:signoff:problem:<kind>`; a
    ledger refusal's kind is its reason code), `title` and `detail` are for people."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str
    title: str
    status: int
    detail: str | None = None
    # A ledger refusal: its reason code and the response it refused.
    reason_code: str | None = None
    response_id: str | None = None
    # A start refused because the session is busy: the turn that keeps it so.
    turn_id: str | None = None
    # A request that does not fit: where and what.
    errors: list[dict[str, Any]] | None = None


class Event(Answer):
    """One Server-Sent Event of `GET /v1/events`: its id (where a stream resumes), its
    type (`approval.requested`, `turn.completed`, …) and the event's JSON."""

    id: str
    type: str
    data: dict[str, Any]

    @property
    def session_id(self) -> str | None:
        return self.data.get("session_id")

    @property
    def request_id(self) -> str | None:
        return self.data.get("request_id")


# The response schemas of the gateway's OpenAPI document each model stands for
# (tests/unit/test_sdk.py checks that they agree). The problem document is not a named
# schema there: each error response holds it inline.
SCHEMAS: dict[str, type[Answer]] = {
    "Me": Me,
    "Started": Started,
    "Cancelled": Cancelled,
    "Verdict": Verdict,
    "Pending": Pending,
    "Card": Card,
    "Cards": Cards,
    "TranscriptEntryShown": TranscriptEntryShown,
    "LastTurnShown": LastTurnShown,
    "SessionShown": SessionShown,
    "GrantShown": GrantShown,
    "Grants": Grants,
    "Revoking": Revoking,
    "ProblemDocument": ProblemDocument,
}
