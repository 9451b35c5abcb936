"""The outbox relay: committed rows out, in order, confirmed, then marked sent.

Delivery is at least once: a crash between RabbitMQ's confirm and the UPDATE
that marks the rows sent resends them with the same message ids, and every
consumer drops the duplicate. On PostgreSQL the UPDATE commits only while this
publisher still leads (its epoch, `Leadership.fence`): a deposed leader's batch
is left unsent for its successor, which sends it again with the same ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aio_pika
from sqlalchemy import bindparam, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from shared import faults
from shared.ledger import driver
from shared.ledger.database import STATEMENT_COUNTS
from shared.ledger.tables import TABLES
from shared.messages import now
from shared.observability import MESSAGES_PUBLISHED, RELAY_BATCH

from .hooks import Hook, schedule
from .leadership import EPOCH, LEADER_ROW, Leadership, LeadershipLost

log = logging.getLogger("signoff.publisher")


OUTBOX = TABLES["outbox"]
# Built once: the relay runs them for every batch.
_UNSENT = (
    select(
        OUTBOX.c.id,
        OUTBOX.c.message_id,
        OUTBOX.c.message_type,
        OUTBOX.c.exchange,
        OUTBOX.c.routing_key,
        OUTBOX.c.body,
        # The leader's epoch as this read saw it, at no extra round trip: a leader already
        # replaced publishes nothing it read after its successor took the lead.
        EPOCH.scalar_subquery().label("epoch"),
    )
    .where(OUTBOX.c.sent_at.is_(None))
    .order_by(OUTBOX.c.id)
    .limit(bindparam("batch_size"))
)
_MARK_SENT = (
    update(OUTBOX).where(OUTBOX.c.id.in_(bindparam("ids", expanding=True))).values(sent_at=bindparam("sent_at"))
)
# A leader's mark-sent when no hook wants deliveries written beside it: the fence
# (`Leadership.fence`: the epoch read FOR SHARE) and the UPDATE in one statement, which
# asyncpg autocommits: one round trip instead of SQLAlchemy's BEGIN, SELECT, UPDATE and
# COMMIT. The rows are marked only while the epoch is still the one this leader took;
# either way the epoch it saw comes back, for `Leadership.check`.
_MARK_SENT_FENCED = text(
    "WITH leader AS (SELECT epoch FROM publisher_leader WHERE id = :leader_row FOR SHARE),"
    " marked AS (UPDATE outbox SET sent_at = :sent_at WHERE id = ANY(:ids)"
    " AND (SELECT epoch FROM leader) = :epoch RETURNING 1)"
    " SELECT (SELECT epoch FROM leader) AS epoch, (SELECT count(*) FROM marked) AS marked"
)


@dataclass
class OutboxRelay:
    # Core, not the ORM: the relay runs on every commit, and the ORM's unit of
    # work costs several times more CPU for the same two statements.
    engine: AsyncEngine
    channel: aio_pika.abc.AbstractChannel
    # The publisher's broker user: every message says who sent it (RabbitMQ checks).
    user_id: str
    batch_size: int = 500
    hooks: list[Hook] = field(default_factory=list)
    # This publisher's term as the leader (PostgreSQL); None on SQLite, with its one publisher.
    leadership: Leadership | None = None
    exchanges: dict[str, aio_pika.abc.AbstractExchange] = field(default_factory=dict)

    async def relay_once(self) -> int:
        """Publish the oldest unsent rows; return how many went out."""
        leadership = self.leadership
        async with self.engine.connect() as conn:
            rows: Sequence[Any]
            if conn.dialect.name == "postgresql":
                # Straight on asyncpg, outside a transaction: one round trip instead of
                # SQLAlchemy's BEGIN, SELECT and ROLLBACK (one statement sees one snapshot).
                raw = await driver.driver_of(conn)
                rows = await driver.fetch(conn, _UNSENT, {"batch_size": self.batch_size}, raw=raw)
                if leadership is not None and not rows:
                    # Idle: still the leader? (A leader whose lock connection died unnoticed learns it here.)
                    epoch = await driver.fetch(conn, EPOCH, {}, raw=raw)
                    leadership.check(epoch[0].epoch if epoch else None)
            else:
                rows = (await conn.execute(_UNSENT, {"batch_size": self.batch_size})).all()
                await conn.rollback()
        if not rows:
            return 0
        if leadership is not None:
            leadership.check(rows[0].epoch)
        exchanges = self.exchanges
        for name in {r.exchange for r in rows} - exchanges.keys():
            exchanges[name] = await self.channel.get_exchange(name, ensure=False)
        # One channel, publishes started in id order: the channel lock keeps
        # that order on the wire, so per-session order holds while confirms overlap.
        await asyncio.gather(
            *(
                exchanges[r.exchange].publish(
                    aio_pika.Message(
                        r.body.encode(),
                        message_id=r.message_id,
                        content_type="application/json",
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        user_id=self.user_id,
                    ),
                    routing_key=r.routing_key,
                )
                for r in rows
            )
        )
        RELAY_BATCH.observe(len(rows))
        for row in rows:
            MESSAGES_PUBLISHED.labels(row.message_type).inc()
        await faults.reached("publisher.after_send")
        try:
            if leadership is not None and not self.hooks:
                marking = {"leader_row": LEADER_ROW, "ids": [r.id for r in rows], "sent_at": now()}
                async with self.engine.connect() as conn:
                    marked = await driver.fetch(conn, _MARK_SENT_FENCED, {**marking, "epoch": leadership.epoch})
                STATEMENT_COUNTS["commits"] += 1  # autocommitted
                leadership.check(marked[0].epoch if marked else None)
            else:
                async with self.engine.begin() as conn:
                    if leadership is not None:
                        await leadership.fence(conn)
                    await conn.execute(_MARK_SENT, {"ids": [r.id for r in rows], "sent_at": now()})
                    await schedule(conn, self.hooks, rows)
        except LeadershipLost:
            log.warning(
                "publisher deposed before marking outbox rows %d..%d sent: %d published, left unsent for the "
                "leader, which sends them again with the same message ids",
                rows[0].id,
                rows[-1].id,
                len(rows),
            )
            raise
        return len(rows)

    async def relay_forever(
        self, wake: asyncio.Event, idle_wait: float, hook_deliveries: asyncio.Task | None = None
    ) -> None:
        """Relay batch after batch; when the outbox is drained, sleep until woken
        (a NOTIFY on PostgreSQL) or `idle_wait` passes (the poll on SQLite).
        Raises LeadershipLost when this publisher no longer leads."""
        while True:
            wake.clear()
            if self.leadership is not None:
                self.leadership.ensure()
            try:
                sent = await self.relay_once()
            except LeadershipLost:
                raise
            except Exception as error:
                # Broker or database away (a closed channel, a dropped connection):
                # the rows stay unsent and go out, with the same ids, once it is back.
                log.warning("relay failed (%r); retrying", error)
                await asyncio.sleep(0.5)
                continue
            if hook_deliveries is not None and hook_deliveries.done():
                hook_deliveries.result()  # a dead hook loop takes the publisher down, loudly
            if sent < self.batch_size:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), idle_wait)
