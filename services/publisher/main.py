"""publisher entrypoint: lead (or stand by), then relay the outbox and deliver hooks;
when it no longer leads, stop both and stand by again (services/publisher/leadership.py)."""

from __future__ import annotations

import asyncio
import logging
from functools import partial

import aio_pika
import httpx

from shared.amqp_hosts import connect_robust
from shared.ledger.database import create_engine, database_reachable, migrate, sessionmaker
from shared.ledger.leadership import publishers_take_turns
from shared.observability import PUBLISHER_LEADING
from shared.runtime import Unreachable, address, prepare
from shared.settings import Settings

from .hooks import HookDeliverer, deliver_hooks_forever, load_hooks
from .leadership import Leadership, LeadershipLost, lead, lead_again, only_relay
from .relay import OutboxRelay
from .settings import PublisherSettings

log = logging.getLogger("signoff.publisher")


async def run(settings: Settings) -> None:
    runtime = prepare(settings, "publisher")
    # Up before the lead is taken: a standby waits in `lead` for as long as the leader lives.
    await runtime.expose()
    # The shared settings as given, plus the publisher's own from the environment.
    config = PublisherSettings(**settings.model_dump())
    # First: a hook without a usable secret stops the publisher before it does anything.
    hooks = load_hooks(settings.hooks_file)
    # SQLite: exactly one publisher; a second refuses to start, naming the first.
    relay_lock = None if publishers_take_turns(settings) else only_relay(settings)
    engine = create_engine(settings, identity="publisher", pool_size=2)
    await migrate(engine, settings)
    try:
        connection = await connect_robust(runtime.amqp_url)
    except Exception as error:
        raise Unreachable("RabbitMQ", address(settings.rabbitmq_url), error) from None
    # Its relay's own connection is what it needs (a standby has no other yet).
    runtime.health.add("broker", partial(_connected, connection))
    runtime.health.add("database", partial(database_reachable, engine))
    wake = asyncio.Event()
    PUBLISHER_LEADING.set(0)
    # Before serving: a standby says "standing by" and waits here; "ready" means leading.
    leadership: Leadership | None = await lead(settings, wake) if publishers_take_turns(settings) else None
    PUBLISHER_LEADING.set(1)

    async def relay() -> None:
        nonlocal leadership
        channel = await connection.channel(publisher_confirms=True)
        # Room for every hook's deliveries in flight: none waits for another's connection.
        limits = httpx.Limits(max_connections=max(1, config.hook_concurrency * len(hooks)))
        async with httpx.AsyncClient(limits=limits) as http:
            while True:
                relay = OutboxRelay(engine, channel, runtime.user, settings.publisher_batch, hooks, leadership)
                deliverer = HookDeliverer(
                    sessionmaker(engine), hooks, http, leadership, config.hook_max_attempts, config.hook_concurrency
                )
                deliveries = asyncio.create_task(deliver_hooks_forever(deliverer))
                try:
                    await relay.relay_forever(wake, 1.0 if leadership else settings.publisher_poll_seconds, deliveries)
                except LeadershipLost as lost:
                    log.warning("publisher lost the lead (%s): relaying stopped", lost)
                finally:
                    deliveries.cancel()
                    await asyncio.gather(deliveries, return_exceptions=True)
                    await deliverer.stop()
                assert leadership is not None  # only a leader's relay loses its lead
                await leadership.close()
                leadership = None
                PUBLISHER_LEADING.set(0)
                leadership = await lead_again(settings, wake)
                PUBLISHER_LEADING.set(1)

    try:
        # serve() declares the topology before the relay starts, so nothing is routed to nowhere.
        await runtime.serve(relay)
    finally:
        if leadership is not None:
            await leadership.close()
        await connection.close()
        await engine.dispose()
        if relay_lock is not None:
            relay_lock.close()


async def _connected(connection: aio_pika.abc.AbstractRobustConnection) -> bool:
    return connection.connected.is_set()
