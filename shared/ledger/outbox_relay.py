"""The publisher's reads and marks of the outbox (services/publisher/relay.py): the oldest
unsent rows with the leader's epoch, and marking a batch sent, fenced by that epoch and
with its hook deliveries beside it. The publisher's only crossing into `outbox`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlalchemy import bindparam, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.ledger import driver
from shared.ledger.database import STATEMENT_COUNTS
from shared.ledger.leadership import EPOCH, LEADER_ROW
from shared.ledger.tables import TABLES, from_the_first_unsent

OUTBOX = TABLES["outbox"]
# Built once: the relay runs them for every batch.
_UNSENT = (
    select(
        OUTBOX.c.id,
        OUTBOX.c.message_id,
        OUTBOX.c.message_type,
        OUTBOX.c.exchange,
        OUTBOX.c.routing_key,
        OUTBOX.c.body,
        # The leader's epoch as this read saw it, at no extra round trip: a leader already
        # replaced publishes nothing it read after its successor took the lead.
        EPOCH.scalar_subquery().label("epoch"),
    )
    .where(
        OUTBOX.c.sent_at.is_(None),
        # The same rows, read from the first unsent one on, not from every entry relayed since the last VACUUM.
        from_the_first_unsent(),
    )
    .order_by(OUTBOX.c.id)
    .limit(bindparam("batch_size"))
)
_MARK_SENT = (
    update(OUTBOX).where(OUTBOX.c.id.in_(bindparam("ids", expanding=True))).values(sent_at=bindparam("sent_at"))
)
# A leader's mark-sent when no hook wants deliveries written beside it: the fence
# (`Leadership.fence`: the epoch read FOR SHARE) and the UPDATE in one statement, which
# asyncpg autocommits: one round trip instead of SQLAlchemy's BEGIN, SELECT, UPDATE and
# COMMIT. The rows are marked only while the epoch is still the one this leader took;
# either way the epoch it saw comes back, for `Leadership.check`.
_MARK_SENT_FENCED = text(
    "WITH leader AS (SELECT epoch FROM publisher_leader WHERE id = :leader_row FOR SHARE),"
    " marked AS (UPDATE outbox SET sent_at = :sent_at WHERE id = ANY(:ids)"
    " AND (SELECT epoch FROM leader) = :epoch RETURNING 1)"
    " SELECT (SELECT epoch FROM leader) AS epoch, (SELECT count(*) FROM marked) AS marked"
)


async def unsent(
    engine: AsyncEngine, batch_size: int, idle_check: Callable[[int | None], None] | None = None
) -> Sequence[Any]:
    """The oldest unsent rows, in id order, each with the leader's epoch as the read saw
    it. `idle_check`: a leader's, given the epoch when there is nothing to send (a leader
    whose lock connection died unnoticed learns it there)."""
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            # Straight on asyncpg, outside a transaction: one round trip instead of
            # SQLAlchemy's BEGIN, SELECT and ROLLBACK (one statement sees one snapshot).
            raw = await driver.driver_of(conn)
            rows = await driver.fetch(conn, _UNSENT, {"batch_size": batch_size}, raw=raw)
            if idle_check is not None and not rows:
                # Idle: still the leader?
                epoch = await driver.fetch(conn, EPOCH, {}, raw=raw)
                idle_check(epoch[0].epoch if epoch else None)
            return rows
        found = (await conn.execute(_UNSENT, {"batch_size": batch_size})).all()
        await conn.rollback()
        return found


async def mark_sent_fenced(engine: AsyncEngine, ids: list[int], sent_at: Any, epoch: int) -> int | None:
    """A leader's mark-sent with no deliveries beside it, in one autocommitted statement:
    the rows are marked only while the epoch is still `epoch`; the epoch it saw."""
    marking = {"leader_row": LEADER_ROW, "ids": ids, "sent_at": sent_at}
    async with engine.connect() as conn:
        marked = await driver.fetch(conn, _MARK_SENT_FENCED, {**marking, "epoch": epoch})
    STATEMENT_COUNTS["commits"] += 1  # autocommitted
    return marked[0].epoch if marked else None


async def mark_sent(
    engine: AsyncEngine,
    ids: list[int],
    sent_at: Any,
    deliveries: list[dict[str, Any]],
    fence: Callable[[Any], Awaitable[None]] | None = None,
) -> None:
    """Mark the rows sent and add their hook deliveries in one transaction; `fence`, a
    leader's, runs first in it and raises to roll it back."""
    async with engine.begin() as conn:
        if fence is not None:
            await fence(conn)
        await conn.execute(_MARK_SENT, {"ids": ids, "sent_at": sent_at})
        if deliveries:
            await conn.execute(insert(TABLES["hook_deliveries"]), deliveries)
