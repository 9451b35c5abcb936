"""The ledger's store on a database through SQLAlchemy Core: the SQLite adapter of the
port (`store.py`), and the queries the PostgreSQL adapter (`store_postgres.py`) runs too.

Each read is one query built once, run on the transaction's connection after the
session row is locked. The writes a transition collected are applied in one
greenlet (`run_sync`): the tool menus it stores (insert if absent), one INSERT per
table with all its rows, parents first, then one UPDATE per changed row, then the
outbox rows in emission order, then the audit entries. SQLite has one writer: its
transactions never interleave, so no lock order matters and the first write (the
inbox row) holds the database.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, or_, select, text, union_all
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared.ledger.database import insert_unless_present
from shared.ledger.tables import TABLES
from shared.ledger.tool_menus import MENU_BY_DIGEST
from shared.messages import Envelope
from shared.topology import Topology

from .decision_rules import Grant
from .domain import (
    Call,
    ClaimOnRecord,
    ClosureOnRecord,
    KeyedTurn,
    Note,
    RequestOnRecord,
    Step,
    TurnSpend,
    starters_of,
)
from .intake_rules import FiledOnRecord
from .store import (
    INSERT_ORDER,
    NO_OPEN_TURN,
    Duplicate,
    LedgerStore,
    OpenTurn,
    SessionState,
    StepCalls,
    StepRead,
    Writes,
    grant_of,
)

SESSIONS = TABLES["sessions"]
INBOX = TABLES["inbox"]
OUTBOX = TABLES["outbox"]
AUDIT = TABLES["audit_log"]
STEPS = TABLES["steps"]
TRANSCRIPT = TABLES["transcript"]
TOOL_CALLS = TABLES["tool_calls"]
APPROVAL_REQUESTS = TABLES["approval_requests"]
DECISIONS = TABLES["decisions"]
APPROVALS = TABLES["approvals"]
CLOSURES = TABLES["closures"]
TURNS = TABLES["turns"]
CLAIMS = TABLES["execution_claims"]
GRANTS = TABLES["grants"]
FILED = TABLES["filed_calls"]
TOOL_MENUS = TABLES["tool_menus"]

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
# The step, and what its report's transition reads next: whether the session waits
# on a person, and whether it has grants at all (`grants` is then answered without
# a statement: most sessions have none).
_STEP = select(
    STEPS.c.id,
    STEPS.c.session_id,
    STEPS.c.turn_id,
    STEPS.c.status,
    _session_waits(),
    select(GRANTS.c.id).where(GRANTS.c.session_id == bindparam("session_id")).exists().label("has_grants"),
).where(STEPS.c.id == bindparam("step_id"))
_PENDING = (
    select(APPROVAL_REQUESTS.c.id)
    .where(APPROVAL_REQUESTS.c.session_id == bindparam("session_id"), APPROVAL_REQUESTS.c.status == "pending")
    .order_by(APPROVAL_REQUESTS.c.created_at, APPROVAL_REQUESTS.c.id)
)
# The sweeps' reads, each the head of a partial index of pending rows (migration 0015,
# `ix_approval_requests_pending_expiry` / `_escalation`): their predicates repeat the
# indexes' so the planner may use them, and ORDER BY + LIMIT reads only what is due.
_DUE = (
    select(APPROVAL_REQUESTS.c.id, APPROVAL_REQUESTS.c.session_id)
    .where(
        APPROVAL_REQUESTS.c.status == "pending",
        APPROVAL_REQUESTS.c.expires_at.is_not(None),
        APPROVAL_REQUESTS.c.expires_at <= bindparam("at"),
    )
    .order_by(APPROVAL_REQUESTS.c.expires_at)
    .limit(bindparam("limit"))
)
_DUE_ESCALATIONS = (
    select(APPROVAL_REQUESTS.c.id, APPROVAL_REQUESTS.c.session_id)
    .where(
        APPROVAL_REQUESTS.c.status == "pending",
        APPROVAL_REQUESTS.c.escalate_at.is_not(None),
        APPROVAL_REQUESTS.c.escalate_at <= bindparam("at"),
        APPROVAL_REQUESTS.c.escalated_at.is_(None),
    )
    .order_by(APPROVAL_REQUESTS.c.escalate_at)
    .limit(bindparam("limit"))
)
# A response id counts once: as a decision, or as one approval of several.
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
# A tool call and the other calls of its step; and, carried for the rest of the
# transition (`tool.completed` reads both next), the call's claim as the executor left
# it and what the step's turn has spent so far: two round trips fewer per report.
_carried_claim = CLAIMS.alias("carried_claim")


def _spend(steps, attempts, of_turn, prefix: str = ""):
    """A turn's steps, provider calls and tokens so far, as three scalar subqueries over
    `steps` and `attempts` (the tables or their aliases) where `of_turn` holds."""
    attempted = attempts.join(steps, steps.c.id == attempts.c.step_id)
    tokens = func.coalesce(func.sum(attempts.c.input_tokens + attempts.c.output_tokens), 0)
    return (
        select(func.count()).select_from(steps).where(*of_turn).scalar_subquery().label(f"{prefix}steps"),
        select(func.count()).select_from(attempted).where(*of_turn).scalar_subquery().label(f"{prefix}calls"),
        select(tokens).select_from(attempted).where(*of_turn).scalar_subquery().label(f"{prefix}tokens"),
    )


_spent_step = STEPS.alias("spent_step")
_spent_attempt = TABLES["provider_attempts"].alias("spent_attempt")
_OF_CALLS_TURN = (_spent_step.c.session_id == bindparam("session_id"), _spent_step.c.turn_id == STEPS.c.turn_id)
_CALL_AND_SIBLINGS = (
    select(
        *_CALL_COLUMNS,
        _session_waits(),
        _carried_claim.c.status.label("claim_status"),
        _carried_claim.c.outcome.label("claim_outcome"),
        _carried_claim.c.holder.label("claim_holder"),
        _carried_claim.c.attempts.label("claim_attempts"),
        _carried_claim.c.claimed_at.label("claim_claimed_at"),
        _carried_claim.c.result.label("claim_result"),
        _carried_claim.c.authorization.label("claim_authorization"),
        *_spend(_spent_step, _spent_attempt, _OF_CALLS_TURN, "spent_"),
    )
    .select_from(
        _target.join(_SIBLINGS, TOOL_CALLS.c.step_id == _target.c.step_id).outerjoin(
            _carried_claim, _carried_claim.c.call_id == _target.c.id
        )
    )
    .where(_target.c.id == bindparam("call_id"))
    .order_by(TOOL_CALLS.c.position)
)
_OPEN_TURN = (
    select(TURNS.c.id)
    .where(TURNS.c.session_id == bindparam("session_id"), TURNS.c.status == "running")
    .order_by(TURNS.c.created_at.desc())
    .limit(1)
)
_GRANTS = (
    select(GRANTS).where(GRANTS.c.session_id == bindparam("session_id")).order_by(GRANTS.c.granted_at, GRANTS.c.id)
)
_GRANT = select(GRANTS).where(GRANTS.c.id == bindparam("grant_id"))
_TURN_STARTER = select(TURNS.c.started_by).where(TURNS.c.id == bindparam("turn_id"))
_TURN_OF_KEY = select(TURNS.c.id, TURNS.c.started_by, TURNS.c.text_digest).where(
    TURNS.c.session_id == bindparam("session_id"), TURNS.c.idempotency_key == bindparam("key")
)
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
        _request.c.approvals_required.label("request_approvals_required"),
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
# The same, and whether the response at hand was used before (`_RESPONSE_USED`), carried
# for the transition's next read: one round trip fewer per approval.
_REQUEST_AND_CALLS_AND_RESPONSE = _REQUEST_AND_CALLS.add_columns(
    or_(
        select(DECISIONS.c.request_id).where(DECISIONS.c.response_id == bindparam("response_id")).exists(),
        select(APPROVALS.c.request_id).where(APPROVALS.c.response_id == bindparam("response_id")).exists(),
    ).label("response_used")
)

_ATTEMPTS = TABLES["provider_attempts"]
_OF_TURN = (STEPS.c.session_id == bindparam("session_id"), STEPS.c.turn_id == bindparam("turn_id"))
_TURN_SPEND = select(*_spend(STEPS, _ATTEMPTS, _OF_TURN))


_CLAIM = select(
    CLAIMS.c.status,
    CLAIMS.c.outcome,
    CLAIMS.c.holder,
    CLAIMS.c.attempts,
    CLAIMS.c.claimed_at,
    CLAIMS.c.result,
    CLAIMS.c.authorization,
).where(CLAIMS.c.call_id == bindparam("call_id"))


_FILED_COLUMNS = (
    FILED.c.id,
    FILED.c.session_id,
    FILED.c.program,
    FILED.c.caller_call_id,
    FILED.c.origin,
    FILED.c.tool,
    FILED.c.args_fingerprint,
    FILED.c.runs,
    FILED.c.request_id,
    FILED.c.claim_token_hash,
    FILED.c.claimed_at,
    FILED.c.lease_expires_at,
    FILED.c.reported_at,
    FILED.c.claim_holder,
)
_FILED = select(*_FILED_COLUMNS).where(FILED.c.id == bindparam("call_id"))
_FILED_BY_CALLER = select(*_FILED_COLUMNS).where(
    FILED.c.program == bindparam("program"), FILED.c.caller_call_id == bindparam("caller_call_id")
)
# Claims whose lease ended with no result (`ix_filed_calls_lease`, unreported rows only).
_DUE_LEASES = (
    select(FILED.c.id, FILED.c.session_id)
    .join(TOOL_CALLS, TOOL_CALLS.c.id == FILED.c.id)
    .where(
        FILED.c.reported_at.is_(None),
        FILED.c.lease_expires_at.is_not(None),
        FILED.c.lease_expires_at <= bindparam("at"),
        TOOL_CALLS.c.status != "closed",
    )
    .order_by(FILED.c.lease_expires_at)
    .limit(bindparam("limit"))
)


def filed_of(row: Any) -> FiledOnRecord:
    """A `filed_calls` row (anything with its columns as attributes) as the rules read it."""
    return FiledOnRecord(
        row.id,
        row.session_id,
        row.program,
        row.caller_call_id,
        row.origin,
        row.tool,
        row.args_fingerprint,
        row.runs,
        row.request_id,
        row.claim_token_hash,
        row.claimed_at,
        row.lease_expires_at,
        row.reported_at,
        row.claim_holder,
    )


_LOCK_SESSION = select(SESSIONS).where(SESSIONS.c.id == bindparam("session_id")).with_for_update()
_INSERT_SESSION = insert_unless_present(SESSIONS, "id", "sqlite")
# A duplicate message inserts nothing (rowcount 0): the database decides, in this transaction (invariant 8).
_INBOX_INSERT = insert_unless_present(INBOX, "message_id", "sqlite")
_INSERT = {name: TABLES[name].insert() for name in ("outbox", "audit_log", *INSERT_ORDER)}
# A menu another transaction (or ledger) stored meanwhile stays as it is: same digest, same menu.
_INSERT_MENU = insert_unless_present(TOOL_MENUS, "digest", "sqlite")
# The SET clause is the parameters' column names; every updated table has an `id` key.
_UPDATE_BY_ID = {
    name: TABLES[name].update().where(TABLES[name].c.id == bindparam("id_"))
    for name in ("sessions", *INSERT_ORDER)
    if "id" in TABLES[name].c
}
_WITHDRAW = (
    APPROVAL_REQUESTS.update()
    .where(APPROVAL_REQUESTS.c.call_id == bindparam("call_id_"), APPROVAL_REQUESTS.c.status == "pending")
    .values(status="cancelled")
)
# A restarted count: the request's approvals so far no longer count (returning rows,
# so that both the SQLAlchemy and the asyncpg paths read it as a query).
_RESTART_COUNT = (
    APPROVALS.delete().where(APPROVALS.c.request_id == bindparam("request_id_")).returning(APPROVALS.c.responder)
)
_CLAIM_LOCKED = _CLAIM.with_for_update()
_NOTIFY = text("SELECT pg_notify(:channel, '')")


class DatabaseStore(LedgerStore):
    def __init__(
        self, engine: AsyncEngine, topology: Topology, notify_channel: str | None, stored_menus: set[str] | None = None
    ) -> None:
        super().__init__(topology, notify_channel, stored_menus)
        self._engine = engine
        self.db: AsyncConnection

    async def _begin(self) -> None:
        self.db = await self._engine.connect()
        try:
            await self.db.begin()
        except BaseException:
            await self.db.close()
            raise

    async def _end(self) -> None:
        await self.db.rollback()
        await self.db.close()

    async def _commit(self) -> None:
        await self.db.commit()

    async def read(self, query: Any, parameters: dict[str, Any]) -> list[Any]:
        """The rows of a statement built once."""
        return list((await self.db.execute(query, parameters)).all())

    # -- receive and lock ------------------------------------------------------------

    async def receive_and_lock(
        self, message: Envelope, *, create_with_provider: str | None = None
    ) -> SessionState | None:
        # The inbox first: a duplicate must leave no session row behind (a group
        # commit does not roll back for it). SQLite has one writer: no lock order.
        inserted = await self.db.execute(_INBOX_INSERT, self._inbox_row(message))
        if inserted.rowcount == 0:
            raise Duplicate(message.message_id)
        if create_with_provider is not None:
            await self.db.execute(
                _INSERT_SESSION,
                {
                    "id": message.session_id,
                    "status": "idle",
                    "provider": create_with_provider,
                    "event_seq": 0,
                    "transcript_len": 0,
                    "status_reason": None,
                    "created_at": self.now,
                    "updated_at": self.now,
                },
            )
        return await self.lock_session(message.session_id)

    async def lock_session(self, session_id: str) -> SessionState | None:
        found = await self.read(_LOCK_SESSION, {"session_id": session_id})
        return self._locked(SessionState.of(found[0]) if found else None)

    # -- reads -----------------------------------------------------------------------

    async def step(self, step_id: str, session_id: str) -> StepRead:
        found = await self.read(_STEP, {"step_id": step_id, "session_id": session_id})
        if not found:
            return StepRead(None, False)
        row = found[0]
        if not row.has_grants:
            # Carried for `grants`: grants are written only under the session's lock, held now.
            self._carried[("grants", session_id)] = []
        return StepRead(Step(row.id, row.session_id, row.turn_id, row.status), bool(row.waiting))

    async def call_and_siblings(self, call_id: str, session_id: str) -> StepCalls:
        rows = await self.read(_CALL_AND_SIBLINGS, {"call_id": call_id, "session_id": session_id})
        if rows:
            # What this statement carried for the transition's next reads (`claim`, `turn_spend`).
            first = rows[0]
            self._carried[("claim", call_id)] = (
                None
                if first.claim_status is None
                else ClaimOnRecord(
                    first.claim_status,
                    first.claim_outcome,
                    first.claim_result,
                    first.claim_holder,
                    first.claim_attempts,
                    first.claim_claimed_at,
                    first.claim_authorization,
                )
            )
            self._carried[("turn_spend", session_id, first.turn_id)] = TurnSpend(
                int(first.spent_steps), int(first.spent_calls), int(first.spent_tokens)
            )
        return StepCalls([_call(row) for row in rows], bool(rows and rows[0].waiting))

    async def request_and_calls(
        self, request_id: str, session_id: str, responder: str, *, response_id: str | None = None
    ) -> tuple[RequestOnRecord | None, StepCalls]:
        parameters = {"request_id": request_id, "session_id": session_id, "responder": responder}
        if response_id is not None:
            parameters["response_id"] = response_id
        rows = await self.read(
            _REQUEST_AND_CALLS if response_id is None else _REQUEST_AND_CALLS_AND_RESPONSE, parameters
        )
        if not rows:
            return None, StepCalls([], False)
        first = rows[0]
        if response_id is not None:
            self._carried[("response_used", response_id)] = bool(first.response_used)
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
            approvals_required=first.request_approvals_required,
        )
        return request, StepCalls([_call(row) for row in rows], bool(first.waiting))

    async def due_requests(self, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
        # An index range scan: nearly free while nothing is due.
        return [(r.id, r.session_id) for r in await self.read(_DUE, {"at": at, "limit": limit})]

    async def due_escalations(self, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
        return [(r.id, r.session_id) for r in await self.read(_DUE_ESCALATIONS, {"at": at, "limit": limit})]

    async def open_turn(self, session_id: str) -> OpenTurn:
        found = await self.read(_OPEN_TURN, {"session_id": session_id})
        if not found:
            return NO_OPEN_TURN
        turn_id = found[0].id
        latest = await self.read(_LATEST_STEP, {"turn_id": turn_id})
        if not latest:
            return OpenTurn(turn_id, None, [])
        row = latest[0]
        step = Step(row.id, row.session_id, row.turn_id, row.status)
        rows = await self.read(_CALLS_OF_STEP, {"step_id": step.id})
        return OpenTurn(turn_id, step, [_call(r) for r in rows])

    async def turn_of_key(self, session_id: str, key: str) -> KeyedTurn | None:
        found = await self.read(_TURN_OF_KEY, {"session_id": session_id, "key": key})
        return KeyedTurn(found[0].id, found[0].started_by, found[0].text_digest) if found else None

    async def turn_starter(self, turn_id: str) -> str | None:
        found = await self.read(_TURN_STARTER, {"turn_id": turn_id})
        return found[0].started_by if found else None

    async def pending_tools(self, session_id: str) -> list[tuple[str, bool]]:
        rows = await self.read(_PENDING_TOOLS, {"session_id": session_id})
        return [(row.tool, row.escalated_at is not None) for row in rows]

    async def response_used(self, response_id: str) -> bool:
        carried = self._carried.pop(("response_used", response_id), None)
        if carried is not None:
            return carried
        return bool(await self.read(_RESPONSE_USED, {"response_id": response_id}))

    async def pending_request_ids(self, session_id: str) -> list[str]:
        return [row.id for row in await self.read(_PENDING, {"session_id": session_id})]

    async def turn_spend(self, session_id: str, turn_id: str) -> TurnSpend:
        carried = self._carried.pop(("turn_spend", session_id, turn_id), None)
        if carried is not None:
            return carried
        row = (await self.read(_TURN_SPEND, {"session_id": session_id, "turn_id": turn_id}))[0]
        return TurnSpend(int(row.steps), int(row.calls), int(row.tokens))

    async def grants(self, session_id: str) -> list[Grant]:
        if ("grants", session_id) in self._carried:
            return self._carried.pop(("grants", session_id))
        return [grant_of(row) for row in await self.read(_GRANTS, {"session_id": session_id})]

    async def grant(self, grant_id: str) -> Grant | None:
        found = await self.read(_GRANT, {"grant_id": grant_id})
        return grant_of(found[0]) if found else None

    async def claim(self, call_id: str, *, lock: bool = False) -> ClaimOnRecord | None:
        if not lock and ("claim", call_id) in self._carried:
            return self._carried.pop(("claim", call_id))
        found = await self.read(_CLAIM_LOCKED if lock else _CLAIM, {"call_id": call_id})
        if not found:
            return None
        row = found[0]
        return ClaimOnRecord(
            row.status, row.outcome, row.result, row.holder, row.attempts, row.claimed_at, row.authorization
        )

    async def filed_call(self, call_id: str) -> FiledOnRecord | None:
        found = await self.read(_FILED, {"call_id": call_id})
        return filed_of(found[0]) if found else None

    async def filed_call_by_caller(self, program: str, caller_call_id: str) -> FiledOnRecord | None:
        found = await self.read(_FILED_BY_CALLER, {"program": program, "caller_call_id": caller_call_id})
        return filed_of(found[0]) if found else None

    async def due_leases(self, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
        return [(r.id, r.session_id) for r in await self.read(_DUE_LEASES, {"at": at, "limit": limit})]

    async def transcript_entries(self, session_id: str, upto: int) -> list[dict]:
        return [row.entry for row in await self.read(_TRANSCRIPT, {"session_id": session_id, "upto": upto})]

    async def tool_menu(self, digest: str) -> list[dict] | None:
        found = await self.read(MENU_BY_DIGEST, {"digest": digest})
        return found[0].descriptions if found else None

    # -- writes ----------------------------------------------------------------------

    async def _apply(self, writes: Writes, notify: bool) -> None:
        await self.db.run_sync(self._write, writes, notify)

    def _write(self, db: Connection, writes: Writes, notify: bool) -> None:
        for request_id in writes.recounted:
            db.execute(_RESTART_COUNT, {"request_id_": request_id}).all()
        if writes.menus:
            db.execute(_INSERT_MENU, list(writes.menus.values()))
        for name in INSERT_ORDER:
            rows = writes.rows.get(name)
            if rows:
                db.execute(_INSERT[name], rows)
        for (name, key), values in writes.updates.items():
            db.execute(_UPDATE_BY_ID[name], {"id_": key, **values})
        for call_id in writes.withdrawn:
            db.execute(_WITHDRAW, {"call_id_": call_id})
        if writes.outbox:
            db.execute(_INSERT["outbox"], writes.outbox)
        if writes.audit:
            db.execute(_INSERT["audit_log"], writes.audit)
        if notify:
            # NOTIFY is delivered on commit only, so the publisher never wakes for a rollback.
            db.execute(_NOTIFY, {"channel": self._notify_channel})


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
