"""What the gateway reads: the ledger's committed record, through a role that may only
read (PostgreSQL: `<ns>_gateway`, granted SELECT alone; SQLite: the file opened
read-only). Nothing here writes; nothing is kept between requests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event, func, literal_column, or_, select, text, union
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from shared.catalogue import ToolCatalogue
from shared.ledger import pages
from shared.ledger.tables import (
    Approval,
    ApprovalRequest,
    AuditEntry,
    Grant,
    OutboxRow,
    ProviderAttemptRow,
    Session,
    TranscriptRow,
    Turn,
)
from shared.messages import EVENT_TYPES, now
from shared.redaction import redact_text, redact_value

from .settings import GatewaySettings
from .users import User

# The events a caller may be streamed (the outbox also holds commands: never those).
STREAMED = sorted(EVENT_TYPES)
# PostgreSQL: the committed events after a cursor ($1, $2) = (txid, id), in that order,
# only of transactions below the oldest still running (see `Ledger.events_after`).
EVENTS_AFTER_SQL = (
    "SELECT coalesce(txid, 0) AS txid, id, session_id, message_type, body FROM outbox"
    " WHERE message_type = any($3::text[]) AND (coalesce(txid, 0), id) > ($1::bigint, $2::bigint)"
    " AND coalesce(txid, 0) < pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
    " ORDER BY coalesce(txid, 0), id LIMIT $4"
)


def read_only_engine(settings: GatewaySettings) -> AsyncEngine:
    """PostgreSQL: the gateway's own role (SELECT only), each transaction read-only too.
    SQLite: the ledger's file opened read-only (mode=ro): this process cannot write it."""
    if settings.is_postgres:
        server_settings = {"default_transaction_read_only": "on"}
        if settings.database_schema:
            server_settings["search_path"] = settings.database_schema
        return create_async_engine(
            settings.database_login("gateway"),
            pool_size=5,
            max_overflow=0,
            # Each read is one statement in a transaction of its own (still read-only, by the
            # setting above): no BEGIN and ROLLBACK round trips around it (make bench, the
            # gateway level). The stream's horizon and its rows are one statement, one snapshot.
            isolation_level="AUTOCOMMIT",
            connect_args={"server_settings": server_settings},
        )
    path = (settings.data_dir / "ledger.db").resolve()
    if settings.database_url:
        path = type(path)(settings.ledger_url.split("///", 1)[1])
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
class Policy:
    # None: anyone a registered channel may assert.
    approvers: frozenset[str] | None
    approvals_required: int
    starter_may_approve: bool


def policy(catalogue: ToolCatalogue, tool: str, escalated: bool) -> Policy:
    """Who may approve a tool's calls, as the ledger judges it (the catalogue now, its
    groups resolved; an escalated request's escalation group too)."""
    spec = catalogue.get(tool)
    if spec is None:
        return Policy(frozenset(), 1, True)
    approvers = catalogue.approvers_of(spec)
    if escalated and spec.escalation is not None and approvers is not None:
        approvers = approvers | catalogue.principals(spec.escalation.to)
    return Policy(approvers, spec.approvals_required, spec.starter_may_approve)


def may_approve(catalogue: ToolCatalogue, user: User, tool: str, escalated: bool) -> bool:
    approvers = policy(catalogue, tool, escalated).approvers
    return approvers is None or user.name in approvers


