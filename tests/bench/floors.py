"""The floors: what PostgreSQL and RabbitMQ alone do on this machine, the figures
`pg limit` and `mq limit` divide by."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import asyncpg

from shared.amqp_hosts import split_hosts
from tests.bench.report import Progress
from tests.harness import POSTGRES_URL, RABBITMQ_URL


async def postgres_floor(schema: str, seconds: float, connections: int = 16) -> dict[str, Any]:
    setup = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    await setup.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, v integer NOT NULL, "
                        "at timestamptz NOT NULL DEFAULT now())")
    pool = [await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema}) for _ in range(connections)]
    done = 0
    deadline = time.time() + seconds

    async def worker(db: asyncpg.Connection) -> None:
        nonlocal done
        insert = await db.prepare("INSERT INTO bench_floor (v) VALUES ($1)")
        while time.time() < deadline:
            async with db.transaction():
                await insert.fetch(1)
            done += 1

    try:
        started = time.time()
        async with Progress("floor: postgres", lambda e: f"{connections} connections: {done:7d} commits  "
                                                         f"{e:4.1f}/{seconds:.0f} s"):
            await asyncio.gather(*(worker(db) for db in pool))
        elapsed = time.time() - started
    finally:
        for db in pool:
            await db.close()
        await setup.execute("DROP TABLE IF EXISTS bench_floor")
        await setup.close()
    return {"connections": connections, "commits": done, "seconds": elapsed, "commits_per_second": done / elapsed}


async def rabbitmq_floor(namespace: str, seconds: float, publishers: int = 16, size: int = 1024,
                         queue_type: str = "quorum") -> dict[str, Any]:
    name = f"{namespace}.bench-floor"
    # A cluster's URL (several hosts): both on its first node, the queue replicated to the others.
    publishing = await aio_pika.connect(split_hosts(RABBITMQ_URL)[0])
    consuming = await aio_pika.connect(split_hosts(RABBITMQ_URL)[0])
    published = consumed = 0
    body = b"x" * size
    try:
        channel = await publishing.channel(publisher_confirms=True)
        consumer_channel = await consuming.channel()
        await consumer_channel.set_qos(prefetch_count=64)
        queue = await consumer_channel.declare_queue(name, durable=True, arguments={"x-queue-type": queue_type})
        all_consumed = asyncio.Event()
        stop_publishing = False

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal consumed
            await message.ack()
            consumed += 1
            if stop_publishing and consumed >= published:
                all_consumed.set()

        consumer_tag = await queue.consume(on_message)
        deadline = time.time() + seconds

        async def publisher() -> None:
            nonlocal published
            while time.time() < deadline:
                await channel.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=name)
                published += 1

        started = time.time()
        async with Progress("floor: rabbitmq", lambda e: f"{publishers} publishers: {consumed:7d} consumed  "
                                                         f"{e:4.1f}/{seconds:.0f} s"):
            await asyncio.gather(*(publisher() for _ in range(publishers)))
            stop_publishing = True
            if consumed < published:
                await asyncio.wait_for(all_consumed.wait(), 30)
        elapsed = time.time() - started
        # Cancelled before the queue goes: deleting a queue under its consumer makes the
        # broker cancel it, which aiormq reports as a warning on stderr.
        await queue.cancel(consumer_tag)
    finally:
        try:
            cleanup = await consuming.channel()
            await cleanup.queue_delete(name)
        except Exception:  # noqa: BLE001 - best effort; the namespace is removed at the end anyway
            pass
        await publishing.close()
        await consuming.close()
    return {"publishers": publishers, "message_bytes": size, "queue_type": queue_type, "published": published,
            "consumed": consumed, "seconds": elapsed, "messages_per_second": consumed / elapsed}
