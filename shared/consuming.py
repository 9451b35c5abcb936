"""The one consumer loop every service shares.

It decodes and validates an inbound message, answers bad input with a
dead-letter that names the reason (invariant 9), runs the handler, and acks
only after the handler's effect is durable. Nothing here asks Redis whether a
message was handled: whoever can write Redis could then make a consumer drop
an approved call unhandled (invariant 8). A redelivery is recognised by the
durable record instead: the ledger's inbox, the executor's claim. A handler that fails for a
passing reason (database away, broker hiccup) gets the message back later;
the queue's delivery limit dead-letters one that never succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from aio_pika import ExchangeType
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue
from pydantic import TypeAdapter, ValidationError

from shared import logs
from shared.bus import Bus
from shared.dead_letters import (
    CONSUMER_HEADER,
    DELIVERY_LIMIT,
    DETAIL_HEADER,
    PARKED_AT_HEADER,
    REASON_HEADER,
    SENDER_HEADER,
)
from shared.messages import Envelope, encode, now
from shared.observability import MESSAGE_HANDLING, MESSAGES_CONSUMED, MESSAGES_DEAD_LETTERED, MESSAGES_PUBLISHED
from shared.redaction import redact_message_body, redact_text
from shared.topology import COMMAND_TYPES, Queue, Topology

log = logging.getLogger("signoff.consuming")

# How many times the message being handled was delivered before and not acked:
# a handler that died mid-way leaves its mark here (quorum queues count it).
previous_deliveries: ContextVar[int] = ContextVar("previous_deliveries", default=0)
# The broker user that published the message being handled (the AMQP `user_id`,
# which RabbitMQ checks against the publishing connection's user): who sent it.
sender: ContextVar[str | None] = ContextVar("sender", default=None)


NO_MESSAGE_ID = "message_id: Field required (a message must carry its own id; one made here would differ per delivery)"


class Rejected(Exception):
    """A handler's verdict that a message can never succeed: dead-letter it with this reason."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class Inbound:
    def __init__(
        self,
        *,
        consumer: str,
        bus: Bus,
        topology: Topology,
        max_bytes: int,
        user_id: str,
        message_type: str = "unknown",
    ) -> None:
        self.consumer = consumer
        # The queue's message type: a bounded label, whatever the body claims to be.
        self.message_type = message_type
        self._handling = MESSAGE_HANDLING.labels(consumer, message_type)
        self.user_id = user_id
        self.bus = bus
        self.topology = topology
        self.max_bytes = max_bytes
        # Failed deliveries by message id, where the queue counts none (a classic queue
        # sets no x-delivery-count): a message that keeps failing here is parked at the
        # delivery limit all the same. Per process: a restart, or another replica,
        # starts the count again (docs/benchmarks.md, "Queue types").
        self._failures: dict[str, int] = {}

    async def receive(
        self,
        raw: AbstractIncomingMessage,
        adapter: TypeAdapter[Any],
        handle: Callable[[Any], Awaitable[None]],
    ) -> None:
        started = time.perf_counter()
        outcome = await self._receive(raw, adapter, handle)
        self._handling.observe(time.perf_counter() - started)
        MESSAGES_CONSUMED.labels(self.consumer, self.message_type, outcome).inc()

    async def _receive(
        self,
        raw: AbstractIncomingMessage,
        adapter: TypeAdapter[Any],
        handle: Callable[[Any], Awaitable[None]],
    ) -> str:
        """Handle one delivery; what became of it: handled, dead_lettered or retried."""
        body: bytes = raw.body
        # Each line logged from here on names the message (shared/logs.py): its id until it is read.
        delivery = delivered_id(raw)
        logs.concerning(message_id=delivery)
        if len(body) > self.max_bytes:
            await self.dead_letter(raw, "oversized", f"{len(body)} bytes; the limit is {self.max_bytes}")
            return "dead_lettered"
        try:
            message = adapter.validate_json(body)
        except ValidationError as error:
            logs.concerning_raw(delivery, body)
            await self.dead_letter(raw, "invalid", _describe(error))
            return "dead_lettered"
        if "message_id" not in message.model_fields_set:
            # The envelope's default would mint a new id on every delivery: no inbox or
            # dedupe could recognise a redelivery, and nobody could name it in an answer.
            await self.dead_letter(raw, "invalid", NO_MESSAGE_ID)
            return "dead_lettered"
        logs.concerning(message)
        counted = (raw.headers or {}).get("x-delivery-count")
        # RabbitMQ sets it as an integer (a quorum queue's count); aio-pika types headers loosely.
        delivered_before = int(counted) if counted is not None else self._failures.get(message.message_id, 0)  # type: ignore[arg-type]
        previous_deliveries.set(delivered_before)
        sender.set(raw.user_id)
        try:
            await self._handle_through_outages(message, handle)
        except asyncio.CancelledError:
            raise
        except Rejected as rejection:
            await self.dead_letter(raw, rejection.code, rejection.detail)
            return "dead_lettered"
        except Exception as error:
            if delivered_before >= self.topology.delivery_limit:
                # RabbitMQ would park it after this nack, saying only "delivery_limit":
                # park it here instead, with the error that kept it from succeeding.
                log.exception("%s: handling %s failed on its last delivery", self.consumer, message.message_id)
                self._failures.pop(message.message_id, None)
                await self.dead_letter(
                    raw,
                    DELIVERY_LIMIT,
                    f"failed on all {delivered_before + 1} deliveries (the first and the"
                    f" {self.topology.delivery_limit} redeliveries SIGNOFF_DELIVERY_LIMIT allows);"
                    f" the last error: {type(error).__name__}: {error}",
                )
                return "dead_lettered"
            log.exception("%s: handling %s failed; it will be redelivered", self.consumer, message.message_id)
            if counted is None:
                if len(self._failures) >= 10_000:  # forgotten counts only delay a parking
                    self._failures.clear()
                self._failures[message.message_id] = delivered_before + 1
            # A short pause keeps a dead database from turning into a hot loop.
            await asyncio.sleep(0.5)
            await raw.nack(requeue=True)
            return "retried"
        await raw.ack()
        self._failures.pop(message.message_id, None)
        return "handled"

    async def _handle_through_outages(self, message: Any, handle: Callable[[Any], Awaitable[None]]) -> None:
        """Handle the message; while a dependency (the database, Redis) is away, wait
        for it and try again, holding the message: an outage pauses consumption
        instead of spending the message's deliveries and parking it. Any other
        failure is the caller's to count."""
        pause = 0.5
        while True:
            work = asyncio.ensure_future(handle(message))
            try:
                # A lost broker connection cancels the consumer; the work itself is
                # finished anyway, so a half-run tool call or transaction is not cut
                # short. Its redelivery then finds it done.
                await asyncio.shield(work)
                return
            except asyncio.CancelledError:
                work.add_done_callback(_log_failure)
                raise
            except Exception as error:
                if not is_outage(error):
                    raise
                log.warning(
                    "%s: %s waits for a dependency that is away (%s); retrying in %.1f s",
                    self.consumer,
                    message.message_id,
                    _cause(error),
                    pause,
                )
                await asyncio.sleep(pause)
                pause = min(5.0, pause * 2)

    async def dead_letter(self, raw: AbstractIncomingMessage, code: str, detail: str) -> None:
        """Park a message with its reason, then ack it: nothing lost, nothing blocked.
        What is parked is the reason and the headers, and the body redacted: a call's
        arguments hidden, known secrets and credential shapes hidden everywhere else
        (the ledger keeps the call itself). The copy is published as this consumer (its
        `user_id`) and names who sent the original (RabbitMQ checked that `user_id`), so
        the ledger and a replay can tell it from one anybody else put on the dead path
        (shared/dead_letters.py `proven_sender`)."""
        detail = redact_text(detail)
        # Without an AMQP id: the one this delivery's log lines named (made for it on receipt).
        message_id = raw.message_id or (logs.handling.get() or {}).get("message_id") or delivered_id(raw)
        log.warning("%s: dead-lettering %s: %s: %s", self.consumer, message_id, code, detail)
        MESSAGES_DEAD_LETTERED.labels(self.consumer, self.message_type, code).inc()
        await self.bus.publish(
            redact_message_body(raw.body),
            exchange=self.topology.dead.name,
            routing_key=code,
            message_id=message_id,
            user_id=self.user_id,
            headers={
                REASON_HEADER: code,
                DETAIL_HEADER: detail[:2000],
                CONSUMER_HEADER: self.consumer,
                SENDER_HEADER: raw.user_id or "",
                PARKED_AT_HEADER: now().isoformat(timespec="seconds"),
            },
        )
        await raw.ack()


