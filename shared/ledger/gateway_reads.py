"""What the HTTP gateway reads of the ledger's committed record (services/gateway/reads.py,
its API; services/gateway/inbox.py, its pages), through a connection that may only
read: PostgreSQL, the gateway's own role `<ns>_gateway`, granted SELECT alone
(shared/provisioning.py), each transaction read-only too; SQLite, the ledger's file
opened read-only. Nothing here writes; nothing is kept between requests. Who may see
what, and how a card or a session is shown, are the gateway's (services/gateway/reads.py):
these are the rows it shows, and the WHERE clause of who may see a page of requests.
The event stream's reads and the verdicts are shared/ledger/event_stream.py's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, or_, select, text, union
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from shared.catalogue import ToolCatalogue
from shared.ledger import event_stream, pages
from shared.ledger.database import never_hand_out_a_closed_connection
from shared.ledger.tables import (
    Approval,
    ApprovalRequest,
    AuditEntry,
    Closure,
    FiledCall,
    Grant,
    ProviderAttemptRow,
    Session,
    ToolCall,
    TranscriptRow,
    Turn,
)
from shared.settings import Settings


def read_only_engine(settings: Settings) -> AsyncEngine:
    """PostgreSQL: the gateway's own role (SELECT only), each transaction read-only too.
    SQLite: the ledger's file opened read-only (mode=ro): this process cannot write it."""
    if settings.is_postgres:
        server_settings = {"default_transaction_read_only": "on"}
        if settings.database_schema:
            server_settings["search_path"] = settings.database_schema
        return never_hand_out_a_closed_connection(
            create_async_engine(
                settings.database_login("gateway"),
                pool_size=5,
                max_overflow=0,
                # Each read is one statement in a transaction of its own (still read-only, by the
                # setting above): no BEGIN and ROLLBACK round trips around it (make bench, the
                # gateway level). The stream's horizon and its rows are one statement, one snapshot.
                isolation_level="AUTOCOMMIT",
                connect_args={"server_settings": server_settings},
            )
        )
    path = (settings.data_dir / "ledger.db").resolve()
    if settings.database_url:
        path = Path(settings.ledger_url.split("///", 1)[1])
    engine = create_async_engine(
        f"sqlite+aiosqlite:///file:{path}?mode=ro&uri=true", pool_size=2, max_overflow=0, connect_args={"timeout": 30}
    )

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_connection, _record) -> None:  # pragma: no cover - trivial
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA query_only=ON")
        cursor.close()

    return engine


@dataclass(frozen=True)
class SessionRecord:
    """A session's rows as its page shows them: the session, its transcript in order, its
    pending requests (oldest first), and what its provider attempts used."""

    session: Session
    transcript: list[dict[str, Any]]
    pending: list[ApprovalRequest]
    input_tokens: int
    output_tokens: int
    provider_attempts: int
    # Its newest turn, running or ended (how it ended and why: the turn's row).
    last_turn: Turn | None = None


@dataclass(frozen=True)
class FiledRecord:
    filed: FiledCall
    call: ToolCall
    request: ApprovalRequest | None
    closure: Closure | None


