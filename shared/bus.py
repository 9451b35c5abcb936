"""A service's one connection to RabbitMQ, on aio-pika directly: the queues it
consumes and the messages it publishes. It is the one AMQP client path of the running
code: the services, the gateway and the command line all publish through `Bus.publish`
(`shared.consuming.send`), and the services consume through it (docs/concepts.md, "One
AMQP client path", says why aio-pika and not FastStream).

It keeps what FastStream gave the services, which used these same aio-pika
objects underneath: a robust connection (`shared.amqp_hosts.connect_robust`,
every node of a cluster) that reconnects after a broker restart or a closed
connection and restores its channels, each channel's prefetch and each queue's
consumer; queues looked up, never declared (`signoff setup` declares them, the
service may not); publishes persistent, as the service's own broker identity,
confirmed by the broker. What it leaves out is FastStream's per-message dispatch
(its middlewares, context scopes and call wrappers: ~6 % of the ledger's busy
samples, docs/benchmarks.md), which the services never used: each
delivery goes straight to its `Inbound`, which decodes, handles and acks it.

Consuming and publishing use a channel each, so a publish the broker refuses
(which closes its channel) never takes the consumers and their unacked
deliveries with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage, AbstractRobustConnection

from shared.amqp_hosts import connect_robust

log = logging.getLogger("signoff.broker")

Consumer = Callable[[AbstractIncomingMessage], Awaitable[None]]


def persistent(
    body: bytes,
    *,
    user_id: str,
    message_id: str | None,
    content_type: str | None = "application/json",
    headers: dict[str, Any] | None = None,
) -> aio_pika.Message:
    """The AMQP message every publish sends (`Bus.publish`, and the publisher's relay, which
    pipelines a batch of them on its own channel): persistent, as `user_id`, stamped now."""
    return aio_pika.Message(
        body,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message_id,
        content_type=content_type,
        headers=headers,
        user_id=user_id,
        timestamp=datetime.now(tz=UTC),
    )


class Bus:
    def __init__(self, url: str, *, prefetch: int, graceful_seconds: float = 10.0) -> None:
        self.url = url
        self.prefetch = prefetch
        # How long stopping waits for the deliveries being handled (FastStream's graceful_timeout).
        self.graceful_seconds = graceful_seconds
        self._consumers: list[tuple[str, Consumer]] = []
        self._connection: AbstractRobustConnection | None = None
        self._consuming: AbstractChannel | None = None
        self._publishing: AbstractChannel | None = None
        self._exchanges: dict[str, AbstractExchange] = {}
        self._handling: set[asyncio.Task[None]] = set()
        self._queues: list[tuple[Any, str]] = []
        self._started = False
        self._stopping = False

    def consume(self, queue: str, handle: Consumer) -> None:
        """Hand each delivery of `queue` to `handle` once started (several at once, up
        to the prefetch). `handle` acks or nacks it; one left unsettled goes back to the
        queue when the connection closes."""
        self._consumers.append((queue, handle))

    async def connect(self) -> None:
        self._connection = await connect_robust(self.url)
        # Robust channels: reopened with the connection, their prefetch set again.
        self._consuming = await self._connection.channel(publisher_confirms=False)
        await self._consuming.set_qos(prefetch_count=self.prefetch)
        self._publishing = await self._connection.channel(publisher_confirms=True)

    async def start(self) -> None:
        """Look up each queue (a passive declare: `signoff setup` made it) and consume it.
        A robust queue consumes again, under the same tag, when its channel is restored."""
        assert self._consuming is not None, "connect() first"
        for name, handle in self._consumers:
            queue = await self._consuming.declare_queue(name, passive=True)
            tag = await queue.consume(self._delivery(handle))
            self._queues.append((queue, tag))
        self._started = True

    def _delivery(self, handle: Consumer) -> Consumer:
        async def delivered(message: AbstractIncomingMessage) -> None:
            if self._stopping:
                return  # left unacked: the broker gives it back when this connection closes
            task = asyncio.current_task()
            assert task is not None
            self._handling.add(task)
            try:
                await handle(message)
            finally:
                self._handling.discard(task)

        return delivered

    @property
    def connection(self) -> AbstractRobustConnection:
        """The open connection, for a caller's own channel (the console's event queues)."""
        assert self._connection is not None, "connect() first"
        return self._connection

    @property
    def connected(self) -> bool:
        """Open and consuming (a robust connection restores its consumers when it reconnects)."""
        return (
            self._started
            and not self._stopping
            and self._connection is not None
            and self._connection.connected.is_set()
        )

    async def publish(
        self,
        body: bytes,
        *,
        exchange: str,
        routing_key: str,
        user_id: str,
        message_id: str | None = None,
        headers: dict[str, Any] | None = None,
        content_type: str | None = None,
        mandatory: bool = False,
    ) -> None:
        """Publish persistently as `user_id` (RabbitMQ checks it is the connection's own
        user) and return once the broker confirmed it. Unroutable messages are dropped by
        the broker unless `mandatory` (then the broker returns it and this raises)."""
        assert self._publishing is not None, "connect() first"
        target = self._exchanges.get(exchange)
        if target is None:
            # Not declared (the service may not): an exchange `signoff setup` made, by name.
            target = self._exchanges[exchange] = await self._publishing.get_exchange(exchange, ensure=False)
        await target.publish(
            persistent(body, user_id=user_id, message_id=message_id, content_type=content_type, headers=headers),
            routing_key=routing_key,
            mandatory=mandatory,
        )

    async def stop(self) -> None:
        """Stop taking deliveries, let the ones being handled finish (up to
        `graceful_seconds`), then close: what is still unacked goes back to its queue."""
        self._stopping = True
        # Bounded: on a robust connection that lost the broker (its user gone, say), a cancel
        # and the close wait for a reconnection that may never come, and a service told to
        # stop must stop (a stuck stop outlived `signoff up` as an orphan). What is unacked
        # goes back to its queue either way.
        try:
            async with asyncio.timeout(self.graceful_seconds):
                for queue, tag in self._queues:
                    try:
                        await queue.cancel(tag)
                    except Exception as error:  # a closed channel has no consumer to cancel
                        log.debug("cancelling the consumer of %s: %s", queue.name, error)
        except TimeoutError:
            log.warning("the broker did not answer the consumers' cancel; stopping without it")
        self._queues.clear()
        if self._handling:
            await asyncio.wait(set(self._handling), timeout=self.graceful_seconds)
        if self._connection is not None:
            connection, self._connection = self._connection, None
            try:
                async with asyncio.timeout(self.graceful_seconds):
                    await connection.close()
            except TimeoutError:
                log.warning("the broker connection did not close in %s s; stopping without it", self.graceful_seconds)
