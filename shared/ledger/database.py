"""Engines and migrations for the ledger, built from settings at start-up."""

from __future__ import annotations

import asyncio
import fcntl
import logging
from pathlib import Path

from sqlalchemy import Insert, Table, event, exc, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from shared.settings import Settings

log = logging.getLogger("signoff.database")
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# Any constant will do; it keeps two services from migrating one schema at once.
MIGRATION_LOCK = 0x5160FF


# SQL this process sent, counted for `make bench` (which asks a service for them with
# SIGUSR1, shared/runtime.py): statements (an executemany is one) and transactions ended.
STATEMENT_COUNTS = {"statements": 0, "commits": 0, "rollbacks": 0}


def _count_statements(engine: AsyncEngine) -> AsyncEngine:
    def statement(*_args) -> None:
        STATEMENT_COUNTS["statements"] += 1

    def committed(_connection) -> None:
        STATEMENT_COUNTS["commits"] += 1

    def rolled_back(_connection) -> None:
        STATEMENT_COUNTS["rollbacks"] += 1

    event.listen(engine.sync_engine, "before_cursor_execute", statement)
    event.listen(engine.sync_engine, "commit", committed)
    event.listen(engine.sync_engine, "rollback", rolled_back)
    return engine


def never_hand_out_a_closed_connection(engine: AsyncEngine) -> AsyncEngine:
    """PostgreSQL: a pooled connection whose server ended it (a primary lost and its standby
    promoted, a backend terminated) is replaced at checkout, before anyone uses it. The
    statements sent straight to asyncpg (`driver.py`) bypass SQLAlchemy's disconnect
    handling, so without this one path that forgot to invalidate kept a closed connection
    in the pool and failed every later checkout with "connection is closed" (an executor,
    for two minutes after a failover in tests/cluster). asyncpg notices a closed socket on
    its own: the check is a flag, not a round trip."""

    @event.listens_for(engine.sync_engine, "checkout")
    def _replace_if_closed(dbapi_connection, _record, _proxy) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        if driver is not None and driver.is_closed():
            # The pool discards this connection and checks out (or opens) another.
            raise exc.DisconnectionError("the server closed this pooled connection")

    return engine


def create_engine(settings: Settings, *, identity: str, pool_size: int = 10) -> AsyncEngine:
    """An engine on the ledger, logged in as `identity` (a service, or `console`): on
    PostgreSQL its own role, which may do only what that service needs."""
    url = settings.database_login(identity)
    if settings.is_postgres:
        connect_args = {}
        if settings.database_schema:
            connect_args["server_settings"] = {"search_path": settings.database_schema}
        # No overflow: an overflow connection is closed when it is returned, so under
        # steady load every checkout past the pool size paid a new connection (a TCP
        # handshake, authentication and a PostgreSQL backend process) and dropped it.
        return _count_statements(
            never_hand_out_a_closed_connection(
                create_async_engine(url, pool_size=pool_size, max_overflow=0, connect_args=connect_args)
            )
        )
    Path(url.split("///", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
    # One connection: SQLite has one writer at a time anyway, and queueing in
    # the pool is kinder than "database is locked".
    engine = create_async_engine(url, pool_size=1, max_overflow=0, connect_args={"timeout": 30})

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_connection, _record) -> None:  # pragma: no cover - trivial
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    return _count_statements(engine)


async def database_reachable(engine: AsyncEngine) -> bool:
    """A readiness check: one `SELECT 1` through the service's own pool."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))
    return True


def notify_channel(settings: Settings) -> str | None:
    """The PostgreSQL channel the publisher listens on; SQLite has none (it polls)."""
    if not settings.is_postgres:
        return None
    return f"{settings.namespace}_{settings.database_schema or 'public'}_outbox".replace("-", "_").lower()


def insert_unless_present(table: Table, key: str, dialect: str) -> Insert:
    """INSERT … ON CONFLICT (key) DO NOTHING, on PostgreSQL and SQLite alike: a row
    already there stays as it is, and rowcount 0 says so."""
    module = postgresql if dialect == "postgresql" else sqlite
    return module.insert(table).on_conflict_do_nothing(index_elements=[table.c[key]])


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)


def head_revision() -> str:
    """The newest migration, read from the file names (0001_…, 0002_…) without importing Alembic."""
    return max(p.name.split("_", 1)[0] for p in (MIGRATIONS / "versions").glob("[0-9]*_*.py"))


async def current_revision(engine: AsyncEngine) -> str | None:
    try:
        async with engine.connect() as conn:
            return (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    except Exception:
        return None


def _alembic_config(connection):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


async def migrate(engine: AsyncEngine, settings: Settings) -> None:
    """Bring the ledger's schema to the newest revision (idempotent, safe to race)."""
    if await current_revision(engine) == head_revision():
        # The common restart: nothing to do, and no Alembic import on the recovery path.
        return
    if not settings.is_postgres:
        # SQLite has no advisory lock: a file lock keeps concurrent starts in line.
        lock_path = Path(settings.ledger_url.split("///", 1)[1] + ".migrate.lock")
        lock_file = await asyncio.to_thread(_lock_exclusive, lock_path)
    else:
        lock_file = None
    try:
        await _migrate(engine, settings)
    finally:
        if lock_file is not None:
            lock_file.close()


def _lock_exclusive(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


async def _migrate(engine: AsyncEngine, settings: Settings) -> None:
    for attempt in range(5):
        try:
            async with engine.begin() as conn:
                if settings.is_postgres:
                    await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
                    schema = settings.database_schema
                    # Made by `signoff setup` (then owned by the ledger's role, which may not create schemas).
                    if schema and not await conn.scalar(
                        text("SELECT 1 FROM pg_namespace WHERE nspname = :s"), {"s": schema}
                    ):
                        await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
                from alembic import command

                await conn.run_sync(lambda sync_conn: command.upgrade(_alembic_config(sync_conn), "head"))
            return
        except Exception as error:
            if attempt == 4:
                raise
            log.warning("migration attempt %d failed (%s); retrying", attempt + 1, error)
            await asyncio.sleep(0.2 * (attempt + 1))