class Ledger:
    def __init__(self, engine: AsyncEngine, catalogue: ToolCatalogue, postgres: bool) -> None:
        self.engine = engine
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)
        self.catalogue = catalogue
        self.postgres = postgres

    async def reachable(self) -> bool:
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return True

    # --- who may see what -------------------------------------------------------

    async def starters(self, session_id: str) -> set[str]:
        """Who started the session or any of its turns."""
        async with self.sessions() as db:
            first = await db.scalar(select(Session.started_by).where(Session.id == session_id))
            turns = await db.scalars(select(Turn.started_by).where(Turn.session_id == session_id))
            return {s for s in (first, *turns) if s}

    async def may_see_session(self, user: User, session_id: str) -> bool:
        return user.operator or user.name in await self.starters(session_id)

    async def may_see_request(self, user: User, request: ApprovalRequest) -> bool:
        """Operators see every request; others those they may approve and those of sessions they started."""
        if user.operator or may_approve(self.catalogue, user, request.card.get("tool", ""), _escalated(request)):
            return True
        return user.name in await self.starters(request.session_id)

    # --- requests ---------------------------------------------------------------

    async def request(self, request_id: str) -> ApprovalRequest | None:
        async with self.sessions() as db:
            return await db.get(ApprovalRequest, request_id)

    async def requests(
        self,
        user: User,
        status: str | None,
        tool: str | None,
        session_id: str | None,
        limit: int,
        after: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of the cards `user` may see, in (created_at, id) order, and the cursor of
        the next page (None: the last). Who may see what is a WHERE clause here (the
        same rule as `may_see_request`, which still checks each card), so a page reads
        `limit` + 1 rows, never the whole backlog (issue 25). `after`: a cursor given
        with an earlier page (`pages.BadCursor` if it is not one)."""
        conditions = []
        if status:
            conditions.append(ApprovalRequest.status == status)
        if session_id:
            conditions.append(ApprovalRequest.session_id == session_id)
        if tool:
            conditions.append(ApprovalRequest.tool == tool)
        if after:
            conditions.append(pages.after(after))
        if not user.operator:
            started = union(
                select(Session.id).where(Session.started_by == user.name),
                select(Turn.session_id).where(Turn.started_by == user.name),
            )
            conditions.append(
                or_(pages.may_approve_condition(self.catalogue, user.name), ApprovalRequest.session_id.in_(started))
            )
        query = (
            select(ApprovalRequest)
            .where(*conditions)
            .order_by(ApprovalRequest.created_at, ApprovalRequest.id)
            .limit(limit + 1)
        )
        async with self.sessions() as db:
            found = list(await db.scalars(query))
        shown = []
        for request in found[:limit]:
            if await self.may_see_request(user, request):
                shown.append(await self.card(request))
        last = found[limit - 1] if len(found) > limit else None
        return shown, None if last is None else pages.cursor(last.created_at, last.id)

    async def card(self, request: ApprovalRequest) -> dict[str, Any]:
        """A request as the card shows it: redacted arguments with the hidden fields named,
        the digest to approve, who may approve and how many of them have."""
        card = request.card
        rule = policy(self.catalogue, card.get("tool", ""), _escalated(request))
        async with self.sessions() as db:
            approvals = await db.scalar(
                select(func.count()).select_from(Approval).where(Approval.request_id == request.id)
            )
        return {
            "id": request.id,
            "session_id": request.session_id,
            "status": request.status,
            "tool": card.get("tool", ""),
            "label": card.get("label", ""),
            "description": card.get("description", ""),
            "effect": card.get("effect", ""),
            "target": redact_text(str(card.get("target", ""))),
            "arguments": redact_value(card.get("arguments", {})),
            "hidden": list(card.get("hidden", [])),
            "args_digest": request.args_digest,
            "created_at": request.created_at,
            "expires_at": request.expires_at,
            "approvers": None if rule.approvers is None else sorted(rule.approvers),
            "approvals": int(approvals or 0),
            # What the tool's rule decided for these arguments when the request was made
            # (requests made before rules: the tool's count), and why.
            "approvals_required": rule.approvals_required
            if request.approvals_required is None
            else request.approvals_required,
            "reason": request.reason,
            # Set once a person changed the arguments before approving: who, and how.
            "edited_by": card.get("edited_by"),
            "edit": card.get("edit"),
            "starter_may_approve": rule.starter_may_approve,
            # Whether "approve and remember" may be offered (the ledger still judges it).
            "rememberable": self._rememberable(card.get("tool", "")),
        }

    def _rememberable(self, tool: str) -> bool:
        spec = self.catalogue.get(tool)
        return spec is not None and spec.may_be_remembered

    # --- grants (approve and remember) ---------------------------------------------

    async def grants(self, session_id: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
        """Grants as listed: a session's (or every session's, newest last), live or not."""
        query = select(Grant).order_by(Grant.granted_at, Grant.id).limit(limit)
        if session_id is not None:
            query = query.where(Grant.session_id == session_id)
        async with self.sessions() as db:
            return [shown_grant(grant) for grant in await db.scalars(query)]

    async def grant(self, grant_id: str) -> Grant | None:
        async with self.sessions() as db:
            return await db.get(Grant, grant_id)

    # --- sessions ---------------------------------------------------------------

    async def session(self, session_id: str) -> dict[str, Any] | None:
        async with self.sessions() as db:
            session = await db.get(Session, session_id)
            if session is None:
                return None
            rows = await db.scalars(
                select(TranscriptRow).where(TranscriptRow.session_id == session_id).order_by(TranscriptRow.position)
            )
            transcript = [_shown_entry(row.entry) for row in rows]
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
        return {
            "id": session.id,
            "status": session.status,
            "status_reason": session.status_reason,
            "started_by": session.started_by,
            "created_at": session.created_at,
            "updated_at": session.updated_at,
            "transcript": transcript,
            "pending_requests": [await self.card(r) for r in pending],
            "grants": await self.grants(session_id),
            "usage": {"input_tokens": int(usage[0]), "output_tokens": int(usage[1]), "provider_attempts": usage[2]},
        }

    # --- verdicts -----------------------------------------------------------------

    async def verdict(self, session_id: str, message_id: str) -> AuditEntry | None:
        """The ledger's verdict on the response a message carried: its audit entry
        (`response.accepted` or `response.rejected`), once committed."""
        async with self.sessions() as db:
            return await db.scalar(
                select(AuditEntry).where(
                    AuditEntry.session_id == session_id,
                    AuditEntry.message_id == message_id,
                    AuditEntry.kind.in_(("response.accepted", "response.rejected")),
                )
            )

    async def verdicts(self, waiting: Sequence[tuple[str, str]]) -> Sequence[AuditEntry]:
        """The verdicts committed so far on any of these (session id, message id): one
        query for every decision a gateway process is waiting on (watch.py)."""
        query = select(AuditEntry).where(
            AuditEntry.session_id.in_({s for s, _ in waiting}),
            AuditEntry.message_id.in_({m for _, m in waiting}),
            AuditEntry.kind.in_(("response.accepted", "response.rejected")),
        )
        async with self.sessions() as db:
            return list(await db.scalars(query))

    # --- events -------------------------------------------------------------------

    async def newest_event(self) -> tuple[int, int]:
        """The cursor of "now": the newest outbox row (any type) below the horizon (see
        `events_after`): every row after it that will ever be committed sorts after it."""
        if self.postgres:
            query = text(
                "SELECT coalesce(txid, 0) AS txid, id FROM outbox"
                " WHERE coalesce(txid, 0) < pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
                " ORDER BY coalesce(txid, 0) DESC, id DESC LIMIT 1"
            )
        else:
            query = text("SELECT 0 AS txid, id FROM outbox ORDER BY id DESC LIMIT 1")
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return (int(row.txid), int(row.id)) if row else (0, 0)

    async def events_after(self, cursor: tuple[int, int], limit: int = 200) -> Sequence[Any]:
        """The next committed events after `cursor` = (txid, id), in that order.

        PostgreSQL: outbox ids come from a sequence, taken when a row is written, not
        when its transaction commits, so a row with a smaller id can become visible
        after a larger one has been served; `id > last` would then skip it for good.
        Each row carries its transaction's id (migration 0012), and only rows of
        transactions below the oldest still running (`pg_snapshot_xmin`) are served:
        every transaction there has ended, so no row can later appear before the
        cursor. SQLite has one writer at a time, whose ids are handed out and committed
        in one order: (0, id)."""
        if self.postgres:
            # Plain SQL on the driver (asyncpg prepares it once): the watcher runs it on
            # its own connection too (watch.py), so both read exactly these rows.
            async with self.engine.connect() as conn:
                raw: Any = (await conn.get_raw_connection()).driver_connection
                return await raw.fetch(EVENTS_AFTER_SQL, cursor[0], cursor[1], STREAMED, limit)
        query: Any = (
            select(
                literal_column("0").label("txid"),
                OutboxRow.id,
                OutboxRow.session_id,
                OutboxRow.message_type,
                OutboxRow.body,
            )
            .where(OutboxRow.message_type.in_(STREAMED), OutboxRow.id > cursor[1])
            .order_by(OutboxRow.id)
        )
        async with self.engine.connect() as conn:
            return (await conn.execute(query.limit(limit))).all()


def shown_grant(grant: Grant) -> dict[str, Any]:
    """A grant as listed: its terms, who gave it and when, and whether it still covers calls."""
    at = now()
    live = grant.revoked_at is None and (grant.expires_at is None or at < grant.expires_at)
    return {
        "id": grant.id,
        "session_id": grant.session_id,
        "request_id": grant.request_id,
        "granted_by": grant.granted_by,
        "tool": grant.tool,
        "tool_version": grant.tool_version,
        "target": None if grant.target is None else redact_text(grant.target),
        "approvals_required": grant.approvals_required,
        "granted_at": grant.granted_at,
        "expires_at": grant.expires_at,
        "revoked_at": grant.revoked_at,
        "revoked_by": grant.revoked_by,
        "live": live,
    }


def _escalated(request: ApprovalRequest) -> bool:
    return request.escalated_at is not None


def _shown_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A transcript entry as the card shows it: credentials redacted."""
    return {
        "role": entry.get("role", ""),
        "text": redact_text(str(entry.get("text", ""))),
        "tool_calls": [
            {"call_id": c.get("call_id"), "name": c.get("name"), "arguments": redact_value(c.get("arguments", {}))}
            for c in entry.get("tool_calls", [])
        ],
        "call_id": entry.get("call_id"),
        "closure": entry.get("closure"),
    }
