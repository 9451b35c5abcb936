"""Core statements run straight on asyncpg, for the hot paths on PostgreSQL.

SQLAlchemy's execution path (compiling from its cache, the execution context,
result metadata, the greenlet hop) costs more CPU than a small statement takes in
PostgreSQL; and on a plain `engine.connect()` it adds a BEGIN and a ROLLBACK (or
COMMIT) around a statement that is atomic by itself. Here a Core statement is
compiled once per dialect and run on the connection's asyncpg driver, its values
passed through the same bind processors SQLAlchemy applies, so rows are stored
and read exactly as SQLAlchemy stores and reads them. SQLite keeps SQLAlchemy's path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON
from sqlalchemy.ext.asyncio import AsyncConnection

from shared.ledger.database import STATEMENT_COUNTS


class Record:
    """An asyncpg record read by attribute, as SQLAlchemy's rows are; JSON columns
    decoded (SQLAlchemy's codec on the connection hands them over as text)."""

    __slots__ = ("_json", "_record")

    def __init__(self, record: Any, json_columns: frozenset[str]) -> None:
        self._record = record
        self._json = json_columns

    def __getattr__(self, name: str) -> Any:
        try:
            value = self._record[name]
        except KeyError:
            raise AttributeError(name) from None
        if name in self._json and isinstance(value, str):
            return json.loads(value)
        return value


@dataclass(frozen=True, slots=True)
class Compiled:
    sql: str
    # Parameter names in positional order, and the values of the query's own literals.
    names: list[str]
    literals: dict[str, Any]
    json_columns: frozenset[str]
    # Each positional parameter's bind processor (None: passed as it is).
    processors: list[Any]

    def arguments(self, parameters: dict[str, Any]) -> list[Any]:
        values = []
        for name, process in zip(self.names, self.processors, strict=True):
            value = parameters[name] if name in parameters else self.literals.get(name)
            values.append(value if process is None else process(value))
        return values


_COMPILED: dict[Any, Compiled] = {}


def compiled(query: Any, dialect: Any) -> Compiled:
    """A query's PostgreSQL text and what running it on asyncpg needs, compiled once."""
    try:
        return _COMPILED[query]
    except KeyError:
        done = query.compile(dialect=dialect)
        names = list(done.positiontup or ())
        selected = getattr(query, "selected_columns", ())
        found = _COMPILED[query] = Compiled(
            str(done),
            names,
            dict(done.params),
            frozenset(c.key for c in selected if isinstance(c.type, JSON)),
            [done.binds[name].type._cached_bind_processor(dialect) for name in names],
        )
        return found


_BIND_PROCESSORS: dict[Any, Any] = {}


def bind_processor(column: Any, dialect: Any) -> Any:
    try:
        return _BIND_PROCESSORS[column]
    except KeyError:
        process = _BIND_PROCESSORS[column] = column.type._cached_bind_processor(dialect)
        return process


async def driver_of(conn: AsyncConnection) -> Any:
    """The asyncpg connection under `conn` (a greenlet hop: a caller running several
    statements on one checkout takes it once and passes it as `raw`)."""
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    return driver


async def fetch(conn: AsyncConnection, query: Any, parameters: dict[str, Any], *, raw: Any = None) -> list[Record]:
    """The rows of a SELECT (or a statement with RETURNING)."""
    done = compiled(query, conn.dialect)
    driver = raw if raw is not None else await driver_of(conn)
    STATEMENT_COUNTS["statements"] += 1  # the bench's count: SQLAlchemy's events do not see it
    try:
        records = await driver.fetch(done.sql, *done.arguments(parameters))
    except Exception:
        await forget_if_closed(conn, driver)
        raise
    return [Record(record, done.json_columns) for record in records]


async def execute(conn: AsyncConnection, query: Any, parameters: dict[str, Any], *, raw: Any = None) -> int:
    """Run an INSERT, UPDATE or DELETE; how many rows it touched. Outside a transaction
    SQLAlchemy began, asyncpg autocommits it: one statement, one round trip."""
    done = compiled(query, conn.dialect)
    driver = raw if raw is not None else await driver_of(conn)
    STATEMENT_COUNTS["statements"] += 1
    if not driver.is_in_transaction():
        STATEMENT_COUNTS["commits"] += 1
    try:
        status = await driver.execute(done.sql, *done.arguments(parameters))
    except Exception:
        await forget_if_closed(conn, driver)
        raise
    return int(status.rsplit(" ", 1)[-1])


async def forget_if_closed(conn: AsyncConnection, driver: Any) -> None:
    """A statement sent straight to asyncpg bypasses SQLAlchemy's disconnect handling: a
    connection whose server went away (a primary lost, its standby promoted) would stay
    in the pool and fail every later checkout with "connection is closed", forever (seen
    in tests/cluster). Invalidated, the pool opens a new one, on whichever host is the
    primary now (target_session_attrs)."""
    if driver.is_closed():
        await conn.invalidate()
