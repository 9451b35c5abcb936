"""The ledger's store on PostgreSQL: the port (`store.py`) on the lean asyncpg path.

The reads are `store_sql.py`'s Core queries, sent straight to asyncpg, in a
transaction begun on asyncpg itself (`shared/ledger/driver.py`): a fraction of SQLAlchemy's
execution, which costs more CPU than these small statements take in PostgreSQL.
Receiving a message is one statement (the inbox row and the session's lock, or the
session's new row; two only when another transaction created the session meanwhile),
and a transition's writes are one more
(`_write_in_one_statement`): two round trips besides its reads, which group commit
(`group_commit.py`) shares further.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, text

from shared.ledger.database import STATEMENT_COUNTS
from shared.ledger.driver import bind_processor, driver_of, fetch, forget_if_closed
from shared.ledger.tables import TABLES
from shared.messages import Envelope

from .store import INSERT_ORDER, Duplicate, SessionState, Writes
from .store_sql import _LOCK_SESSION, _RESTART_COUNT, DatabaseStore

# The inbox row and the session's lock in one statement (one round trip fewer per
# transition). `fresh` 0: the message was applied before. The session is NULL when
# it does not exist (the outer join keeps the inbox's answer either way).
_RECEIVE_AND_LOCK = {
    notify: text(
        "WITH inbox AS (INSERT INTO inbox (message_id, message_type, session_id, received_at)"
        " VALUES (:message_id, :message_type, :session_id, :received_at) ON CONFLICT (message_id) DO NOTHING"
        + (" RETURNING pg_notify(:channel, ''))," if notify else " RETURNING 1),")
        + " locked AS (SELECT * FROM sessions WHERE id = :session_id FOR UPDATE)"
        " SELECT (SELECT count(*) FROM inbox) AS fresh, locked.* FROM (SELECT 1) AS one LEFT JOIN locked ON true"
    )
    for notify in (False, True)
}
# A turn that may open its session: the inbox row, and the session row only if the
# inbox row went in (a duplicate leaves nothing behind, also inside a group commit,
# which does not roll back for it); and the session: the row this statement created
# (its RETURNING: a row this transaction inserted is its own until it commits, as
# good as locked), else the row locked, if it was there before this statement (its
# snapshot). The two cannot both be there (the insert does nothing when the row
# exists). Only a session another transaction created meanwhile is NULL here, and
# `_LOCK_SESSION` then sees the row. A turn costs one round trip, its session's first too.
_RECEIVE_AND_CREATE = {
    notify: text(
        "WITH inbox AS (INSERT INTO inbox (message_id, message_type, session_id, received_at)"
        " VALUES (:message_id, :message_type, :session_id, :received_at) ON CONFLICT (message_id) DO NOTHING"
        + (" RETURNING pg_notify(:channel, ''))," if notify else " RETURNING 1),")
        + " created AS (INSERT INTO sessions (id, status, provider, event_seq, transcript_len, status_reason,"
        " created_at, updated_at) SELECT :session_id, 'idle', :provider, 0, 0, NULL, :received_at, :received_at"
        " WHERE EXISTS (SELECT FROM inbox) ON CONFLICT (id) DO NOTHING RETURNING *),"
        " locked AS (SELECT * FROM sessions WHERE id = :session_id FOR UPDATE)"
        " SELECT (SELECT count(*) FROM inbox) AS fresh, session.* FROM (SELECT 1) AS one"
        " LEFT JOIN (SELECT * FROM created UNION ALL SELECT * FROM locked) AS session ON true"
    )
    for notify in (False, True)
}


_PROCESSORS: dict[str, dict[str, Any]] = {}


def _processors(table: Table, dialect: Any) -> dict[str, Any]:
    """Each column's bind processor by name (None: the value goes as it is), looked up
    once per table: looking columns up by name on every write was 2 % of the ledger's CPU."""
    try:
        return _PROCESSORS[table.name]
    except KeyError:
        found = _PROCESSORS[table.name] = {column.key: bind_processor(column, dialect) for column in table.c}
        return found