class GatewayReads:
    """The gateway's reads, on its read-only engine (`read_only_engine`)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def opened(cls, settings: Settings) -> GatewayReads:
        return cls(read_only_engine(settings))

    async def close(self) -> None:
        await self.engine.dispose()

    async def reachable(self) -> bool:
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return True

    # --- who started what ----------------------------------------------------------

    async def starters(self, session_id: str) -> set[str]:
        """Who started the session or any of its turns."""
        async with self.sessions() as db:
            first = await db.scalar(select(Session.started_by).where(Session.id == session_id))
            turns = await db.scalars(select(Turn.started_by).where(Turn.session_id == session_id))
            return {s for s in (first, *turns) if s}

    # --- requests ----------------------------------------------------------------------

    async def request(self, request_id: str) -> ApprovalRequest | None:
        async with self.sessions() as db:
            return await db.get(ApprovalRequest, request_id)

    async def requests_page(
        self,
        catalogue: ToolCatalogue,
        viewer: str | None,
        status: str | None,
        tool: str | None,
        session_id: str | None,
        limit: int,
        after: str | None = None,
    ) -> list[ApprovalRequest]:
        """Up to `limit` + 1 requests in (created_at, id) order (the one past `limit` says a
        next page exists). `viewer`: None, every request (an operator); else only those
        they may approve (`pages.may_approve_condition`) and those of sessions they
        started. `after`: a cursor given with an earlier page (`pages.BadCursor` if it is
        not one)."""
        conditions = []
        if status:
            conditions.append(ApprovalRequest.status == status)
        if session_id:
            conditions.append(ApprovalRequest.session_id == session_id)
        if tool:
            conditions.append(ApprovalRequest.tool == tool)
        if after:
            conditions.append(pages.after(after))
        if viewer is not None:
            started = union(
                select(Session.id).where(Session.started_by == viewer),
                select(Turn.session_id).where(Turn.started_by == viewer),
            )
            conditions.append(
                or_(pages.may_approve_condition(catalogue, viewer), ApprovalRequest.session_id.in_(started))
            )
        query = (
            select(ApprovalRequest)
            .where(*conditions)
            .order_by(ApprovalRequest.created_at, ApprovalRequest.id)
            .limit(limit + 1)
        )
        async with self.sessions() as db:
            return list(await db.scalars(query))

    async def approvals(self, request_id: str) -> int:
        """How many approvals the request has."""
        async with self.sessions() as db:
            approvals = await db.scalar(
                select(func.count()).select_from(Approval).where(Approval.request_id == request_id)
            )
        return int(approvals or 0)

    async def approved_by(self, responder: str, request_ids: list[str]) -> set[str]:
        """Which of these requests `responder` has approved already (a card that needs several)."""
        if not request_ids:
            return set()
        async with self.sessions() as db:
            found = await db.scalars(
                select(Approval.request_id).where(Approval.request_id.in_(request_ids), Approval.responder == responder)
            )
            return set(found)

    # --- grants (approve and remember) ---------------------------------------------

    async def grants(self, session_id: str | None = None, limit: int = 500) -> list[Grant]:
        """A session's grants (or every session's), oldest first, live or not."""
        query = select(Grant).order_by(Grant.granted_at, Grant.id).limit(limit)
        if session_id is not None:
            query = query.where(Grant.session_id == session_id)
        async with self.sessions() as db:
            return list(await db.scalars(query))

    async def grant(self, grant_id: str) -> Grant | None:
        async with self.sessions() as db:
            return await db.get(Grant, grant_id)

    # --- sessions ---------------------------------------------------------------

    async def session(self, session_id: str) -> SessionRecord | None:
        async with self.sessions() as db:
            # The session's row and its newest turn in one statement, so one snapshot: read
            # apart, a turn that ended between them shows as failed in a session still running.
            newest = _latest_turn(session_id).with_only_columns(Turn.id).scalar_subquery()
            found = (
                await db.execute(
                    select(Session, Turn).outerjoin(Turn, Turn.id == newest).where(Session.id == session_id)
                )
            ).one_or_none()
            if found is None:
                return None
            session, last_turn = found
            rows = await db.scalars(
                select(TranscriptRow).where(TranscriptRow.session_id == session_id).order_by(TranscriptRow.position)
            )
            transcript = [row.entry for row in rows]
            pending = list(
                await db.scalars(
                    select(ApprovalRequest)
                    .where(ApprovalRequest.session_id == session_id, ApprovalRequest.status == "pending")
                    .order_by(ApprovalRequest.created_at)
                )
            )
            usage = (
                await db.execute(
                    select(
                        func.coalesce(func.sum(ProviderAttemptRow.input_tokens), 0),
                        func.coalesce(func.sum(ProviderAttemptRow.output_tokens), 0),
                        func.count(),
                    ).where(ProviderAttemptRow.session_id == session_id)
                )
            ).one()
        return SessionRecord(session, transcript, pending, int(usage[0]), int(usage[1]), usage[2], last_turn)

    async def audit_entries(self, session_id: str) -> tuple[list[AuditEntry], dict[str, Turn]]:
        """The session's audit log in its order, and its turns by id (a turn's end reads
        its reason's text from the turn's row)."""
        async with self.sessions() as db:
            entries = list(
                await db.scalars(
                    select(AuditEntry)
                    .where(AuditEntry.session_id == session_id)
                    .order_by(AuditEntry.session_seq, AuditEntry.id)
                )
            )
            turns = {t.id: t for t in await db.scalars(select(Turn).where(Turn.session_id == session_id))}
        return entries, turns

    async def latest_turn(self, session_id: str) -> Turn | None:
        """The session's newest turn, running or ended."""
        async with self.sessions() as db:
            return await db.scalar(_latest_turn(session_id))

    # --- filed calls (the intake) -----------------------------------------------------

    async def filed_call(self, call_id: str) -> FiledRecord | None:
        """A filed call with its call's row, its request and its closure, as one commit
        left them (one statement: one snapshot, whatever commits meanwhile)."""
        return await self._filed(FiledCall.id == call_id)

    async def filed_call_by_caller(self, program: str, caller_call_id: str) -> FiledRecord | None:
        return await self._filed(FiledCall.program == program, FiledCall.caller_call_id == caller_call_id)

    async def _filed(self, *where: Any) -> FiledRecord | None:
        query = (
            select(FiledCall, ToolCall, ApprovalRequest, Closure)
            .join(ToolCall, ToolCall.id == FiledCall.id)
            .outerjoin(ApprovalRequest, ApprovalRequest.id == FiledCall.request_id)
            .outerjoin(Closure, Closure.call_id == FiledCall.id)
            .where(*where)
        )
        async with self.sessions() as db:
            found = (await db.execute(query)).first()
        return None if found is None else FiledRecord(*found)

    # --- the event stream and verdicts (shared/ledger/event_stream.py) ---------------

    async def verdict(self, session_id: str, message_id: str) -> AuditEntry | None:
        return await event_stream.verdict(self.sessions, session_id, message_id)

    async def verdicts(self, waiting: Sequence[tuple[str, str]]) -> Sequence[AuditEntry]:
        return await event_stream.verdicts(self.sessions, waiting)

    async def newest_event(self) -> event_stream.Cursor:
        return await event_stream.newest_event(self.engine)

    async def events_after(self, cursor: event_stream.Cursor, limit: int = 200) -> Sequence[Any]:
        return await event_stream.events_after(self.engine, cursor, limit)

    def commit_feed(
        self, channel: str, notified: Callable[..., None]
    ) -> AbstractAsyncContextManager[event_stream.CommitFeed]:
        """The watcher's LISTEN connection (PostgreSQL), `event_stream.CommitFeed`."""
        return event_stream.CommitFeed.listening(self.engine, channel, notified)


def _latest_turn(session_id: str):
    return select(Turn).where(Turn.session_id == session_id).order_by(Turn.created_at.desc(), Turn.id.desc()).limit(1)
