"""What one confirmed publish costs through each AMQP client path the code has had:
FastStream's `RabbitBroker.publish` and `shared.bus.Bus.publish` (aio-pika directly).
Each way publishes the same persistent 1 KB JSON message, as the connection's own user
and confirmed by the broker, one at a time (as a service publishes), to a quorum queue
of its own; several runs alternate the ways, and the medians are printed: this
process's CPU (user + system) per message and the messages per second.

    python -m tests.bench.publish_paths [RUNS] [MESSAGES]

It needs RabbitMQ at SIGNOFF_RABBITMQ_URL (the administrator's user: it declares and
deletes a queue of its own, `bench.publish-paths.<random>`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
from faststream.rabbit import RabbitBroker
from yarl import URL as YarlURL

from shared.amqp_hosts import split_hosts
from shared.bus import Bus

URL = split_hosts(os.environ.get("SIGNOFF_RABBITMQ_URL", "amqp://guest:guest@localhost:5672/"))[0]
USER = YarlURL(URL).user or "guest"
BODY = json.dumps({"type": "approval.respond", "padding": "x" * 960}).encode()

Publish = Callable[[str, int], Awaitable[None]]


def same_message(queue: str, n: int) -> dict[str, Any]:
    """What both ways publish: the services' message (persistent, its id, JSON, as the user)."""
    return {"exchange": "", "routing_key": queue, "message_id": f"msg_{n}", "content_type": "application/json",
            "user_id": USER}


async def faststream_way(queue: str, messages: int) -> None:
    broker = RabbitBroker(URL, log_level=logging.DEBUG)
    await broker.connect()
    try:
        for n in range(messages):
            await broker.publish(BODY, persist=True, mandatory=False, **same_message(queue, n))
    finally:
        await broker.stop()


async def bus_way(queue: str, messages: int) -> None:
    bus = Bus(URL, prefetch=1)
    await bus.connect()
    try:
        for n in range(messages):
            await bus.publish(BODY, **same_message(queue, n))  # persistent and not mandatory, always
    finally:
        await bus.stop()


async def measured(way: Publish, queue: str, messages: int) -> tuple[float, float]:
    """(CPU µs per message, messages per second), connecting and closing excluded by a
    warm-up of the same way first."""
    await way(queue, 50)
    cpu, wall = time.process_time(), time.perf_counter()
    await way(queue, messages)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / messages * 1e6, messages / wall


async def main(runs: int, messages: int) -> None:
    name = f"bench.publish-paths.{secrets.token_hex(4)}"
    connection = await aio_pika.connect(URL)
    channel = await connection.channel()
    queue = await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    ways: dict[str, Publish] = {"FastStream RabbitBroker.publish": faststream_way, "aio-pika Bus.publish": bus_way}
    results: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    try:
        for run in range(runs):
            for label, way in ways.items() if run % 2 == 0 else reversed(ways.items()):
                results[label].append(await measured(way, name, messages))
                await queue.purge()
    finally:
        await queue.delete(if_unused=False, if_empty=False)
        await connection.close()
    load = os.getloadavg()[0]
    print(f"{runs} runs of {messages} confirmed persistent 1 KB publishes each way, load average {load:.1f}")
    for label, figures in results.items():
        cpu = statistics.median(f[0] for f in figures)
        rate = statistics.median(f[1] for f in figures)
        each = ", ".join(f"{f[0]:.0f}" for f in figures)
        print(f"{label:<34} CPU {cpu:5.0f} µs/message ({each})  {rate:6.0f} messages/s")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, int(sys.argv[2]) if len(sys.argv) > 2 else 1500))
