"""What the gateway's intake answers (its OpenAPI document, `docs/openapi.json`), as
the SDK reads it. Unknown fields are kept out of the way (`extra="ignore"`): a newer
gateway may say more."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Closed(Answer):
    """How a call ended: `output`, `error`, `denied`, `answered` (a person answered in the
    tool's place), `expired`, `cancelled`, `outcome_unknown`, …"""

    kind: str
    reason_code: str | None = None
    reason_text: str | None = None
    output: Any = None


class ClaimState(Answer):
    holder: str | None
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    reported_at: datetime | None


class FiledShown(Answer):
    """A filed call as it stands. `status`: pending (waits on a person), approved (the
    caller runs it: claim it), claimed, running (Signoff's executor runs it), closed."""

    id: str
    status: str
    tool: str
    origin: str
    caller_call_id: str
    thread: str | None
    runs: str
    request_id: str | None
    args_digest: str | None
    expires_at: datetime | None
    card: dict[str, Any] | None
    closure: Closed | None
    claim: ClaimState | None
    verdict: str | None
    links: dict[str, str]


class ClaimShown(Answer):
    """A granted claim: the token to report with, and the arguments to run (what a
    person approved, edited ones included), with the ledger's signed verdict."""

    call_id: str
    claim_token: str
    tool: str
    arguments: dict[str, Any]
    lease_expires_at: datetime | None
    holder: str | None
    verdict: str | None


class Key(Answer):
    kid: str
    alg: str
    public_key: str


class Keys(Answer):
    keys: list[Key]


class Verdict(Answer):
    """What the ledger signed when a person decided a filed call."""

    kind: str
    call_id: str
    program: str
    caller_call_id: str
    request_id: str | None = None
    tool: str
    decision: str
    arguments: dict[str, Any]
    args_fingerprint: str
    responder: str | None = None
    reason: str = ""
    # `respond`: the person's answer in the tool's place (the tool's result for the model).
    message: str = ""
    edited_by: str | None = None
    decided_at: str


# A decided call's closure and the signed decision it must carry.
DECIDED_AS = {"output": "approve", "denied": "deny", "answered": "respond"}


class Event(Answer):
    """One event of `GET /v1/events`: its id (where a stream resumes), its type
    (`approval.decided`, `tool.closed`, …; "" for the id alone a stream may begin with)
    and the event's JSON."""

    id: str
    type: str
    data: dict[str, Any]


# The gateway's answer schemas the SDK reads, by their OpenAPI names.
SCHEMAS: dict[str, type[Answer]] = {
    "FiledShown": FiledShown,
    "Closed": Closed,
    "ClaimState": ClaimState,
    "ClaimShown": ClaimShown,
    "Key": Key,
    "Keys": Keys,
}