class _Statement:
    """The text and positional values of one statement for asyncpg, built from
    table rows with each column's SQLAlchemy bind processor (JSON serialized,
    times in UTC) applied to its values."""

    def __init__(self, dialect: Any) -> None:
        self.dialect = dialect
        self.values: list[Any] = []

    def value(self, value: Any, process: Any = None) -> str:
        if process is not None:
            value = process(value)
        self.values.append(value)
        return f"${len(self.values)}"

    def insert(self, table: Table, rows: list[dict[str, Any]]) -> str:
        names = list(rows[0])
        processors = _processors(table, self.dialect)
        columns = [processors[name] for name in names]
        tuples = ", ".join(
            "(" + ", ".join(self.value(row[name], process) for name, process in zip(names, columns, strict=True)) + ")"
            for row in rows
        )
        quoted = ", ".join(f'"{name}"' for name in names)
        return f"INSERT INTO {table.name} ({quoted}) VALUES {tuples}"

    def insert_unless_present(self, table: Table, rows: list[dict[str, Any]], key: str) -> str:
        """The rows whose key is not taken: a row already there stays as it is."""
        return f'{self.insert(table, rows)} ON CONFLICT ("{key}") DO NOTHING'

    def update(self, table: Table, key: Any, values: dict[str, Any]) -> str:
        processors = _processors(table, self.dialect)
        assignments = ", ".join(f'"{name}" = {self.value(v, processors[name])}' for name, v in values.items())
        return f"UPDATE {table.name} SET {assignments} WHERE id = {self.value(key, processors['id'])}"

    def withdraw(self, call_ids: list[str]) -> str:
        """The pending requests of these calls close as cancelled."""
        process = _processors(TABLES["approval_requests"], self.dialect)["call_id"]
        keys = ", ".join(self.value(call_id, process) for call_id in call_ids)
        return f"UPDATE approval_requests SET status = 'cancelled' WHERE status = 'pending' AND call_id IN ({keys})"


