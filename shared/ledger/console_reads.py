"""What the operator's console reads of the ledger (services/operations/, the `signoff`
command): the request a person approves or denies, a session's story (`session show`),
the pending cards a page at a time (`signoff pending`), the grants (`signoff grants`),
the turn or grant a cancel or revocation names and the audit entry that answers it,
a closure for `make run`, the cards a channel adapter catches up on when it starts (their
approvers so far and decision), and the audit log with its global chain (`signoff audit`).

Everything here is read as the console's role (PostgreSQL: `<ns>_console`, which may
SELECT and record dead-letter actions, shared/ledger/dead_letter_actions.py); the
console keeps how each is printed and what its arguments mean."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import func, select

from shared.catalogue import ToolCatalogue
from shared.ledger.database import create_engine, sessionmaker
from shared.ledger.pages import may_approve_condition
from shared.ledger.tables import (
    TABLES,
    Approval,
    ApprovalRequest,
    AuditEntry,
    Closure,
    Decision,
    Grant,
    ProviderAttemptRow,
    Session,
    TranscriptRow,
    Turn,
)
from shared.settings import Settings

AUDIT, AUDIT_CHAIN, AUDIT_HEAD = TABLES["audit_log"], TABLES["audit_chain"], TABLES["audit_head"]
Row = TypeVar("Row", ApprovalRequest, Turn, Grant, Closure, Decision)


@dataclass
class SessionOnRecord:
    """A session as `signoff session show` tells it, read in one ORM session."""

    session: Session
    last_turn: Turn | None
    transcript: list[TranscriptRow]
    pending: list[ApprovalRequest]
    # Requests no longer waiting that were escalated, oldest first: who was asked, and when.
    escalated_before: list[ApprovalRequest]
    attempts: list[ProviderAttemptRow]


class ConsoleLedger:
    """The ledger as the console's role reads it; `async with` disposes of its connections.
    `sessions` (the ORM's) is for the dead-letter actions it records and the tests' own checks."""

    def __init__(self, settings: Settings, pool_size: int = 2) -> None:
        self.settings = settings
        self.engine = create_engine(settings, identity="console", pool_size=pool_size)
        self.sessions = sessionmaker(self.engine)

    async def __aenter__(self) -> ConsoleLedger:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.engine.dispose()

    async def request(self, request_id: str) -> ApprovalRequest | None:
        return await self._row(ApprovalRequest, request_id)

    async def turn(self, turn_id: str) -> Turn | None:
        return await self._row(Turn, turn_id)

    async def grant(self, grant_id: str) -> Grant | None:
        return await self._row(Grant, grant_id)

    async def closure(self, call_id: str) -> Closure | None:
        return await self._row(Closure, call_id)

    async def decision(self, request_id: str) -> Decision | None:
        return await self._row(Decision, request_id)

    async def approvers(self, request_ids: list[str]) -> dict[str, list[str]]:
        """Who has approved each of these requests so far (a card that needs several), in order."""
        if not request_ids:
            return {}
        async with self.sessions() as db:
            found = await db.scalars(
                select(Approval).where(Approval.request_id.in_(request_ids)).order_by(Approval.approved_at)
            )
            approvers: dict[str, list[str]] = {}
            for approval in found:
                approvers.setdefault(approval.request_id, []).append(approval.responder)
            return approvers

    async def _row(self, kind: type[Row], key: str) -> Row | None:
        async with self.sessions() as db:
            return await db.get(kind, key)

    async def audit_entry_of(self, session_id: str, message_id: str) -> AuditEntry | None:
        """The audit entry the ledger wrote for this very command (its verdict), if any yet."""
        async with self.sessions() as db:
            return await db.scalar(
                select(AuditEntry).where(AuditEntry.session_id == session_id, AuditEntry.message_id == message_id)
            )

    async def session_on_record(self, session_id: str) -> SessionOnRecord | None:
        async with self.sessions() as db:
            session = await db.get(Session, session_id)
            if session is None:
                return None
            last = await db.scalar(
                select(Turn).where(Turn.session_id == session_id).order_by(Turn.created_at.desc()).limit(1)
            )
            transcript = await db.scalars(
                select(TranscriptRow).where(TranscriptRow.session_id == session_id).order_by(TranscriptRow.position)
            )
            pending = await db.scalars(
                select(ApprovalRequest).where(
                    ApprovalRequest.session_id == session_id, ApprovalRequest.status == "pending"
                )
            )
            escalated = await db.scalars(
                select(ApprovalRequest)
                .where(
                    ApprovalRequest.session_id == session_id,
                    ApprovalRequest.status != "pending",
                    ApprovalRequest.escalated_at.is_not(None),
                )
                .order_by(ApprovalRequest.created_at)
            )
            attempts = await db.scalars(select(ProviderAttemptRow).where(ProviderAttemptRow.session_id == session_id))
            return SessionOnRecord(session, last, list(transcript), list(pending), list(escalated), list(attempts))

    async def pending(
        self,
        *,
        session_id: str | None = None,
        tool: str | None = None,
        approver: tuple[ToolCatalogue, str] | None = None,
        skip: int = 0,
        limit: int | None = None,
    ) -> tuple[int, list[ApprovalRequest]]:
        """How many requests wait (of a session, a tool, those `approver` may approve), and a
        page of them, the first to expire first: read along `ix_approval_requests_due`
        (status, expires_at), so a page costs its cards and the count, not a card per request."""
        conditions = [ApprovalRequest.status == "pending"]
        if session_id:
            conditions.append(ApprovalRequest.session_id == session_id)
        if tool:
            conditions.append(ApprovalRequest.tool == tool)
        if approver is not None:
            conditions.append(may_approve_condition(*approver))
        async with self.sessions() as db:
            total = await db.scalar(select(func.count()).select_from(ApprovalRequest).where(*conditions)) or 0
            query = (
                select(ApprovalRequest)
                .where(*conditions)
                .order_by(ApprovalRequest.expires_at.nulls_last(), ApprovalRequest.created_at, ApprovalRequest.id)
            )
            if limit is not None:
                query = query.offset(skip).limit(limit)
            return total, list((await db.scalars(query)).all())

    async def grants(self, session_id: str | None) -> list[Grant]:
        """Every remembered approval (of one session, or all), in the order given."""
        async with self.sessions() as db:
            query = select(Grant).order_by(Grant.granted_at, Grant.id)
            if session_id:
                query = query.where(Grant.session_id == session_id)
            return list((await db.scalars(query)).all())

    async def turns(self, session_id: str) -> list[Turn]:
        """A session's turns, oldest first."""
        async with self.sessions() as db:
            query = select(Turn).where(Turn.session_id == session_id).order_by(Turn.created_at, Turn.id)
            return list((await db.scalars(query)).all())

    async def audit(
        self, session_id: str | None = None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None]:
        """The audit entries (of one session, or all) in id order, the global chain's links
        up to its head, and the head. Read head first, then links up to it, then entries:
        each read is consistent with the ones before without a snapshot, because links
        and entries are only ever added."""
        async with self.engine.connect() as db:
            found = (await db.execute(select(AUDIT_HEAD).where(AUDIT_HEAD.c.id == 1))).first()
            head = dict(found._mapping) if found else None
            links = select(AUDIT_CHAIN).where(AUDIT_CHAIN.c.seq <= (head["seq"] if head else 0))
            entries = select(AUDIT).order_by(AUDIT.c.id)
            if session_id is not None:
                entries = entries.where(AUDIT.c.session_id == session_id)
                links = links.where(
                    AUDIT_CHAIN.c.entry_id.in_(select(AUDIT.c.id).where(AUDIT.c.session_id == session_id))
                )
            chain = [dict(r._mapping) for r in await db.execute(links.order_by(AUDIT_CHAIN.c.seq))]
            rows = [dict(r._mapping) for r in await db.execute(entries)]
        return rows, chain, head


async def read_audit(
    settings: Settings, session_id: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None]:
    """`ConsoleLedger.audit` on a ledger of its own (the tests' invariants read it so)."""
    async with ConsoleLedger(settings) as ledger:
        return await ledger.audit(session_id)


def chained_by_txid(settings: Settings) -> bool:
    """Whether the global audit chain orders entries by their writing transaction's id
    (PostgreSQL) or by their own id (SQLite, one writer at a time): how `audit.verify`
    checks its order (shared/ledger/audit_chain.py)."""
    return settings.is_postgres
