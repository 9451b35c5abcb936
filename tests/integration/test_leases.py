"""Executor leases in the real Redis: a fast path that keeps two live executors off one call."""

import asyncio
import uuid

from redis.asyncio import Redis

from services.tool_executor.leases import Leases
from tests.harness import REDIS_URL, require_services


async def test_a_held_lease_keeps_a_second_executor_off_until_released_or_lapsed():
    require_services(postgres=False)
    namespace = "t" + uuid.uuid4().hex[:12]
    async with Redis.from_url(REDIS_URL) as redis:
        first = Leases(redis, namespace, "executor-1", seconds=2)
        second = Leases(redis, namespace, "executor-2", seconds=2)
        assert await first.acquire("call_1")
        assert not await second.acquire("call_1")
        await second.release("call_1")  # not its lease: nothing happens
        assert not await second.acquire("call_1")
        await first.release("call_1")
        assert await second.acquire("call_1")
        await asyncio.sleep(2.5)  # the holder "died": its lease lapses
        assert await first.acquire("call_1")
        await redis.delete(f"{namespace}:lease:call_1")


async def test_without_redis_every_lease_is_granted_and_the_ledger_claim_decides():
    leases = Leases(Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2), "x", "e", seconds=1)
    assert await leases.acquire("call_1") and await leases.acquire("call_1")
    await leases.release("call_1")
