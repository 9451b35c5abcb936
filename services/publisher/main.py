"""publisher entrypoint: lead (or stand by), then relay the outbox and deliver hooks."""

from __future__ import annotations

import asyncio

import aio_pika
import httpx

from shared.ledger.database import create_engine, migrate, sessionmaker
from shared.runtime import Unreachable, address, prepare
from shared.settings import Settings

from .hooks import HookDeliverer, deliver_hooks_forever, load_hooks
from .leadership import lead
from .relay import OutboxRelay


async def run(settings: Settings) -> None:
    runtime = prepare(settings, "publisher")
    engine = create_engine(settings, identity="publisher", pool_size=2)
    await migrate(engine, settings)
    try:
        connection = await aio_pika.connect_robust(runtime.amqp_url)
    except Exception as error:
        raise Unreachable("RabbitMQ", address(settings.rabbitmq_url), error) from None
    wake = asyncio.Event()
    leadership = await lead(settings, wake) if settings.is_postgres else None
    hooks = load_hooks(settings.hooks_file)

    async def relay() -> None:
        channel = await connection.channel(publisher_confirms=True)
        relay = OutboxRelay(engine, channel, runtime.user, settings.publisher_batch, hooks)
        async with httpx.AsyncClient() as http:
            deliveries = None
            if hooks:
                deliveries = asyncio.create_task(
                    deliver_hooks_forever(HookDeliverer(sessionmaker(engine), hooks, http))
                )
            await relay.relay_forever(wake, 1.0 if leadership else settings.publisher_poll_seconds, deliveries)

    try:
        # serve() declares the topology before the relay starts, so nothing is routed to nowhere.
        await runtime.serve(relay)
    finally:
        if leadership is not None:
            await leadership.close()
        await connection.close()
        await engine.dispose()
