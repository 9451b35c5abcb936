"""What the ledger's handlers read, each in one query built once, as typed values.

A transition reads what it needs on its unit of work's connection, after the
session row is locked: a step; a call with every call of its step; or a request
with its call and every call of its step. What a transition itself writes is
never read back; the transcript is read only to compute the digest of a session from before digests.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Row, bindparam, func, select, union_all

from shared.ledger.tables import TABLES

from .domain import Call, ClaimOnRecord, ClosureOnRecord, Note, RequestOnRecord, Step, TurnSpend, starters_of
from .unit_of_work import SessionState, UnitOfWork

STEPS = TABLES["steps"]
TRANSCRIPT = TABLES["transcript"]
TOOL_CALLS = TABLES["tool_calls"]
APPROVAL_REQUESTS = TABLES["approval_requests"]
DECISIONS = TABLES["decisions"]
APPROVALS = TABLES["approvals"]
CLOSURES = TABLES["closures"]
TURNS = TABLES["turns"]
SESSIONS = TABLES["sessions"]
CLAIMS = TABLES["execution_claims"]

_pending = APPROVAL_REQUESTS.alias("pending")


def _session_waits(*, besides=None):
    """Whether the session has a pending approval request (other than `besides`), as a column."""
    condition = [_pending.c.session_id == bindparam("session_id"), _pending.c.status == "pending"]
    if besides is not None:
        condition.append(_pending.c.id != besides)
    return select(_pending.c.id).where(*condition).exists().label("waiting")


_TRANSCRIPT = (
    select(TRANSCRIPT.c.entry)
    .where(TRANSCRIPT.c.session_id == bindparam("session_id"), TRANSCRIPT.c.position <= bindparam("upto"))
    .order_by(TRANSCRIPT.c.position)
)
_STEP = select(STEPS.c.id, STEPS.c.session_id, STEPS.c.turn_id, STEPS.c.status, _session_waits()).where(
    STEPS.c.id == bindparam("step_id")
)
_PENDING = (
    select(APPROVAL_REQUESTS.c.id)
    .where(APPROVAL_REQUESTS.c.session_id == bindparam("session_id"), APPROVAL_REQUESTS.c.status == "pending")
    .order_by(APPROVAL_REQUESTS.c.created_at, APPROVAL_REQUESTS.c.id)
)
# A response id counts once: as a decision, or as one approval of several.
_DUE = (
    select(APPROVAL_REQUESTS.c.id, APPROVAL_REQUESTS.c.session_id)
    .where(APPROVAL_REQUESTS.c.status == "pending", APPROVAL_REQUESTS.c.expires_at <= bindparam("at"))
    .order_by(APPROVAL_REQUESTS.c.expires_at)
    .limit(bindparam("limit"))
)
_DUE_ESCALATIONS = (
    select(APPROVAL_REQUESTS.c.id, APPROVAL_REQUESTS.c.session_id)
    .where(
        APPROVAL_REQUESTS.c.status == "pending",
        APPROVAL_REQUESTS.c.escalate_at <= bindparam("at"),
        APPROVAL_REQUESTS.c.escalated_at.is_(None),
    )
    .order_by(APPROVAL_REQUESTS.c.escalate_at)
    .limit(bindparam("limit"))
)
_RESPONSE_USED = union_all(
    select(DECISIONS.c.request_id).where(DECISIONS.c.response_id == bindparam("response_id")),
    select(APPROVALS.c.request_id).where(APPROVALS.c.response_id == bindparam("response_id")),
)
# Every call of a step, in the model's order, with what resuming the step needs:
# its closure, its decision's note, the step's turn, and whether the session waits.
_target = TOOL_CALLS.alias("target")
_SIBLINGS = (
    TOOL_CALLS.join(STEPS, STEPS.c.id == TOOL_CALLS.c.step_id)
    .outerjoin(CLOSURES, CLOSURES.c.call_id == TOOL_CALLS.c.id)
    .outerjoin(APPROVAL_REQUESTS, APPROVAL_REQUESTS.c.call_id == TOOL_CALLS.c.id)
    .outerjoin(DECISIONS, DECISIONS.c.request_id == APPROVAL_REQUESTS.c.id)
)
_CALL_COLUMNS = (
    TOOL_CALLS.c.id,
    TOOL_CALLS.c.session_id,
    TOOL_CALLS.c.step_id,
    TOOL_CALLS.c.provider_call_id,
    TOOL_CALLS.c.tool,
    TOOL_CALLS.c.arguments,
    TOOL_CALLS.c.idempotency_key,
    TOOL_CALLS.c.status,
    STEPS.c.turn_id,
    CLOSURES.c.kind,
    CLOSURES.c.output,
    CLOSURES.c.reason_code,
    CLOSURES.c.reason_text,
    DECISIONS.c.responder,
    DECISIONS.c.message,
)
# A tool call and the other calls of its step.
_CALL_AND_SIBLINGS = (
    select(*_CALL_COLUMNS, _session_waits())
    .select_from(_target.join(_SIBLINGS, TOOL_CALLS.c.step_id == _target.c.step_id))
    .where(_target.c.id == bindparam("call_id"))
    .order_by(TOOL_CALLS.c.position)
)
_OPEN_TURN = (
    select(TURNS.c.id)
    .where(TURNS.c.session_id == bindparam("session_id"), TURNS.c.status == "running")
    .order_by(TURNS.c.created_at.desc())
    .limit(1)
)
_TURN_STARTER = select(TURNS.c.started_by).where(TURNS.c.id == bindparam("turn_id"))
_PENDING_TOOLS = (
    select(TOOL_CALLS.c.tool, APPROVAL_REQUESTS.c.escalated_at)
    .select_from(APPROVAL_REQUESTS.join(TOOL_CALLS, TOOL_CALLS.c.id == APPROVAL_REQUESTS.c.call_id))
    .where(APPROVAL_REQUESTS.c.session_id == bindparam("session_id"), APPROVAL_REQUESTS.c.status == "pending")
)
_LATEST_STEP = (
    select(STEPS.c.id, STEPS.c.session_id, STEPS.c.turn_id, STEPS.c.status)
    .where(STEPS.c.turn_id == bindparam("turn_id"))
    .order_by(STEPS.c.created_at.desc(), STEPS.c.id.desc())
    .limit(1)
)
_CALLS_OF_STEP = (
    select(*_CALL_COLUMNS)
    .select_from(_SIBLINGS)
    .where(TOOL_CALLS.c.step_id == bindparam("step_id"))
    .order_by(TOOL_CALLS.c.position)
)
# An approval request, its call and the other calls of its step; whether the session
# waits on a request other than this one (which this response decides); who started
# the session and the call's turn; the approvals counted so far, and whether the
# responder gave one of them.
_request = APPROVAL_REQUESTS.alias("request")
_turn = TURNS.alias("turn")
_session = SESSIONS.alias("session")
_approvals = APPROVALS.alias("counted")
_REQUEST_AND_CALLS = (
    select(
        _request.c.id.label("request_id"),
        _request.c.session_id.label("request_session_id"),
        _request.c.status.label("request_status"),
        _request.c.args_digest.label("request_args_digest"),
        _request.c.call_id.label("request_call_id"),
        _target.c.tool.label("request_tool"),
        _request.c.response_token_hash,
        _request.c.token_used_at,
        _request.c.expires_at.label("request_expires_at"),
        _request.c.escalated_at.label("request_escalated_at"),
        _request.c.card.label("request_card"),
        _request.c.created_at.label("request_created_at"),
        _turn.c.started_by.label("turn_started_by"),
        _session.c.started_by.label("session_started_by"),
        select(func.count()).where(_approvals.c.request_id == _request.c.id).scalar_subquery().label("approvals"),
        select(_approvals.c.responder)
        .where(_approvals.c.request_id == _request.c.id, _approvals.c.responder == bindparam("responder"))
        .exists()
        .label("approved_by_responder"),
        *_CALL_COLUMNS,
        _session_waits(besides=_request.c.id),
    )
    .select_from(
        _request.join(_target, _target.c.id == _request.c.call_id)
        .join(_SIBLINGS, TOOL_CALLS.c.step_id == _target.c.step_id)
        .join(_turn, _turn.c.id == STEPS.c.turn_id)
        .join(_session, _session.c.id == _request.c.session_id)
    )
    .where(_request.c.id == bindparam("request_id"))
    .order_by(TOOL_CALLS.c.position)
)


@dataclass(frozen=True)
class StepRead:
    step: Step | None
    # Whether the session has a pending request (before this transition).
    session_waits: bool


@dataclass(frozen=True)
class StepCalls:
    """A step's calls in the model's order, one of them the transition's own."""

    calls: list[Call]
    # Whether the session waits on a request other than the one this transition decides.
    session_waits: bool

    def find(self, call_id: str) -> Call | None:
        return next((c for c in self.calls if c.id == call_id), None)


