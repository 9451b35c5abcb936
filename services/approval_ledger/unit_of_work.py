"""One ledger transition = one transaction: state rows, the inbox row and the
outbox rows commit together or not at all (invariant 1)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from shared import faults
from shared.messages import Envelope, now
from shared.topology import Topology

from .models import InboxRow, OutboxRow, Session


class Duplicate(Exception):
    """The message was applied before: the inbox says so."""


class UnitOfWork:
    def __init__(self, sessions: async_sessionmaker, topology: Topology, notify_channel: str | None) -> None:
        self._sessions = sessions
        self._topology = topology
        self._notify_channel = notify_channel
        self.db: AsyncSession
        self._tag: str | None = None
        self.now: datetime

    async def __aenter__(self) -> UnitOfWork:
        self.db = self._sessions()
        await self.db.begin()
        self.now = now()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        # Whatever was not committed is gone; nothing of it was published.
        await self.db.rollback()
        await self.db.close()

    async def lock_session(self, session_id: str) -> Session | None:
        """Serialize transitions of one session across ledger replicas (a row lock)."""
        return (await self.db.execute(select(Session).where(Session.id == session_id).with_for_update())).scalar_one_or_none()

    async def receive(self, message: Envelope) -> None:
        """Record the message in the inbox, or raise Duplicate if it was applied before."""
        self._tag = message.type  # type: ignore[attr-defined]
        if await self.db.get(InboxRow, message.message_id) is not None:
            raise Duplicate(message.message_id)
        self.db.add(
            InboxRow(
                message_id=message.message_id,
                message_type=message.type,  # type: ignore[attr-defined]
                session_id=message.session_id,
                received_at=self.now,
            )
        )

    def emit(self, session: Session | None, message: Envelope) -> Envelope:
        """Append a message to the outbox; it leaves only after commit, in this order."""
        if session is not None:
            session.event_seq += 1
            message = message.model_copy(update={"sequence": session.event_seq})
        exchange, routing_key = self._topology.route(message)
        self.db.add(
            OutboxRow(
                message_id=message.message_id,
                session_id=message.session_id,
                message_type=message.type,  # type: ignore[attr-defined]
                exchange=exchange,
                routing_key=routing_key,
                body=message.model_dump_json(),
                created_at=self.now,
            )
        )
        return message

    async def commit(self) -> None:
        await self.db.flush()
        if self._notify_channel:
            # NOTIFY is delivered on commit only, so the publisher never wakes for a rollback.
            await self.db.execute(text("SELECT pg_notify(:channel, '')"), {"channel": self._notify_channel})
        await faults.reached("ledger.before_commit", self._tag)
        try:
            await self.db.commit()
        except IntegrityError as error:
            # A concurrent replica applied the same message first.
            if "inbox" in str(error.orig).lower() or "message_id" in str(error.orig).lower():
                raise Duplicate() from error
            raise
        await faults.reached("ledger.after_commit", self._tag)
