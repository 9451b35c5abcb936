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
from typing import Any, ClassVar

import aio_pika

from shared import faults
from shared.bus import persistent
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
    # A leader without hooks marks what it published sent at most this often (seconds).
    MARK_EVERY: ClassVar[float] = 0.1

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
        await self._publish(rows)
        await faults.reached("publisher.after_send")
        try:
            # A leader without hooks relays through `relay_marking_late` instead.
            ids = [r.id for r in rows]
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

    async def relay_marking_late(
        self, wake: asyncio.Event, idle_wait: float, hook_deliveries: asyncio.Task | None = None
    ) -> None:
        """A PostgreSQL leader's relay with no hooks. Each wake (a NOTIFY: the ledger
        committed more) runs one statement that reads the next unsent rows
        (`outbox_relay.mark_and_read`), leaving out those published and not yet marked;
        the same statement marks those sent once `MARK_EVERY` has passed since the last
        mark, or when the outbox is drained and nothing woke it for `idle_wait`. So one
        statement per wake instead of a read and a mark, and at most one write
        transaction per `MARK_EVERY` however many batches went out. A crash before the
        mark resends the rows with the same message ids, as a crash before the immediate
        mark did (every consumer drops the duplicate); a deposed leader's mark is fenced
        and the rows sent again by its successor. Raises LeadershipLost when this
        publisher no longer leads."""
        leadership = self.leadership
        assert leadership is not None and not self.hooks
        published: list[int] = []
        marked_at = 0.0
        loop = asyncio.get_running_loop()
        idle = False
        while True:
            wake.clear()
            mark = bool(published) and (idle or loop.time() - marked_at >= self.MARK_EVERY or len(published) >= 5000)
            try:
                seen, rows = await outbox_relay.mark_and_read(
                    self.engine, published, mark, now(), leadership.epoch, self.batch_size
                )
            except Exception as error:
                log.warning("relay failed (%r); retrying", error)
                await asyncio.sleep(0.5)
                continue
            try:
                # With `mark`, the statement's fence decided whether `published` is marked: its epoch says.
                leadership.check(seen)
                if mark:
                    published, marked_at = [], loop.time()
                # Still leading (its lock connection alive) before it publishes what it read.
                leadership.ensure()
            except LeadershipLost:
                if published:
                    log.warning(
                        "publisher deposed before marking outbox rows %d..%d sent: %d published, left unsent for the "
                        "leader, which sends them again with the same message ids",
                        published[0],
                        published[-1],
                        len(published),
                    )
                raise
            if rows:
                try:
                    await self._publish(rows)
                except Exception as error:
                    log.warning("relay failed (%r); retrying", error)
                    await asyncio.sleep(0.5)
                    continue
                await faults.reached("publisher.after_send")
                published += [r.id for r in rows]
            if hook_deliveries is not None and hook_deliveries.done():
                hook_deliveries.result()  # a dead hook loop takes the publisher down, loudly
            idle = False
            if len(rows) < self.batch_size:
                # Drained: until woken, or until the marks are due.
                due = self.MARK_EVERY if published else idle_wait
                try:
                    await asyncio.wait_for(wake.wait(), due)
                except TimeoutError:
                    idle = True

    async def _publish(self, rows: Sequence[Any]) -> None:
        exchanges = self.exchanges
        for name in {r.exchange for r in rows} - exchanges.keys():
            exchanges[name] = await self.channel.get_exchange(name, ensure=False)
        # One channel, publishes started in id order: the channel lock keeps
        # that order on the wire, so per-session order holds while confirms overlap.
        await asyncio.gather(
            *(
                exchanges[r.exchange].publish(
                    persistent(r.body.encode(), user_id=self.user_id, message_id=r.message_id),
                    routing_key=r.routing_key,
                )
                for r in rows
            )
        )
        RELAY_BATCH.observe(len(rows))
        for row in rows:
            MESSAGES_PUBLISHED.labels(row.message_type).inc()

    async def relay_forever(
        self, wake: asyncio.Event, idle_wait: float, hook_deliveries: asyncio.Task | None = None
    ) -> None:
        """Relay batch after batch; when the outbox is drained, sleep until woken
        (a NOTIFY on PostgreSQL) or `idle_wait` passes (the poll on SQLite).
        Raises LeadershipLost when this publisher no longer leads."""
        if self.leadership is not None and not self.hooks:
            await self.relay_marking_late(wake, idle_wait, hook_deliveries)
            return
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
