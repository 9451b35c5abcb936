"""The intake over HTTP: any agent files a tool call for sign-off, waits for it, and
(for a tool it runs itself) claims it and reports how it ended; `GET /v1/keys` gives
the ledger's public key, which verifies the verdicts it signs.

- `POST /v1/calls`: file a call under the program's identity (its API token), for an
  origin the catalogue admits it for. Answered at once with the call, its status, its
  request's digest, expiry and card; nothing waits on a person here. Idempotent by
  (program, call id): filed again, the same call comes back; with other arguments, 409.
- `GET /v1/calls/{id}?wait=30`: the call as it stands, held up to `wait` seconds while
  it waits on a person or runs.
- `POST /v1/calls/{id}/claim`, `POST /v1/calls/{id}/result` (`runs: caller`): the
  claim, granted once to one token, and the result reported with that token, once.

The gateway judges nothing here that the ledger would not: it asks the catalogue's rule
(`shared.intake`) only to answer bad input before sending anything, and relays each
command as its channel, naming the program that logged in (never a name the body gives).
"""

import asyncio
import hashlib
import secrets
import time
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared import intake
from shared.keyring import LEDGER_PUBLIC_KEY
from shared.ledger.gateway_reads import FiledRecord
from shared.messages import (
    CallerId,
    CallerToolName,
    ClaimCall,
    FileCall,
    OriginName,
    ReportCallResult,
    ShortText,
    claim_token_hash,
    filed_session_id,
)
from shared.signatures import arguments_fingerprint

from .bodies import PROBLEMS
from .callers import Changer, Identifier, Who, gateway_of
from .problems import Problem

# Refusals that say the program may not do this (403); the others conflict with the call's state (409),
# or (the filing's own content) do not fit (422).
FORBIDDEN = {"origin_not_allowed", "unknown_origin", "tool_not_declared_for_origin", "wrong_principal"}
UNFIT = {"unknown_tool", "invalid_arguments", "unexpected_arguments", "no_implementation"}
# While a call is in one of these, `?wait=` holds the answer.
WAITING = ("pending", "running")
# How often a held `GET` reads the call again.
POLL_SECONDS = 0.1


# --- bodies --------------------------------------------------------------------------------


class Strict(BaseModel):
    # Unknown fields are refused: a misspelt field must not be silently dropped.
    model_config = ConfigDict(extra="forbid")


class FileBody(Strict):
    tool: CallerToolName
    arguments: dict[str, Any]
    # The caller's own id for this call (the framework's tool-call id): the same id
    # filed again is the same call.
    call_id: CallerId
    # The origin the program files for (`<kind>:<name>`, e.g. `langgraph:support`).
    origin: OriginName
    thread: str | None = None
    summary: str | None = None


