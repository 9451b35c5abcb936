"""The publisher's reads and writes of `hook_deliveries` (services/publisher/hooks.py):
a hook's due deliveries, an attempt's outcome, and giving up a removed hook's pending
ones. Every write runs `fence` (a leader's, `Leadership.fence`) first in its transaction.
The deliveries themselves are added beside the mark-sent (shared/ledger/outbox_relay.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import async_sessionmaker

from shared.ledger.tables import HookDelivery
from shared.messages import now

# Where the deliveries are read and written: the publisher's sessions (shared/ledger/database.py).
Sessions = async_sessionmaker
Fence = Callable[[Any], Awaitable[None]] | None


async def give_up_removed(sessions: Sessions, configured: list[str], fence: Fence = None) -> list[tuple[str, int]]:
    """Give up, as `hook_removed`, the pending deliveries of every hook not in `configured`;
    how many, per hook."""
    pending = (
        HookDelivery.delivered_at.is_(None),
        HookDelivery.given_up_at.is_(None),
        HookDelivery.hook.not_in(configured),
    )
    async with sessions() as db, db.begin():
        if fence is not None:
            await fence(db)
        removed = (await db.execute(select(HookDelivery.hook, func.count()).where(*pending).group_by("hook"))).all()
        if removed:
            await db.execute(
                update(HookDelivery).where(*pending).values(given_up_at=now(), given_up_reason="hook_removed")
            )
    return [(hook, count) for hook, count in removed]


class DueDeliveries:
    """One read of due deliveries, hook after hook (one session for them all)."""

    def __init__(self, sessions: Sessions) -> None:
        self._sessions = sessions

    async def __aenter__(self) -> DueDeliveries:
        self._db = self._sessions()
        await self._db.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._db.__aexit__(*exc)

    async def of(self, hook: str, at: datetime, room: int, busy: set[str]) -> list[HookDelivery]:
        """`hook`'s deliveries due at `at`, oldest due first, at most `room`, none of `busy`."""
        query = (
            select(HookDelivery)
            .where(
                HookDelivery.hook == hook,
                HookDelivery.delivered_at.is_(None),
                HookDelivery.given_up_at.is_(None),
                HookDelivery.next_attempt_at <= at,
            )
            .order_by(HookDelivery.next_attempt_at)
            .limit(room)
        )
        if busy:
            query = query.where(HookDelivery.id.not_in(busy))
        return list((await self._db.scalars(query)).all())


async def record_attempt(sessions: Sessions, delivery_id: str, values: dict[str, Any], fence: Fence = None) -> None:
    """Write an attempt's outcome on its delivery's row."""
    async with sessions() as db, db.begin():
        if fence is not None:
            await fence(db)
        await db.execute(update(HookDelivery).where(HookDelivery.id == delivery_id).values(**values))
