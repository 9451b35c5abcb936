"""What `signoff status` (services/operations/status.py) reads of the ledger's database, as the
console's read-only role: the backlog (the ledger's own measurement,
shared/ledger/backlog.py) and, past one machine, each PostgreSQL server's sessions by
role (`pg_stat_activity`, which shows any role's sessions, without their queries, to
the console's role) and whether it is the primary or a standby. Status judges the
backlog and only shows where each service is connected."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from shared.ledger.backlog import Backlog, measure
from shared.ledger.database import create_engine
from shared.settings import Settings

_IN_RECOVERY = text("SELECT pg_is_in_recovery()")
_SESSIONS_BY_ROLE = text(
    "SELECT usename, count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND pid <> pg_backend_pid() GROUP BY usename"
)


async def measured_backlog(settings: Settings, within: float) -> Backlog:
    """The backlog as the console's role measures it now, within `within` seconds."""
    engine = create_engine(settings, identity="console", pool_size=1)
    try:
        return await asyncio.wait_for(measure(engine), within)
    finally:
        await engine.dispose()


def has_database_servers(settings: Settings) -> bool:
    """Whether the ledger's database has servers to ask for their sessions (PostgreSQL);
    SQLite is a file of this machine."""
    return settings.is_postgres


class DatabaseServer:
    """One server of the ledger's database, asked as the console's role (`settings` names it alone)."""

    def __init__(self, settings: Settings) -> None:
        self.engine = create_engine(settings, identity="console", pool_size=1)

    async def sessions(self, answer_within: float = 5) -> tuple[bool, list[tuple[str, int]]]:
        """Whether it is a standby (its first answer within `answer_within` seconds), and
        how many sessions each role has on it, this one aside."""
        async with self.engine.connect() as conn:
            standby = await asyncio.wait_for(conn.scalar(_IN_RECOVERY), answer_within)
            rows = (await conn.execute(_SESSIONS_BY_ROLE)).all()
        return bool(standby), [(user, count) for user, count in rows]

    async def close(self) -> None:
        await self.engine.dispose()