class ClaimBody(Strict):
    # The caller's own claim token (random, 32+ characters): claiming again with it
    # is the same claim, so a retry after a lost answer re-attaches. Empty: one is made.
    claim_token: str | None = Field(default=None, min_length=32, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")
    lease_seconds: int = Field(default=300, ge=5, le=24 * 3600)
    holder: str | None = Field(default=None, min_length=1, max_length=128)


class ResultBody(Strict):
    claim_token: str = Field(min_length=32, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")
    outcome: Literal["output", "error"]
    output: Any = None
    error: ShortText | None = None


# --- answers -------------------------------------------------------------------------------


class Closed(BaseModel):
    kind: str
    reason_code: str | None = None
    reason_text: str | None = None
    output: Any = None


class ClaimState(BaseModel):
    holder: str | None
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    reported_at: datetime | None


class FiledShown(BaseModel):
    id: str
    # pending (waits on a person) | approved (runs: caller, to claim) | claimed | running
    # (Signoff's executor runs it) | closed (see `closure`)
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
    # The ledger's signed verdict (`<claims>.<signature>`, base64url; GET /v1/keys verifies it).
    verdict: str | None
    links: dict[str, str]


class ClaimShown(BaseModel):
    call_id: str
    claim_token: str
    tool: str
    # The arguments to run: what a person approved, edited ones included.
    arguments: dict[str, Any]
    lease_expires_at: datetime | None
    holder: str | None
    verdict: str | None


class Key(BaseModel):
    kid: str
    alg: str
    public_key: str


class Keys(BaseModel):
    keys: list[Key]


def _fingerprint(body: BaseModel) -> str:
    return arguments_fingerprint(body.model_dump(mode="json"))


def _message_id(*parts: str) -> str:
    """The message a filing, claim or result is sent as, from what it is: the same one sent
    again is the same message (the ledger's inbox drops it), whichever replica sends it."""
    digest = hashlib.sha256("\0".join(("signoff-intake", *parts)).encode()).hexdigest()
    return f"msg_{digest[:32]}"


async def _relay(gateway: Any, command: FileCall | ClaimCall | ReportCallResult) -> Any:
    """Send as the gateway's channel, and wait (a few seconds at most) for the ledger's verdict."""
    wait = gateway.settings.gateway_decision_wait_seconds
    return await gateway.watch.verdict(command.session_id, command.message_id, wait, lambda: gateway.send(command))


def _refused(code: str, text: str) -> Problem:
    status = 403 if code in FORBIDDEN else 422 if code in UNFIT else 409
    return Problem(status, code.replace("_", "-"), "Refused by the ledger's rules", text, reason_code=code)


async def _own(gateway: Any, who: Any, call_id: str) -> FiledRecord:
    """A filed call the caller may see: its own program's (operators: any); else 404."""
    filed = await gateway.ledger.record.filed_call(call_id)
    if filed is None or not (who.user.operator or filed.filed.program == who.user.name):
        raise Problem(404, "not-found", "No such call", "No filed call with that id that you may see.")
    return filed


def _same_call(filed: FiledRecord, fingerprint: str, shown: dict[str, Any], *, status: int) -> Any:
    if filed.filed.args_fingerprint != fingerprint:
        raise _refused("call_id_reused", f"The call id was filed before with other arguments (as {filed.filed.id}).")
    return JSONResponse(FiledShown.model_validate(shown).model_dump(mode="json"), status_code=status)


def status_of(filed: FiledRecord) -> str:
    if filed.closure is not None or filed.call.status == "closed":
        return "closed"
    if filed.call.status == "awaiting_approval":
        return "pending"
    if filed.filed.runs == "caller":
        return "claimed" if filed.filed.claim_token_hash else "approved"
    return "running"


async def _shown(gateway: Any, filed: FiledRecord) -> dict[str, Any]:
    row, request, closure = filed.filed, filed.request, filed.closure
    card = None
    if request is not None:
        card = await gateway.ledger.card(request)
    return {
        "id": row.id,
        "status": status_of(filed),
        "tool": row.tool,
        "origin": row.origin,
        "caller_call_id": row.caller_call_id,
        "thread": row.thread,
        "runs": row.runs,
        "request_id": row.request_id,
        "args_digest": request.args_digest if request else None,
        "expires_at": request.expires_at if request else None,
        "card": card,
        "closure": None
        if closure is None
        else {
            "kind": closure.kind,
            "reason_code": closure.reason_code,
            "reason_text": closure.reason_text,
            "output": (closure.output or {}).get("value"),
        },
        "claim": None
        if row.claim_token_hash is None
        else {
            "holder": row.claim_holder,
            "claimed_at": row.claimed_at,
            "lease_expires_at": row.lease_expires_at,
            "reported_at": row.reported_at,
        },
        "verdict": row.verdict,
        "links": {"self": f"/v1/calls/{row.id}", "wait": f"/v1/calls/{row.id}?wait=30"},
    }


# The intake's routes, with the gateway's own login dependencies (callers.py): `Who` (a
# program's token; a person's session), `Changer` (a session's changes carry its CSRF token).
router = APIRouter(tags=["calls"])
sent: dict[int | str, dict[str, Any]] = {
    202: {"description": "Sent, and the ledger has not answered yet: file the same call again"}
}


@router.post("/v1/calls", status_code=201, response_model=FiledShown, responses={**PROBLEMS, **sent})
async def file_call(body: FileBody, request: Request, who: Changer) -> Any:
    """File a tool call for sign-off, as the program that logged in. Answered at once
    (201; 200 for a call filed before), or 202 with its link if the ledger takes longer."""
    gateway = gateway_of(request)
    program = who.user.name
    fingerprint = arguments_fingerprint(body.arguments)
    earlier = await gateway.ledger.record.filed_call_by_caller(program, body.call_id)
    if earlier is not None:
        return _same_call(earlier, fingerprint, await _shown(gateway, earlier), status=200)
    try:
        command = FileCall(
            message_id=_message_id("file", program, body.call_id),
            session_id=filed_session_id(program, body.call_id),
            program=program,
            origin=body.origin,
            tool=body.tool,
            arguments=body.arguments,
            caller_call_id=body.call_id,
            thread=body.thread,
            summary=body.summary,
        )
    except ValidationError as error:
        shown = [{"loc": list(e.get("loc", ())), "type": e.get("type"), "msg": e.get("msg")} for e in error.errors()]
        raise Problem(422, "invalid", "The call does not fit", errors=shown) from None
    judged = intake.judge_filing(gateway.ledger.catalogue, command)
    if isinstance(judged, intake.Refused):
        raise _refused(judged.reason_code, judged.reason_text)
    verdict = await _relay(gateway, command)
    if verdict is not None and verdict.kind == "message.rejected":
        detail = verdict.detail or {}
        raise _refused(str(detail.get("reason_code")), str(detail.get("reason_text", "")))
    filed = await gateway.ledger.record.filed_call_by_caller(program, body.call_id)
    if filed is None:
        return JSONResponse(
            {"status": "filing", "caller_call_id": body.call_id, "links": {"retry": "/v1/calls"}}, status_code=202
        )
    return _same_call(filed, fingerprint, await _shown(gateway, filed), status=201)


@router.get("/v1/calls/{call_id}", response_model=FiledShown, responses=PROBLEMS)
async def show_call(
    call_id: Identifier, request: Request, who: Who, wait: Annotated[float, Query(ge=0, le=60)] = 0
) -> Any:
    """The call as it stands; with `wait`, held up to that many seconds while it waits
    on a person or runs, answered at once when that ends."""
    gateway = gateway_of(request)
    deadline = time.monotonic() + wait
    filed = await _own(gateway, who, call_id)
    shown = await _shown(gateway, filed)
    while shown["status"] in WAITING and time.monotonic() < deadline:
        await asyncio.sleep(POLL_SECONDS)
        filed = await _own(gateway, who, call_id)
        shown = await _shown(gateway, filed)
    return shown


@router.post("/v1/calls/{call_id}/claim", response_model=ClaimShown, responses=PROBLEMS)
async def claim_call(call_id: Identifier, body: ClaimBody, request: Request, who: Changer) -> Any:
    """`runs: caller`: claim the approved call, to run it. Granted once, to one token
    (yours, or one made here), for `lease_seconds`; claimed again with the same token
    it is the same claim. A claim whose lease ends with no result closes the call as
    outcome unknown, and a person is asked."""
    gateway = gateway_of(request)
    filed = await _own(gateway, who, call_id)
    token = body.claim_token or secrets.token_urlsafe(32)
    hashed = claim_token_hash(token)
    command = ClaimCall(
        message_id=_message_id("claim", who.user.name, call_id, hashed),
        session_id=filed.filed.session_id,
        call_id=call_id,
        program=who.user.name,
        claim_token_hash=hashed,
        lease_seconds=body.lease_seconds,
        holder=body.holder,
    )
    verdict = await _relay(gateway, command)
    if verdict is None:
        raise Problem(503, "ledger-busy", "The ledger has not answered yet", "Claim again with the same token.")
    if verdict.kind == "message.rejected":
        detail = verdict.detail or {}
        raise _refused(str(detail.get("reason_code")), str(detail.get("reason_text", "")))
    filed = await _own(gateway, who, call_id)
    return {
        "call_id": call_id,
        "claim_token": token,
        "tool": filed.filed.tool,
        "arguments": filed.call.arguments,
        "lease_expires_at": filed.filed.lease_expires_at,
        "holder": filed.filed.claim_holder,
        "verdict": filed.filed.verdict,
    }


@router.post("/v1/calls/{call_id}/result", response_model=FiledShown, responses=PROBLEMS)
async def report_result(call_id: Identifier, body: ResultBody, request: Request, who: Changer) -> Any:
    """`runs: caller`: how the claimed call ended, with the claim's token, once."""
    gateway = gateway_of(request)
    filed = await _own(gateway, who, call_id)
    hashed = claim_token_hash(body.claim_token)
    command = ReportCallResult(
        # The same report sent again is the same message; another with the same token is refused.
        message_id=_message_id("result", who.user.name, call_id, hashed, _fingerprint(body)),
        session_id=filed.filed.session_id,
        call_id=call_id,
        program=who.user.name,
        claim_token_hash=hashed,
        outcome=body.outcome,
        output=body.output,
        error=body.error,
    )
    verdict = await _relay(gateway, command)
    if verdict is None:
        raise Problem(503, "ledger-busy", "The ledger has not answered yet", "Report again with the same token.")
    if verdict.kind == "message.rejected":
        detail = verdict.detail or {}
        raise _refused(str(detail.get("reason_code")), str(detail.get("reason_text", "")))
    return await _shown(gateway, await _own(gateway, who, call_id))


@router.get("/v1/keys", response_model=Keys, responses=PROBLEMS)
async def keys(request: Request, who: Who) -> Any:
    """The ledger's public key (Ed25519, raw, base64url): it verifies the verdicts the
    ledger signs (`verdict` on a filed call)."""
    path = gateway_of(request).settings.keys_path / LEDGER_PUBLIC_KEY
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        raise Problem(404, "not-found", "No ledger key here", "Run `signoff setup`.") from None
    return {"keys": [{"kid": "ledger", "alg": "Ed25519", "public_key": key}]}