async def step(uow: UnitOfWork, step_id: str, session_id: str) -> StepRead:
    found = await uow.read(_STEP, {"step_id": step_id, "session_id": session_id})
    if not found:
        return StepRead(None, False)
    row = found[0]
    return StepRead(Step(row.id, row.session_id, row.turn_id, row.status), bool(row.waiting))


async def call_and_siblings(uow: UnitOfWork, call_id: str, session_id: str) -> StepCalls:
    rows = await uow.read(_CALL_AND_SIBLINGS, {"call_id": call_id, "session_id": session_id})
    return StepCalls([_call(row) for row in rows], bool(rows and rows[0].waiting))


async def request_and_calls(
    uow: UnitOfWork, request_id: str, session_id: str, responder: str
) -> tuple[RequestOnRecord | None, StepCalls]:
    """The request as `responder` answers it (whether they approved it already)."""
    parameters = {"request_id": request_id, "session_id": session_id, "responder": responder}
    rows = await uow.read(_REQUEST_AND_CALLS, parameters)
    if not rows:
        return None, StepCalls([], False)
    first = rows[0]
    request = RequestOnRecord(
        first.request_id,
        first.request_session_id,
        first.request_status,
        first.request_args_digest,
        first.request_call_id,
        tool=first.request_tool,
        token_hash=first.response_token_hash,
        token_used=first.token_used_at is not None,
        starters=starters_of(first.session_started_by, first.turn_started_by),
        approvals=first.approvals,
        approved_by_responder=bool(first.approved_by_responder),
        expires_at=first.request_expires_at,
        escalated=first.request_escalated_at is not None,
        card=first.request_card,
        created_at=first.request_created_at,
    )
    return request, StepCalls([_call(row) for row in rows], bool(first.waiting))


