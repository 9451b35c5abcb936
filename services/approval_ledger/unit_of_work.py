"""One ledger transition = one transaction: state rows, the inbox row and the
outbox rows commit together or not at all (invariant 1).

SQLAlchemy Core on one AsyncConnection, no ORM. The session row is read once
(locked) and written once, at commit. The inbox row is one
`INSERT ... ON CONFLICT DO NOTHING`: no row inserted means a duplicate. The rows
a transition creates or changes are collected here and written at commit: one
INSERT per table with all its rows, parents first, then the updates, then the
outbox rows in emission order, then the audit entries. A handler never reads
back what it wrote.

Each audit entry is chained to the session's entry before it as it is made
(`audit`): the session's row lock orders a session's transitions, so its chain
cannot fork, and its head travels in the session row, written anyway. The
global chain is linked after commit (`services/approval_ledger/audit.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, bindparam, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared import audit, faults
from shared.ledger.database import STATEMENT_COUNTS, insert_unless_present
from shared.ledger.driver import bind_processor, driver_of, fetch, forget_if_closed
from shared.ledger.tables import TABLES
from shared.messages import Envelope, TranscriptEntry, now
from shared.topology import Topology

SESSIONS = TABLES["sessions"]
INBOX = TABLES["inbox"]
OUTBOX = TABLES["outbox"]
AUDIT = TABLES["audit_log"]
# The tables a transition inserts into, parents before children (foreign keys).
INSERT_ORDER: tuple[Table, ...] = tuple(
    TABLES[name]
    for name in (
        "turns",
        "steps",
        "tool_calls",
        "approval_requests",
        "approvals",
        "decisions",
        "closures",
        "provider_attempts",
        "transcript",
    )
)

_LOCK_SESSION = select(SESSIONS).where(SESSIONS.c.id == bindparam("session_id")).with_for_update()
_INSERT_SESSION = {dialect: insert_unless_present(SESSIONS, "id", dialect) for dialect in ("postgresql", "sqlite")}
# A duplicate message inserts nothing (rowcount 0): the database decides, in this transaction (invariant 8).
# SQLite's; PostgreSQL's inbox row is part of `_RECEIVE_AND_LOCK` / `_RECEIVE_AND_CREATE`.
_INBOX_INSERT = insert_unless_present(INBOX, "message_id", "sqlite")
_INSERT = {table: table.insert() for table in (OUTBOX, AUDIT, *INSERT_ORDER)}
# The SET clause is the parameters' column names; every updated table has an `id` key.
_UPDATE_BY_ID = {
    table: table.update().where(table.c.id == bindparam("id_"))
    for table in (SESSIONS, *INSERT_ORDER)
    if "id" in table.c
}
_NOTIFY = text("SELECT pg_notify(:channel, '')")
# PostgreSQL: the inbox row and the session's lock in one statement (one round trip
# fewer per transition). `fresh` 0: the message was applied before. The session is
# NULL when it does not exist (the outer join keeps the inbox's answer either way).
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
# PostgreSQL, a turn that may open its session: the inbox row, and the session row
# only if the inbox row went in (a duplicate leaves nothing behind, also inside a
# group commit, which does not roll back for it); then `_LOCK_SESSION` sees the row.
_RECEIVE_AND_CREATE = {
    notify: text(
        "WITH inbox AS (INSERT INTO inbox (message_id, message_type, session_id, received_at)"
        " VALUES (:message_id, :message_type, :session_id, :received_at) ON CONFLICT (message_id) DO NOTHING"
        + (" RETURNING pg_notify(:channel, ''))," if notify else " RETURNING 1),")
        + " created AS (INSERT INTO sessions (id, status, provider, event_seq, transcript_len, status_reason,"
        " created_at, updated_at) SELECT :session_id, 'idle', :provider, 0, 0, NULL, :received_at, :received_at"
        " WHERE EXISTS (SELECT FROM inbox) ON CONFLICT (id) DO NOTHING)"
        " SELECT count(*) AS fresh FROM inbox"
    )
    for notify in (False, True)
}


class _Statement:
    """The text and positional values of one statement for asyncpg, built from
    table rows with each column's SQLAlchemy bind processor (JSON serialized,
    times in UTC) applied to its values."""

    def __init__(self, dialect: Any) -> None:
        self.dialect = dialect
        self.values: list[Any] = []

    def value(self, value: Any, column: Any = None) -> str:
        if column is not None:
            process = bind_processor(column, self.dialect)
            if process is not None:
                value = process(value)
        self.values.append(value)
        return f"${len(self.values)}"

    def insert(self, table: Table, rows: list[dict[str, Any]]) -> str:
        names = list(rows[0])
        columns = [table.c[name] for name in names]
        tuples = ", ".join(
            "(" + ", ".join(self.value(row[name], column) for name, column in zip(names, columns, strict=True)) + ")"
            for row in rows
        )
        quoted = ", ".join(f'"{name}"' for name in names)
        return f"INSERT INTO {table.name} ({quoted}) VALUES {tuples}"

    def update(self, table: Table, key: Any, values: dict[str, Any]) -> str:
        assignments = ", ".join(f'"{name}" = {self.value(v, table.c[name])}' for name, v in values.items())
        return f"UPDATE {table.name} SET {assignments} WHERE id = {self.value(key, table.c.id)}"


def storable(value: Any) -> Any:
    """A text as a column can keep it: PostgreSQL's text refuses NUL, so a NUL in a text
    a service wrote (a tool's error, a provider's reply, a model's final text) becomes
    U+FFFD here, where it becomes a record, instead of failing the transition on every
    delivery. JSON columns need nothing: their serializer escapes it (\u0000)."""
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


class Duplicate(Exception):
    """The message was applied before: the inbox says so."""


@dataclass(eq=False, slots=True)
class SessionState:
    """The session row of this transition: read (locked) once, written once at commit."""

    id: str
    status: str
    provider: str
    event_seq: int
    transcript_len: int
    created_at: datetime
    updated_at: datetime
    status_reason: str | None = None
    # Who started the session (its first turn that named someone).
    started_by: str | None = None
    # The digest chain of positions 1..transcript_len (shared/ledger/transcripts.py);
    # None: a session from before digests, whose digest is computed when a step needs it.
    transcript_digest: str | None = None
    # Transcript rows already in the database (positions 1..n) when the transition began.
    transcript_base: int = 0
    # Entries appended in this transition, in order (positions transcript_base + 1 ...).
    appended: list[TranscriptEntry] = field(default_factory=list)
    # The head of its audit chain: the last entry's number and hash.
    audit_seq: int = 0
    audit_hash: str | None = None
    # What `written` was as stored: what commit need not write again.
    stored: tuple | None = None

    def written(self) -> tuple:
        return (
            self.status,
            self.event_seq,
            self.transcript_len,
            self.transcript_digest,
            self.updated_at,
            self.audit_seq,
            self.audit_hash,
        )


class UnitOfWork:
    def __init__(self, engine: AsyncEngine, topology: Topology, notify_channel: str | None) -> None:
        self._engine = engine
        self._topology = topology
        self._notify_channel = notify_channel
        self.db: AsyncConnection
        # PostgreSQL: its asyncpg connection (`_raw`), for the statements sent straight to it.
        self._raw_connection: Any = None
        self._tag: str | None = None
        self.now: datetime
        self._session: SessionState | None = None
        self._rows: dict[Table, list[dict[str, Any]]] = {}
        self._updates: dict[tuple[Table, Any], dict[str, Any]] = {}
        self._outbox: list[dict[str, Any]] = []
        self._audit: list[dict[str, Any]] = []
        # Whether this transaction already queued its NOTIFY (with the inbox row).
        self._notified = False
        # The message types of the transitions a group commit settled in this transaction.
        self._settled: list[str | None] = []
        # The messages this transaction answers with message.rejected (each logs its own line).
        self.rejected: set[str] = set()

    async def __aenter__(self) -> UnitOfWork:
        self.db = await self._engine.connect()
        self._raw_connection = None
        try:
            await self.db.begin()
        except BaseException:
            await self.db.close()
            raise
        self.now = now()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        # Whatever was not committed is gone; nothing of it was published.
        await self.db.rollback()
        await self.db.close()

    async def lock_session(self, session_id: str, *, create_with_provider: str | None = None) -> SessionState | None:
        """Serialize transitions of one session across ledger replicas (a row lock).

        `create_with_provider`: a new session is inserted first (unless present), so
        that two first messages of one session meet at the row lock, the second
        seeing what the first committed, instead of both inserting and one failing
        on the primary key."""
        await self._create_session(session_id, create_with_provider)
        row = (await self.db.execute(_LOCK_SESSION, {"session_id": session_id})).first()
        return self._locked(row)

    async def receive_and_lock(
        self, message: Envelope, *, create_with_provider: str | None = None
    ) -> SessionState | None:
        """`lock_session` and `receive` together: the session locked (None: there is
        none), the message in the inbox, or Duplicate. On PostgreSQL one statement."""
        if self.db.dialect.name != "postgresql":
            # The inbox first: a duplicate must leave no session row behind (a group
            # commit does not roll back for it). SQLite has one writer: no lock order.
            await self.receive(message)
            return await self.lock_session(message.session_id, create_with_provider=create_with_provider)
        self._tag = message.type
        notify = self._notify_channel is not None and not self._notified
        parameters = self._inbox_row(message)
        if notify:
            parameters["channel"] = self._notify_channel
        if create_with_provider is not None:
            parameters["provider"] = create_with_provider
            if (await self.read(_RECEIVE_AND_CREATE[notify], parameters))[0].fresh == 0:
                raise Duplicate(message.message_id)
            self._notified = self._notified or notify
            locked = await self.read(_LOCK_SESSION, {"session_id": message.session_id})
            return self._locked(locked[0] if locked else None)
        row = (await self.read(_RECEIVE_AND_LOCK[notify], parameters))[0]
        if row.fresh == 0:
            raise Duplicate(message.message_id)
        self._notified = self._notified or notify
        return self._locked(row if row.id is not None else None)

    async def _create_session(self, session_id: str, provider: str | None) -> None:
        if provider is not None:
            await self.db.execute(
                _INSERT_SESSION[self.db.dialect.name],
                {
                    "id": session_id,
                    "status": "idle",
                    "provider": provider,
                    "event_seq": 0,
                    "transcript_len": 0,
                    "status_reason": None,
                    "created_at": self.now,
                    "updated_at": self.now,
                },
            )

    def _locked(self, row: Any) -> SessionState | None:
        if row is None:
            return None
        self._session = SessionState(
            id=row.id,
            status=row.status,
            provider=row.provider,
            event_seq=row.event_seq,
            transcript_len=row.transcript_len,
            created_at=row.created_at,
            updated_at=row.updated_at,
            status_reason=row.status_reason,
            started_by=row.started_by,
            transcript_digest=row.transcript_digest,
            transcript_base=row.transcript_len,
            audit_seq=row.audit_seq,
            audit_hash=row.audit_hash,
        )
        self._session.stored = self._session.written()
        return self._session

    async def receive(self, message: Envelope) -> None:
        """Record the message in the inbox, or raise Duplicate if it was applied before.
        SQLite only: on PostgreSQL `receive_and_lock` writes the inbox row in its statement."""
        self._tag = message.type
        inserted = await self.db.execute(_INBOX_INSERT, self._inbox_row(message))
        if inserted.rowcount == 0:
            raise Duplicate(message.message_id)

    def _inbox_row(self, message: Envelope) -> dict[str, Any]:
        return {
            "message_id": message.message_id,
            "message_type": message.type,
            "session_id": message.session_id,
            "received_at": self.now,
        }

    async def _raw(self) -> Any:
        """The asyncpg connection under this unit of work's, taken once (a greenlet hop each time)."""
        if self._raw_connection is None:
            self._raw_connection = await driver_of(self.db)
        return self._raw_connection

    async def read(self, query: Any, parameters: dict[str, Any]) -> list[Any]:
        """The rows of a statement built once (the handlers' reads; the inbox-and-lock
        statements). On PostgreSQL, once the transaction has begun (a group commit's
        transitions after its first), it goes straight to asyncpg: a fraction of
        SQLAlchemy's execution, which the first runs to begin the transaction."""
        if self.db.dialect.name == "postgresql":
            raw = await self._raw()
            if raw.is_in_transaction():
                return await fetch(self.db, query, parameters, raw=raw)
        return list((await self.db.execute(query, parameters)).all())

    def add(self, table: Table, row: dict[str, Any]) -> dict[str, Any]:
        """A new row, inserted at the next flush."""
        row = {column: storable(value) for column, value in row.items()}
        self._rows.setdefault(table, []).append(row)
        return row

    def update(self, table: Table, key: Any, **values: Any) -> None:
        """Change a stored row (by id) at the next flush."""
        self._updates.setdefault((table, key), {}).update({column: storable(v) for column, v in values.items()})

    def emit(self, session: SessionState | None, message: Envelope) -> Envelope:
        """Append a message to the outbox; it leaves only after commit, in this order."""
        if session is not None:
            session.event_seq += 1
            message = message.model_copy(update={"sequence": session.event_seq})
        exchange, routing_key = self._topology.route(message)
        self._outbox.append(
            {
                "message_id": message.message_id,
                "session_id": message.session_id,
                "message_type": message.type,
                "exchange": exchange,
                "routing_key": routing_key,
                "body": message.model_dump_json(),
                "created_at": self.now,
                "sent_at": None,
            }
        )
        return message

    def audit(
        self,
        session: SessionState | None,
        session_id: str,
        kind: str,
        *,
        subject: str | None = None,
        actor: str | None = None,
        message_id: str | None = None,
        **detail: Any,
    ) -> None:
        """Append an audit entry, chained to the session's last (shared/audit.py); written
        with this transition's other rows, so it commits or vanishes with them."""
        head = None if session is None else (session.audit_seq, session.audit_hash)
        entry = audit.chained(
            session_id=session_id,
            head=head,
            kind=kind,
            subject=subject,
            actor=actor,
            message_id=message_id,
            detail=detail,
            at=self.now,
        )
        if session is not None:
            session.audit_seq, session.audit_hash = entry["session_seq"], entry["hash"]
        self._audit.append(entry)

    async def flush(self, *, final: bool = False) -> None:
        """Write what was collected so far: the new rows per table, the updates, then
        the outbox rows in emission order; `final`: also the session row's changes
        and the NOTIFY. On PostgreSQL all of it is one statement on the driver's
        connection (`_write_in_one_statement`); on SQLite one INSERT per table and one
        UPDATE per row, run in one greenlet (`run_sync`)."""
        notify = self._collect_session_changes(final)
        if self.db.dialect.name == "postgresql":
            await self._write_in_one_statement(notify)
        else:
            await self.db.run_sync(self._write, notify)

    def _collect_session_changes(self, final: bool) -> bool:
        """At the end of a transition: the session row's changes join the updates.
        True: this flush also sends the transaction's NOTIFY."""
        session = self._session
        if final and session is not None and session.written() != session.stored:
            self.update(
                SESSIONS,
                session.id,
                status=session.status,
                event_seq=session.event_seq,
                transcript_len=session.transcript_len,
                transcript_digest=session.transcript_digest,
                updated_at=session.updated_at,
                audit_seq=session.audit_seq,
                audit_hash=session.audit_hash,
            )
            session.stored = session.written()
        notify = final and self._notify_channel is not None and not self._notified
        self._notified = self._notified or notify
        return notify

    def _write(self, db: Connection, notify: bool) -> None:
        for table in INSERT_ORDER:
            rows = self._rows.pop(table, None)
            if rows:
                db.execute(_INSERT[table], rows)
        for (table, key), values in self._updates.items():
            db.execute(_UPDATE_BY_ID[table], {"id_": key, **values})
        self._updates.clear()
        if self._outbox:
            db.execute(_INSERT[OUTBOX], self._outbox)
            self._outbox = []
        if self._audit:
            db.execute(_INSERT[AUDIT], self._audit)
            self._audit = []
        if notify:
            # NOTIFY is delivered on commit only, so the publisher never wakes for a rollback.
            db.execute(_NOTIFY, {"channel": self._notify_channel})

    async def _write_in_one_statement(self, notify: bool) -> None:
        """PostgreSQL: every write of the flush in one statement sent straight to the
        driver (asyncpg, in the transaction SQLAlchemy began on this connection), the
        others as data-modifying CTEs of the last: one round trip, and none of
        SQLAlchemy's per-statement machinery, which costs more CPU than the writes.
        Values go through the columns' own bind processors, so they are stored
        exactly as SQLAlchemy stores them. The parts see one snapshot, which is all
        they need: the updates are of rows stored before this flush (a handler never
        changes what it just added), and foreign keys are checked at the end of the
        statement, when the parents inserted beside their children are there."""
        sql = _Statement(self.db.dialect)
        parts = []
        for table in INSERT_ORDER:
            rows = self._rows.pop(table, None)
            if rows:
                parts.append(sql.insert(table, rows))
        for (table, key), values in self._updates.items():
            parts.append(sql.update(table, key, values))
        self._updates.clear()
        if self._outbox:
            parts.append(sql.insert(OUTBOX, self._outbox))
            self._outbox = []
        if self._audit:
            parts.append(sql.insert(AUDIT, self._audit))
            self._audit = []
        if notify:
            parts.append(f"SELECT pg_notify({sql.value(self._notify_channel)}, '')")
        if not parts:
            return
        text_ = parts[-1]
        if len(parts) > 1:
            text_ = "WITH " + ", ".join(f"w{n} AS ({part})" for n, part in enumerate(parts[:-1])) + " " + text_
        driver = await self._raw()
        if not driver.is_in_transaction():
            # SQLAlchemy begins the driver's transaction at its first statement: this
            # flush must not run before it, outside any transaction (autocommitted).
            await self.db.exec_driver_sql("SELECT 1")
        STATEMENT_COUNTS["statements"] += 1
        try:
            await driver.execute(text_, *sql.values)
        except Exception:
            await forget_if_closed(self.db, driver)
            raise

    @property
    def settled(self) -> int:
        """How many transitions a group commit settled in this transaction so far."""
        return len(self._settled)

    async def settle(self) -> None:
        """End one transition of a group commit: write what it collected, session row
        included, and leave the transaction open for the next one (which locks its
        own session and sees these rows). One NOTIFY serves the whole transaction."""
        await self.flush(final=True)
        self._settled.append(self._tag)
        self._session = None
        self._tag = None

    async def commit(self) -> None:
        await self.flush(final=True)
        tags = self._settled or [self._tag]
        for tag in tags:
            await faults.reached("ledger.before_commit", tag)
        await self.db.commit()
        for tag in tags:
            await faults.reached("ledger.after_commit", tag)
