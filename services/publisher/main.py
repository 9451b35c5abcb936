"""publisher entrypoint: relay the outbox, waking on NOTIFY (PostgreSQL) or a short poll (SQLite)."""

from __future__ import annotations

import asyncio
import logging
import zlib

import aio_pika
import httpx
from sqlalchemy.engine import make_url

from shared.ledger.database import create_engine, migrate, notify_channel, sessionmaker
from shared.runtime import Unreachable, _address, prepare
from shared.settings import Settings

from .hooks import HookDeliverer, load_hooks
from .relay import OutboxRelay

log = logging.getLogger("signoff.publisher")
# Only one publisher relays a ledger at a time, so per-session order holds with replicas.
LEADER_LOCK = 0x5160FE


async def run(settings: Settings) -> None:
    runtime = prepare(settings, "publisher")
    engine = create_engine(settings, pool_size=2)
    await migrate(engine, settings)
    try:
        connection = await aio_pika.connect_robust(settings.amqp_url)
    except Exception as error:
        raise Unreachable("RabbitMQ", _address(settings.rabbitmq_url), error) from None
    wake = asyncio.Event()
    listener = await _listen(settings, wake) if settings.is_postgres else None

    hooks = load_hooks(settings.hooks_file)

    async def relay_forever() -> None:
        channel = await connection.channel(publisher_confirms=True)
        relay = OutboxRelay(engine, channel, settings.publisher_batch, hooks)
        deliveries = asyncio.create_task(deliver_hooks_forever()) if hooks else None
        idle_wait = 1.0 if listener else settings.publisher_poll_seconds
        while True:
            wake.clear()
            try:
                sent = await relay.relay_once()
            except Exception as error:
                # Broker or database away (a closed channel, a dropped connection):
                # the rows stay unsent and go out, with the same ids, once it is back.
                log.warning("relay failed (%r); retrying", error)
                await asyncio.sleep(0.5)
                continue
            if deliveries is not None and deliveries.done():
                deliveries.result()
            if sent < relay.batch_size:
                try:
                    await asyncio.wait_for(wake.wait(), idle_wait)
                except TimeoutError:
                    pass

    async def deliver_hooks_forever() -> None:
        async with httpx.AsyncClient() as http:
            deliverer = HookDeliverer(sessionmaker(engine), hooks, http)
            while True:
                try:
                    await deliverer.deliver_due()
                except Exception:
                    log.exception("hook delivery loop")
                await asyncio.sleep(0.05)

    try:
        # serve() declares the topology before the relay starts, so nothing is routed to nowhere.
        await runtime.serve(relay_forever)
    finally:
        if listener is not None:
            await listener.close()
        await connection.close()
        await engine.dispose()


async def _listen(settings: Settings, wake: asyncio.Event):
    import asyncpg

    url = make_url(settings.ledger_url)
    connection = await asyncpg.connect(
        user=url.username, password=url.password, host=url.host or "localhost", port=url.port or 5432,
        database=url.database,
    )
    # Hold leadership for as long as this connection lives; a killed leader's lock goes with it.
    # A standby blocks in pg_advisory_lock and so takes over the moment the leader's
    # connection ends (PostgreSQL sees a SIGKILLed client's socket close at once).
    channel = notify_channel(settings)
    lock = LEADER_LOCK ^ zlib.crc32(channel.encode()) % 2**31
    if not await connection.fetchval("SELECT pg_try_advisory_lock($1)", lock):
        log.info("publisher standing by: another publisher is relaying this ledger; taking over when it stops")
        await connection.execute("SELECT pg_advisory_lock($1)", lock)
        log.info("publisher taking over the relay")
    await connection.add_listener(channel, lambda *_: wake.set())
    return connection