def delivered_id(raw: AbstractIncomingMessage) -> str:
    """The delivery's AMQP message id, or one made for it (as FastStream made one) when it
    carries none: it names the delivery in log lines and its parked copy, nothing else."""
    return raw.message_id or uuid.uuid4().hex


def is_outage(error: BaseException) -> bool:
    """Whether an error says a dependency is unreachable (not that the message is bad):
    a connection refused or lost, a database that is starting or shutting down, a
    pool that cannot get a connection."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConnectionError | TimeoutError | socket.gaierror):
            return True
        name = type(seen).__name__
        module = type(seen).__module__
        if module.startswith("sqlalchemy") and name == "OperationalError" and _schema_mismatch(seen):
            return False
        if module.startswith("sqlalchemy") and name in ("OperationalError", "InterfaceError", "TimeoutError"):
            return True
        if getattr(seen, "connection_invalidated", False):
            return True
        if module.startswith("asyncpg") and name in (
            "CannotConnectNowError",
            "ConnectionDoesNotExistError",
            "ConnectionFailureError",
            "AdminShutdownError",
            "CrashShutdownError",
            "InterfaceError",
            "InternalClientError",
            "TooManyConnectionsError",
        ):
            return True
        if module.startswith("redis") and name in ("ConnectionError", "TimeoutError", "BusyLoadingError"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# SQLite reports a schema that does not match the code (a missing table or column) as an
# OperationalError, as it does a locked or unreachable file: that one fails the same way on
# every delivery, so it is the message's failure (counted, then parked with the error) and
# an operator sees it, instead of a consumer pausing forever as if the database were away.
_SQLITE_SCHEMA_MISMATCH = ("no such table", "no such column", "has no column named")


def _schema_mismatch(error: BaseException) -> bool:
    text = str(getattr(error, "orig", "") or "")
    return any(clue in text for clue in _SQLITE_SCHEMA_MISMATCH)


def _cause(error: BaseException) -> str:
    said = redact_text(str(error)).splitlines()
    return f"{type(error).__name__}: {said[0][:200] if said else ''}"


def _log_failure(work: asyncio.Future) -> None:
    if not work.cancelled() and work.exception() is not None:
        log.warning(
            "work finished after its consumer was cancelled, with %r; the redelivery will retry it", work.exception()
        )


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "(message)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


async def declare(channel: AbstractChannel, topology: Topology) -> None:
    """Declare every exchange, queue and binding (idempotent): `signoff setup` does,
    with the broker's administrator, before any service starts, so a message
    published before its consumer first starts waits in its queue instead of
    vanishing unrouted. The services themselves may not declare exchanges."""
    exchanges = {}
    for name in topology.all_exchange_names():
        kind = {topology.events.name: topology.events.kind, topology.dead.name: topology.dead.kind}.get(name, "direct")
        exchanges[name] = await channel.declare_exchange(name, ExchangeType(kind), durable=True)

    async def declared(queue: Queue) -> AbstractQueue:
        return await channel.declare_queue(queue.name, durable=True, arguments=queue.arguments)

    await (await declared(topology.dead_letter_queue)).bind(exchanges[topology.dead.name])
    await (await declared(topology.parked_queue)).bind(exchanges[topology.dead.name])
    for message_type in COMMAND_TYPES:
        inbound = await declared(topology.inbound_queue(message_type))
        await inbound.bind(exchanges[topology.inbound_exchange(message_type).name], routing_key=message_type)


async def send(bus: Bus, topology: Topology, message: Envelope, *, user_id: str) -> None:
    """Publish one message on a `Bus` (shared/bus.py), the one way every service, the
    gateway and the command line publish: persistently, as `user_id` (the connection's
    own user, which RabbitMQ checks), and once RabbitMQ confirmed it."""
    exchange, routing_key = topology.route(message)
    await bus.publish(
        encode(message),
        exchange=exchange,
        routing_key=routing_key,
        message_id=message.message_id,
        content_type="application/json",
        user_id=user_id,
    )
    MESSAGES_PUBLISHED.labels(message.type).inc()
