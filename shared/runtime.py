"""Start-up for every service: build connections from settings, say clearly
which dependency is unreachable, and run until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aio_pika.abc import AbstractIncomingMessage
from pydantic import TypeAdapter

from shared import faults, logs
from shared.amqp_hosts import hosts_of, split_hosts
from shared.bus import Bus
from shared.consuming import Inbound, delivered_id, send
from shared.dead_letters import ParkedMessage, describe
from shared.messages import EVENT_TYPES, Envelope
from shared.observability import DEAD_LETTERS, Health, bounded
from shared.settings import Settings
from shared.topology import COMMAND_TYPES, Topology

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("signoff")
# What a parked message may be, as a label (a parked body may claim any type).
PARKED_TYPES = set(COMMAND_TYPES) | set(EVENT_TYPES)

HOW_TO_START = {
    "RabbitMQ": "start it with `rabbitmq-server -detached` (or `docker compose up -d rabbitmq`), "
    "or set SIGNOFF_RABBITMQ_URL",
    "Redis": "start it with `redis-server --daemonize yes` (or `docker compose up -d redis`), or set SIGNOFF_REDIS_URL",
    "PostgreSQL": "start it with `pg_ctlcluster <version> main start` (or `docker compose up -d postgres`), "
    "or set SIGNOFF_DATABASE_URL",
}


class Unreachable(SystemExit):
    def __init__(self, service: str, address: str, error: object) -> None:
        super().__init__(f"signoff: cannot reach {service} at {address} ({error}); {HOW_TO_START[service]}")


def check_reachable(
    settings: Settings, *, timeout: float = 3.0, only: tuple[str, ...] = ("RabbitMQ", "Redis", "PostgreSQL")
) -> None:
    """Fail fast, naming the service, its address and how to start it."""
    targets = [("RabbitMQ", settings.rabbitmq_url, 5672), ("Redis", settings.redis_url, 6379)]
    if (server := settings.database_server) is not None:  # on SQLite, a file: nothing to reach
        targets.append(("PostgreSQL", server, 5432))
    targets = [t for t in targets if t[0] in only]
    for service, url, default_port in targets:
        # Several hosts (a RabbitMQ cluster's nodes, a PostgreSQL primary and standby): one answering is enough.
        error: OSError | None = None
        for one in split_hosts(url):
            parts = urlsplit(one)
            host, port = parts.hostname or "localhost", parts.port or default_port
            try:
                socket.create_connection((host, port), timeout=timeout).close()
                break
            except OSError as failed:
                error = failed
        else:
            raise Unreachable(service, ",".join(hosts_of(url)), error) from None


def configure_logging(settings: Settings, name: str) -> None:
    logs.configure(name, settings.log_format)


class Runtime:
    """The connections one service process needs, opened at start-up."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.topology = Topology(settings.namespace, settings.delivery_limit, settings.queue_type)
        # Its own broker identity: RabbitMQ lets it write only its own exchange.
        self.amqp_url, self.user = settings.amqp_login(name)
        # Consumers and publishes on aio-pika directly (shared/bus.py): its robust connection
        # reconnects to any node of the URL and restores each consumer and its prefetch.
        self.bus = Bus(self.amqp_url, prefetch=settings.prefetch)
        self._redis: Redis | None = None
        # /metrics, /healthz, /readyz; each service adds what it needs beyond the broker.
        self.health = Health(name)
        self.health.add("broker", self._broker_connected)
        # What SIGHUP (`signoff reload`) reads again: each service adds its files (the tools file, …).
        self.reloads: list[Callable[[], None]] = []

    async def expose(self) -> None:
        """Serve /metrics, /healthz and /readyz (before anything slow, so a probe sees the process live)."""
        await self.health.start(self.settings.metrics_host, self.settings.metrics_port)

    async def _broker_connected(self) -> bool:
        # Open, consuming (a robust connection restores its consumers when it reconnects) and started.
        return self.bus.connected

    @property
    def redis(self) -> Redis:
        """Built on first use: only the executor uses Redis (its leases), and importing
        its client is ~0.1 s of every cold start (recovery time). It logs in as this
        service's own Redis user, which may touch only its own keys."""
        if self._redis is None:
            from redis.asyncio import Redis

            url = self.settings.redis_login(self.name)
            self._redis = Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        return self._redis

    async def _close_redis(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    def inbound(self, consumer: str, *, message_type: str = "unknown") -> Inbound:
        return Inbound(
            consumer=consumer,
            message_type=message_type,
            bus=self.bus,
            topology=self.topology,
            max_bytes=self.settings.max_message_bytes,
            user_id=self.user,
        )

    async def publish(self, message: Envelope) -> None:
        """Publish one message as this service (its own exchange), confirmed by the broker."""
        await send(self.bus, self.topology, message, user_id=self.user)

    def consume(
        self,
        message_type: str,
        adapter: TypeAdapter[Any],
        handle: Callable[[Any], Awaitable[None]],
    ) -> None:
        """Subscribe one handler to the queue of one inbound message type."""
        inbound = self.inbound(self.name, message_type=message_type)

        async def entrypoint(message: AbstractIncomingMessage) -> None:
            await inbound.receive(message, adapter, handle)

        self.bus.consume(self.topology.inbound_queue(message_type).name, entrypoint)

    def consume_parked(self, handle: Callable[[ParkedMessage], Awaitable[None]]) -> None:
        """Subscribe to the copies of parked messages (the ledger's). Acked once handled;
        a failure is retried up to the delivery limit, then the copy is dropped (the
        original stays parked, listed by `signoff dead-letters`)."""

        async def entrypoint(message: AbstractIncomingMessage) -> None:
            message_id = delivered_id(message)
            # Its lines name what the parked body says it is, its session included.
            logs.concerning_raw(message_id, message.body)
            try:
                parked = describe(message_id, message.body, message.headers, message.user_id)
                await handle(parked)
            except Exception:
                log.exception("handling a parked message's copy failed; it will be redelivered")
                await asyncio.sleep(0.5)
                await message.nack(requeue=True)
                return
            await message.ack()
            kind = parked.message_type if parked.message_type in PARKED_TYPES else "unreadable"
            DEAD_LETTERS.labels(kind, bounded(parked.reason)).inc()

        self.bus.consume(self.topology.parked_queue.name, entrypoint)

    async def serve(self, background: Callable[[], Coroutine[Any, Any, None]] | None = None) -> None:
        """Connect, consume until told to stop. The topology is `signoff setup`'s to declare."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGUSR1, self._write_statement_counts)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        async with AsyncExitStack() as stack:
            await self.expose()
            stack.push_async_callback(self.health.stop)
            try:
                await self.bus.connect()
            except Exception as error:
                raise Unreachable("RabbitMQ", address(self.settings.rabbitmq_url), error) from None
            stack.push_async_callback(self.bus.stop)
            stack.push_async_callback(self._close_redis)
            await self.bus.start()
            task = asyncio.create_task(background()) if background else None
            log.info("%s ready (namespace %s)", self.name, self.settings.namespace)
            waiter = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([t for t in (task, waiter) if t], return_when=asyncio.FIRST_COMPLETED)
            if task is not None and task in done:
                task.result()  # a background loop that dies takes the service down, loudly
            if task is not None:
                task.cancel()
            log.info("%s stopping", self.name)

    def on_reload(self, reread: Callable[[], None]) -> None:
        self.reloads.append(reread)

    def reload(self) -> None:
        """SIGHUP: read the service's files again; each keeps what it had when its new file is refused."""
        for reread in self.reloads:
            try:
                reread()
            except Exception:
                log.exception("%s could not reload", self.name)

    def _write_statement_counts(self) -> None:
        """`make bench` asks (SIGUSR1) how much SQL this process sent so far:
        <data_dir>/stats/<service>-<pid>.json, written whole (rename)."""
        # Only a process that uses the ledger has loaded its module (and counted anything).
        database = sys.modules.get("shared.ledger.database")
        counts = getattr(database, "STATEMENT_COUNTS", {})
        folder = self.settings.data_dir / "stats"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}-{os.getpid()}.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps({**counts, "written_at": time.time()}))
        partial.replace(path)


def prepare(settings: Settings, name: str) -> Runtime:
    configure_logging(settings, name)
    faults.arm(settings.faults, settings.data_dir)
    check_reachable(settings)
    return Runtime(settings, name)


def address(url: str) -> str:
    """host:port of a URL, as an error message names it."""
    if len(hosts := hosts_of(url)) > 1:
        return ",".join(hosts)
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or ''}"