async def due_requests(uow: UnitOfWork, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
    """(request id, session id) of pending requests whose deadline passed, oldest first
    (an index range scan: nearly free while nothing is due)."""
    return [(r.id, r.session_id) for r in await uow.db.execute(_DUE, {"at": at, "limit": limit})]


async def open_turn(uow: UnitOfWork, session_id: str) -> tuple[str | None, Step | None, list[Call]]:
    """The session's open turn, its latest step, and that step's calls in the model's order."""
    turn_id = await uow.db.scalar(_OPEN_TURN, {"session_id": session_id})
    if turn_id is None:
        return None, None, []
    row = (await uow.db.execute(_LATEST_STEP, {"turn_id": turn_id})).first()
    if row is None:
        return turn_id, None, []
    step = Step(row.id, row.session_id, row.turn_id, row.status)
    rows = await uow.db.execute(_CALLS_OF_STEP, {"step_id": step.id})
    return turn_id, step, [_call(r) for r in rows]


async def turn_starter(uow: UnitOfWork, turn_id: str) -> str | None:
    """Who the turn's channel said started it (None: nobody named)."""
    found = await uow.read(_TURN_STARTER, {"turn_id": turn_id})
    return found[0].started_by if found else None


async def pending_tools(uow: UnitOfWork, session_id: str) -> list[tuple[str, bool]]:
    """(tool, whether escalated) of each request the session waits on: who may approve them."""
    rows = await uow.read(_PENDING_TOOLS, {"session_id": session_id})
    return [(row.tool, row.escalated_at is not None) for row in rows]


async def due_escalations(uow: UnitOfWork, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
    """(request id, session id) of pending requests to announce again to their escalation group."""
    return [(r.id, r.session_id) for r in await uow.db.execute(_DUE_ESCALATIONS, {"at": at, "limit": limit})]


async def response_used(uow: UnitOfWork, response_id: str) -> bool:
    """Whether a decision, or an approval counted towards one, was made with this signed response."""
    return bool(await uow.read(_RESPONSE_USED, {"response_id": response_id}))


async def pending_request_ids(uow: UnitOfWork, session_id: str) -> list[str]:
    """The session's pending requests as stored before this transition, oldest first."""
    return [row.id for row in await uow.read(_PENDING, {"session_id": session_id})]


_ATTEMPTS = TABLES["provider_attempts"]
_OF_TURN = (STEPS.c.session_id == bindparam("session_id"), STEPS.c.turn_id == bindparam("turn_id"))
_TURN_SPEND = select(
    select(func.count()).select_from(STEPS).where(*_OF_TURN).scalar_subquery().label("steps"),
    select(func.count())
    .select_from(_ATTEMPTS.join(STEPS, STEPS.c.id == _ATTEMPTS.c.step_id))
    .where(*_OF_TURN)
    .scalar_subquery()
    .label("calls"),
    select(func.coalesce(func.sum(_ATTEMPTS.c.input_tokens + _ATTEMPTS.c.output_tokens), 0))
    .select_from(_ATTEMPTS.join(STEPS, STEPS.c.id == _ATTEMPTS.c.step_id))
    .where(*_OF_TURN)
    .scalar_subquery()
    .label("tokens"),
)


async def turn_spend(uow: UnitOfWork, session_id: str, turn_id: str) -> TurnSpend:
    """The turn's model steps, provider calls and tokens as stored before this transition."""
    row = (await uow.read(_TURN_SPEND, {"session_id": session_id, "turn_id": turn_id}))[0]
    return TurnSpend(int(row.steps), int(row.calls), int(row.tokens))


_CLAIM = select(
    CLAIMS.c.status,
    CLAIMS.c.outcome,
    CLAIMS.c.holder,
    CLAIMS.c.attempts,
    CLAIMS.c.claimed_at,
    CLAIMS.c.result,
    CLAIMS.c.authorization,
).where(CLAIMS.c.call_id == bindparam("call_id"))


async def claim(uow: UnitOfWork, call_id: str) -> ClaimOnRecord | None:
    """The executor's claim on a call as it stands: its recorded result (a call's result
    is read from here, never from the report) and the authorization it was taken under."""
    found = await uow.read(_CLAIM, {"call_id": call_id})
    if not found:
        return None
    row = found[0]
    return ClaimOnRecord(
        row.status, row.outcome, row.result, row.holder, row.attempts, row.claimed_at, row.authorization
    )


async def transcript_rows(uow: UnitOfWork, session: SessionState) -> list[dict]:
    """The whole transcript as stored (JSON-mode dumps): the rows, then the entries appended now."""
    rows = []
    if session.transcript_base:
        stored = await uow.read(_TRANSCRIPT, {"session_id": session.id, "upto": session.transcript_base})
        rows = [row.entry for row in stored]
    return rows + [entry.model_dump(mode="json") for entry in session.appended]


def _call(row: Row) -> Call:
    closure = None
    if row.kind is not None:
        closure = ClosureOnRecord(row.kind, (row.output or {}).get("value"), row.reason_code, row.reason_text)
    return Call(
        id=row.id,
        session_id=row.session_id,
        step_id=row.step_id,
        turn_id=row.turn_id,
        provider_call_id=row.provider_call_id,
        tool=row.tool,
        arguments=row.arguments,
        idempotency_key=row.idempotency_key,
        status=row.status,
        closure=closure,
        note=Note(row.responder, row.message) if row.message else None,
    )
