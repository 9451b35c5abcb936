"""Which database adapter of the ledger's store (`store.py`) an engine takes."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from shared.topology import Topology

from .store import LedgerStore
from .store_postgres import PostgresStore
from .store_sql import DatabaseStore


def database_store(
    engine: AsyncEngine, topology: Topology, notify_channel: str | None, stored_menus: set[str] | None = None
) -> LedgerStore:
    """One transaction of the ledger on its database: PostgreSQL's adapter, or SQLite's.
    `stored_menus`: the tool menus the process knows this database holds (`LedgerStore`)."""
    if engine.dialect.name == "postgresql":
        return PostgresStore(engine, topology, notify_channel, stored_menus)
    return DatabaseStore(engine, topology, notify_channel, stored_menus)


def writers(engine: AsyncEngine, wanted: int) -> int:
    """How many transactions may write at once: `wanted` on PostgreSQL; SQLite has one writer."""
    return wanted if engine.dialect.name == "postgresql" else 1