class PostgresStore(DatabaseStore):
    """The transaction is asyncpg's own, begun, committed and rolled back on the driver
    under the checked-out connection: every statement of it is sent straight to asyncpg,
    so SQLAlchemy never begins one there (its adapter then has nothing to end, and the
    pool's reset on return sends nothing). SQLAlchemy's begin, first statement and
    commit cost ~10 % of the ledger's CPU per round trip (docs/benchmarks.md)."""

    # Its asyncpg connection (`_raw`), for the statements sent straight to it.
    _raw_connection: Any = None
    # The asyncpg transaction this unit of work runs in (None once ended).
    _transaction: Any = None

    async def _begin(self) -> None:
        self._raw_connection = None
        self._transaction = None
        self.db = await self._engine.connect()
        raw = None
        try:
            raw = await self._raw()
            transaction = raw.transaction()
            await transaction.start()
            self._transaction = transaction
        except BaseException:
            if raw is not None:
                await forget_if_closed(self.db, raw)
            await self.db.close()
            raise

    async def _end(self) -> None:
        transaction, self._transaction = self._transaction, None
        try:
            raw = self._raw_connection
            if transaction is not None and raw is not None and not raw.is_closed() and raw.is_in_transaction():
                try:
                    await transaction.rollback()
                    STATEMENT_COUNTS["rollbacks"] += 1
                except Exception:
                    # A connection that cannot roll back cannot be trusted: the pool opens another.
                    await self.db.invalidate()
            elif raw is not None and raw.is_closed():
                await self.db.invalidate()
        finally:
            await self.db.close()

    async def _commit(self) -> None:
        raw = await self._raw()
        try:
            await self._transaction.commit()
        except Exception:
            await forget_if_closed(self.db, raw)
            raise
        STATEMENT_COUNTS["commits"] += 1

    async def _raw(self) -> Any:
        """The asyncpg connection under this store's, taken once (a greenlet hop each time)."""
        if self._raw_connection is None:
            self._raw_connection = await driver_of(self.db)
        return self._raw_connection

    async def read(self, query: Any, parameters: dict[str, Any]) -> list[Any]:
        """Straight to asyncpg, inside the transaction `_begin` began there."""
        return await fetch(self.db, query, parameters, raw=await self._raw())

    async def receive_and_lock(
        self, message: Envelope, *, create_with_provider: str | None = None
    ) -> SessionState | None:
        notify = self._notify_channel is not None and not self._notified
        parameters = self._inbox_row(message)
        if notify:
            parameters["channel"] = self._notify_channel
        if create_with_provider is not None:
            parameters["provider"] = create_with_provider
            row = (await self.read(_RECEIVE_AND_CREATE[notify], parameters))[0]
            if row.fresh == 0:
                raise Duplicate(message.message_id)
            self._notified = self._notified or notify
            if row.id is not None:
                return self._locked(SessionState.of(row))
            locked = await self.read(_LOCK_SESSION, {"session_id": message.session_id})
            return self._locked(SessionState.of(locked[0]) if locked else None)
        row = (await self.read(_RECEIVE_AND_LOCK[notify], parameters))[0]
        if row.fresh == 0:
            raise Duplicate(message.message_id)
        self._notified = self._notified or notify
        return self._locked(SessionState.of(row) if row.id is not None else None)

    async def _apply(self, writes: Writes, notify: bool) -> None:
        # A restarted count goes first, in a statement of its own: in one statement the
        # delete and the editor's new approval of the same (request, person) would race
        # (a data-modifying CTE's order is not defined). Only an edit costs this round trip.
        for request_id in writes.recounted:
            await self.read(_RESTART_COUNT, {"request_id_": request_id})
        await self._write_in_one_statement(writes, notify)

    async def _write_in_one_statement(self, writes: Writes, notify: bool) -> None:
        """Every write of the flush in one statement sent straight to the driver
        (asyncpg, in the transaction SQLAlchemy began on this connection), the
        others as data-modifying CTEs of the last: one round trip, and none of
        SQLAlchemy's per-statement machinery, which costs more CPU than the writes.
        Values go through the columns' own bind processors, so they are stored
        exactly as SQLAlchemy stores them. The parts see one snapshot, which is all
        they need: the updates are of rows stored before this flush (a handler never
        changes what it just added), and foreign keys are checked at the end of the
        statement, when the parents inserted beside their children are there."""
        sql = _Statement(self.db.dialect)
        parts = []
        if writes.menus:
            parts.append(sql.insert_unless_present(TABLES["tool_menus"], list(writes.menus.values()), "digest"))
        for name in INSERT_ORDER:
            rows = writes.rows.get(name)
            if rows:
                parts.append(sql.insert(TABLES[name], rows))
        for (name, key), values in writes.updates.items():
            parts.append(sql.update(TABLES[name], key, values))
        if writes.withdrawn:
            parts.append(sql.withdraw(writes.withdrawn))
        if writes.outbox:
            parts.append(sql.insert(TABLES["outbox"], writes.outbox))
        if writes.audit:
            parts.append(sql.insert(TABLES["audit_log"], writes.audit))
        if notify:
            parts.append(f"SELECT pg_notify({sql.value(self._notify_channel)}, '')")
        if not parts:
            return
        text_ = parts[-1]
        if len(parts) > 1:
            text_ = "WITH " + ", ".join(f"w{n} AS ({part})" for n, part in enumerate(parts[:-1])) + " " + text_
        driver = await self._raw()
        STATEMENT_COUNTS["statements"] += 1
        try:
            await driver.execute(text_, *sql.values)
        except Exception:
            await forget_if_closed(self.db, driver)
            raise
