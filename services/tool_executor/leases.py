"""Leases in Redis: the fast way to keep two live executors off one call.

Only a fast path (invariant 8): the durable claim in the ledger decides what
runs. With Redis flushed or down, every lease is simply granted and the claim
does all the work, a little slower. A Redis that refuses the executor's user is no
outage (shared/redis_access.py): an error, and the executor is not ready.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from shared.redis_access import FIX, refused

log = logging.getLogger("signoff.leases")

# Delete the lease only if this holder still has it.
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
)


class Leases:
    def __init__(self, redis: Redis | None, namespace: str, holder: str, seconds: float) -> None:
        self.redis = redis
        self.namespace = namespace
        self.holder = holder
        self.ttl_ms = int(seconds * 1000)

    def _key(self, call_id: str) -> str:
        return f"{self.namespace}:lease:{call_id}"

    async def acquire(self, call_id: str) -> bool:
        """False only when another live executor holds the call."""
        if self.redis is None:
            return True
        try:
            return bool(await self.redis.set(self._key(call_id), self.holder, nx=True, px=self.ttl_ms))
        except Exception as error:
            _unavailable(error, "the ledger claim decides alone")
            return True

    async def renew(self, call_id: str) -> None:
        await self._script(_RENEW, call_id, self.ttl_ms)

    async def release(self, call_id: str) -> None:
        await self._script(_RELEASE, call_id)

    async def _script(self, script: str, call_id: str, *args) -> None:
        if self.redis is None:
            return
        try:
            await self.redis.eval(script, 1, self._key(call_id), self.holder, *args)
        except Exception as error:
            _unavailable(error, "")


def _unavailable(error: Exception, meanwhile: str) -> None:
    if refused(error):
        log.error("redis refuses the executor's user for leases (%s); %s", error, FIX)
    else:
        log.warning("redis unavailable for leases (%s)%s", error, f"; {meanwhile}" if meanwhile else "")
