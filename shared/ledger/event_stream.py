"""The gateway's event stream and its waits, as the ledger's committed record gives them
(services/gateway/watch.py, services/gateway/events.py): the outbox's events after a
cursor in commit-safe order, the cursor of "now", and the verdicts decisions wait for.

- **The horizon.** PostgreSQL: outbox ids come from a sequence, taken when a row is
  written, not when its transaction commits, so a row with a smaller id can become
  visible after a larger one has been served; `id > last` would then skip it for good.
  Each row carries its transaction's id (migration 0012), and only rows of
  transactions below the horizon are served: below the oldest transaction still open
  *that may write the outbox* (a backend of this database whose role has INSERT on
  it: the ledger's, or a superuser's). Nobody else can add a row before the cursor,
  so nobody else's transaction holds the stream back, however long it stays open
  (the server-wide `pg_snapshot_xmin` did: one idle transaction of any role stopped
  every stream). The horizon is read first (`HORIZON_SQL`) and the rows after, in a
  statement (and snapshot) of their own: a writer that ends between the two is then
  seen committed. Every read of the stream (`events_after`, `newest_event`, the
  watcher's `CommitFeed`) goes through `below_horizon`. SQLite has one writer at a
  time, whose ids are handed out and committed in one order: (0, id).
- **The watcher's connection** (`CommitFeed`): one connection per gateway process
  LISTENs on the ledger's outbox channel (`database.notify_channel`) and runs the
  watcher's reads as plain statements (asyncpg prepares each once), not through
  SQLAlchemy: compiling, caching and row processing were much of each read's CPU
  (make bench, the gateway level's profile).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import literal_column, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from shared.ledger.tables import AuditEntry, OutboxRow
from shared.messages import EVENT_TYPES

Cursor = tuple[int, int]
# The events a caller may be streamed (the outbox also holds commands: never those).
STREAMED = sorted(EVENT_TYPES)
# The audit entries that are the ledger's verdict on a message a gateway waits on: a
# response (accepted or rejected), a turn's start (started, repeated or rejected), or a
# filed call's filing, claim or result (the intake); a refusal of those is a `message.rejected`.
VERDICTS = (
    "response.accepted",
    "response.rejected",
    "turn.started",
    "turn.repeated",
    "call.filed",
    "call.refiled",
    "call.claimed",
    "call.claimed.again",
    "call.reported",
    "message.rejected",
)
# PostgreSQL: (next, horizon): the first transaction id no open writer of the outbox is
# below (the horizon; below `next` while a writer is open). `next` is
# the snapshot's xmax (every id below it was handed out before this statement began);
# each open writer's `backend_xid` (32 bits, read at once from the server's process
# array) is widened to 64 bits against it: it lies within 2^31 of `next`. A writer
# is a backend of this database whose role may INSERT into the outbox.
HORIZON_SQL = (
    "SELECT now.next, least(now.next, min(now.next"
    " + (a.backend_xid::text::bigint - now.next % 4294967296 + 6442450944) % 4294967296 - 2147483648))"
    " FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next) AS now"
    " LEFT JOIN pg_stat_activity AS a ON a.backend_xid IS NOT NULL AND a.datname = current_database()"
    " AND has_table_privilege(a.usesysid, 'outbox', 'INSERT')"
    " GROUP BY now.next"
)
# PostgreSQL: the committed events after a cursor ($1, $2) = (txid, id) and below the horizon ($5), in that order.
EVENTS_AFTER_SQL = (
    "SELECT coalesce(txid, 0) AS txid, id, session_id, message_type, body FROM outbox"
    " WHERE message_type = any($3::text[]) AND (coalesce(txid, 0), id) > ($1::bigint, $2::bigint)"
    " AND coalesce(txid, 0) < $5::bigint"
    " ORDER BY coalesce(txid, 0), id LIMIT $4"
)
# PostgreSQL: the newest outbox row (any type) below the horizon ($1).
NEWEST_EVENT_SQL = (
    "SELECT coalesce(txid, 0) AS txid, id FROM outbox WHERE coalesce(txid, 0) < $1::bigint"
    " ORDER BY coalesce(txid, 0) DESC, id DESC LIMIT 1"
)
# PostgreSQL: the verdicts on any of these (session ids $1, message ids $2).
VERDICT_SQL = (
    "SELECT session_id, message_id, kind, subject, actor, detail FROM audit_log"
    " WHERE session_id = any($1::text[]) AND message_id = any($2::text[]) AND kind = any($3::text[])"
)


@dataclass(frozen=True)
class VerdictRow:
    """An audit entry of a verdict as `answer` in services/gateway/app.py reads it."""

    session_id: str
    message_id: str | None
    kind: str
    subject: str | None
    actor: str | None
    detail: dict[str, Any]


async def below_horizon(raw: Any, statement: str, *args: Any, held: list[bool] | None = None) -> Sequence[Any]:
    """PostgreSQL: `statement`'s rows with the horizon as its last argument, on the driver's
    connection `raw` (asyncpg prepares each once). Two statements, each its own snapshot
    (the gateway's connections autocommit): a writer open when the horizon is read and
    ended before the rows are read is seen committed; one still open is below it.
    `held`: set to whether a writer was open (the horizon below the snapshot's next id),
    so rows may be held back that no later NOTIFY announces (it rolls back)."""
    next_id, horizon = await raw.fetchrow(HORIZON_SQL)
    if held is not None:
        held[:] = [horizon < next_id]
    return await raw.fetch(statement, *args, horizon)


async def newest_event(engine: AsyncEngine) -> Cursor:
    """The cursor of "now": the newest outbox row (any type) below the horizon: every
    row after it that will ever be committed sorts after it."""
    async with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            raw: Any = (await conn.get_raw_connection()).driver_connection
            rows = await below_horizon(raw, NEWEST_EVENT_SQL)
            row = rows[0] if rows else None
        else:
            row = (await conn.execute(text("SELECT 0 AS txid, id FROM outbox ORDER BY id DESC LIMIT 1"))).first()
    return (int(row[0]), int(row[1])) if row else (0, 0)


async def events_after(engine: AsyncEngine, cursor: Cursor, limit: int = 200) -> Sequence[Any]:
    """The next committed events after `cursor` = (txid, id), in that order: rows of
    (txid, id, session_id, message_type, body)."""
    if engine.dialect.name == "postgresql":
        # Plain SQL on the driver: the watcher runs it on its own connection too
        # (`CommitFeed`), so both read exactly these rows.
        async with engine.connect() as conn:
            raw: Any = (await conn.get_raw_connection()).driver_connection
            return await below_horizon(raw, EVENTS_AFTER_SQL, cursor[0], cursor[1], STREAMED, limit)
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
    async with engine.connect() as conn:
        return (await conn.execute(query.limit(limit))).all()


async def verdict(sessions: async_sessionmaker, session_id: str, message_id: str) -> AuditEntry | None:
    """The ledger's verdict on the response a message carried: its audit entry
    (`response.accepted` or `response.rejected`), once committed."""
    async with sessions() as db:
        return await db.scalar(
            select(AuditEntry).where(
                AuditEntry.session_id == session_id,
                AuditEntry.message_id == message_id,
                AuditEntry.kind.in_(VERDICTS),
            )
        )


async def verdicts(sessions: async_sessionmaker, waiting: Sequence[tuple[str, str]]) -> Sequence[AuditEntry]:
    """The verdicts committed so far on any of these (session id, message id): one
    query for every decision a gateway process is waiting on."""
    query = select(AuditEntry).where(
        AuditEntry.session_id.in_({s for s, _ in waiting}),
        AuditEntry.message_id.in_({m for _, m in waiting}),
        AuditEntry.kind.in_(VERDICTS),
    )
    async with sessions() as db:
        return list(await db.scalars(query))


class CommitFeed:
    """The watcher's connection (PostgreSQL): it LISTENs on the ledger's outbox channel
    and runs the watcher's reads while it is there."""

    def __init__(self, raw: Any, ended: asyncio.Event) -> None:
        self._raw = raw
        self._ended = ended
        # Whether the last `events_after` found a writer open below the horizon: rows may
        # then be held back that no NOTIFY will announce (the writer may roll back).
        self.held = [True]

    @classmethod
    @contextlib.asynccontextmanager
    async def listening(
        cls, engine: AsyncEngine, channel: str, notified: Callable[..., None]
    ) -> AsyncIterator[CommitFeed]:
        """A connection LISTENing on `channel` (`notified` on each NOTIFY), until left."""
        async with engine.connect() as conn:
            raw: Any = (await conn.get_raw_connection()).driver_connection
            ended = asyncio.Event()
            raw.add_termination_listener(lambda _c, ended=ended: ended.set())
            await raw.add_listener(channel, notified)
            try:
                yield cls(raw, ended)
            finally:
                with contextlib.suppress(Exception):
                    await raw.remove_listener(channel, notified)

    async def ended(self) -> None:
        """Until the connection drops."""
        await self._ended.wait()

    async def events_after(self, cursor: Cursor, limit: int = 200) -> Sequence[Any]:
        """`events_after`'s rows, read on this connection."""
        return await below_horizon(self._raw, EVENTS_AFTER_SQL, cursor[0], cursor[1], STREAMED, limit, held=self.held)

    async def verdicts(self, waiting: Sequence[tuple[str, str]]) -> list[VerdictRow]:
        """`verdicts`' entries, read on this connection."""
        rows = await self._raw.fetch(
            VERDICT_SQL, list({s for s, _ in waiting}), list({m for _, m in waiting}), VERDICTS
        )
        return [
            VerdictRow(
                r["session_id"],
                r["message_id"],
                r["kind"],
                r["subject"],
                r["actor"],
                json.loads(r["detail"]) if isinstance(r["detail"], str) else r["detail"],
            )
            for r in rows
        ]
