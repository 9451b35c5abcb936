"""The one table the HTTP gateway writes in the ledger's database: `ended_logins`, the
logins ended before their time (a logout). Every replica checks it: on each request (a
primary-key read) and, for its open event streams, all of them in one read (`ended_among`)
when a logout's NOTIFY says so, or every fraction of a second without NOTIFY (SQLite).
Redis only caches an end (services/gateway/auth.py), so
losing Redis's keys brings no ended login back. The gateway's role may insert here, read,
and delete the rows whose session would have expired anyway; nothing else of the
ledger's is writable through this engine's role, and nothing else writes this table."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from sqlalchemy import bindparam, delete, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from shared.ledger import driver
from shared.ledger.database import create_engine, notify_channel
from shared.ledger.tables import TABLES, EndedLogin
from shared.settings import Settings

# The payload of the NOTIFY a logout sends on the ledger's outbox channel: every
# replica's watcher hears it and checks its open streams' logins at once.
LOGINS_ENDED = "logins"
_ENDED = TABLES["ended_logins"]
# The read every request makes (a primary key), as a Core statement built once.
_ENDED_ONE = select(_ENDED.c.session_id).where(_ENDED.c.session_id == bindparam("session_id"))


class EndedLogins:
    def __init__(self, engine: AsyncEngine, notify: str | None = None) -> None:
        self.engine = engine
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)
        # PostgreSQL: the channel a logout notifies on commit (`database.notify_channel`).
        self.notify = notify

    @classmethod
    def opened(cls, settings: Settings) -> EndedLogins:
        """PostgreSQL: the gateway's own role (which may write only this table); SQLite: the ledger's file."""
        return cls(create_engine(settings, identity="gateway", pool_size=2), notify_channel(settings))

    async def close(self) -> None:
        await self.engine.dispose()

    async def readable(self) -> bool:
        """A readiness check: the table is there and this role may read it (a deployment
        upgraded without `signoff setup` again has no grant yet, and says so)."""
        async with self.sessions() as db:
            await db.execute(select(EndedLogin.session_id).limit(1))
        return True

    async def end(self, session_id: str, principal: str, expires_at: float) -> None:
        """Record that the session ended (again: nothing changes), and forget the ends
        whose sessions have expired since (a cookie past its time is refused anyway)."""
        now = datetime.now(UTC)
        row = EndedLogin(
            session_id=session_id,
            principal=principal[:256],
            ended_at=now,
            expires_at=datetime.fromtimestamp(expires_at, UTC),
        )
        try:
            async with self.sessions() as db, db.begin():
                db.add(row)
                if self.notify is not None:
                    # Delivered on commit, to every replica's watcher (services/gateway/auth.py `OpenStreams`).
                    await db.execute(
                        text("SELECT pg_notify(:channel, :payload)"), {"channel": self.notify, "payload": LOGINS_ENDED}
                    )
        except IntegrityError:
            pass  # ended already (a second logout, or the same one on two replicas)
        async with self.sessions() as db, db.begin():
            await db.execute(delete(EndedLogin).where(EndedLogin.expires_at < now))

    async def ended(self, session_id: str) -> bool:
        if self.engine.dialect.name == "postgresql":
            # One statement, autocommitted straight on asyncpg: an ORM session's BEGIN,
            # SELECT and ROLLBACK cost a request more CPU than the read (docs/benchmarks.md).
            async with self.engine.connect() as conn:
                return bool(await driver.fetch(conn, _ENDED_ONE, {"session_id": session_id}))
        async with self.sessions() as db:
            return await db.scalar(select(EndedLogin.session_id).where(EndedLogin.session_id == session_id)) is not None

    async def ended_among(self, session_ids: Iterable[str]) -> set[str]:
        """Which of these sessions have ended: one read for every open stream of a replica."""
        wanted = sorted(set(session_ids))
        if not wanted:
            return set()
        async with self.sessions() as db:
            found = await db.scalars(select(EndedLogin.session_id).where(EndedLogin.session_id.in_(wanted)))
            return set(found)
