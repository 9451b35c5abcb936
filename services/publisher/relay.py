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
from dataclasses import dataclass, field
from typing import Any

import aio_pika

from shared import faults
from shared.ledger import outbox_relay
from shared.messages import now
from shared.observability import MESSAGES_PUBLISHED, RELAY_BATCH

from .hooks import Hook, scheduled
from .leadership import Leadership, LeadershipLost

log = logging.getLogger("signoff.publisher")


@dataclass
class OutboxRelay:
    # Its reads and marks are shared/ledger/outbox_relay.py's, on Core, not the ORM: the
    # relay runs on every commit, and the ORM's unit of work costs several times more CPU.
    engine: Any
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
        rows = await outbox_relay.unsent(
            self.engine, self.batch_size, leadership.check if leadership is not None else None
        )
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
            ids = [r.id for r in rows]
            if leadership is not None and not self.hooks:
                leadership.check(await outbox_relay.mark_sent_fenced(self.engine, ids, now(), leadership.epoch))
            else:
                fence = leadership.fence if leadership is not None else None
                await outbox_relay.mark_sent(self.engine, ids, now(), scheduled(self.hooks, rows), fence)
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
