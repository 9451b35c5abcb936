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
# A leader's read of the next unsent rows, leaving out `skip` (published, not yet marked
# sent), and, when `mark` is given, its mark-sent of those rows fenced as
# `Leadership.fence` does (the epoch read FOR SHARE, the UPDATE only while it is still
# this leader's; either way the epoch it saw comes back, for `Leadership.check`): in one
# autocommitted statement (one round trip, one write transaction for however many
# batches it marks). The read's snapshot does not see the
# UPDATE's own effect, hence the ids left out. One row always comes back, with the epoch
# as the read saw it (no unsent row: the other columns null). Without marks the epoch is
# read without FOR SHARE: a row lock would make every read a write transaction.
_NEXT_UNSENT = (
    " SELECT (SELECT epoch FROM leader) AS epoch,"
    " next.id, next.message_id, next.message_type, next.exchange, next.routing_key, next.body"
    " FROM (SELECT 1) AS one LEFT JOIN LATERAL ("
    "SELECT id, message_id, message_type, exchange, routing_key, body FROM outbox"
    " WHERE sent_at IS NULL AND id <> ALL(:skip)"
    " AND id >= (SELECT min(first_unsent.id) FROM outbox AS first_unsent WHERE first_unsent.sent_at IS NULL)"
    " ORDER BY id LIMIT :batch_size) AS next ON true"
    " ORDER BY next.id"
)
_MARK_AND_READ = text(
    "WITH leader AS (SELECT epoch FROM publisher_leader WHERE id = :leader_row FOR SHARE),"
    " marked AS (UPDATE outbox SET sent_at = :sent_at WHERE id = ANY(:skip)"
    " AND (SELECT epoch FROM leader) = :epoch RETURNING 1)" + _NEXT_UNSENT
)
_READ_NEXT = text("WITH leader AS (SELECT epoch FROM publisher_leader WHERE id = :leader_row)" + _NEXT_UNSENT)


async def mark_and_read(
    engine: AsyncEngine, skip: list[int], mark: bool, sent_at: Any, epoch: int, batch_size: int
) -> tuple[int | None, list[Any]]:
    """A PostgreSQL leader's read of the next unsent rows but `skip`, and with `mark` its
    mark-sent of `skip` (only while the epoch is still `epoch`), in one statement: (the
    epoch it saw, the rows)."""
    marking = {"leader_row": LEADER_ROW, "skip": skip, "batch_size": batch_size}
    if mark:
        marking |= {"sent_at": sent_at, "epoch": epoch}
    async with engine.connect() as conn:
        found = await driver.fetch(conn, _MARK_AND_READ if mark else _READ_NEXT, marking)
    if mark:
        STATEMENT_COUNTS["commits"] += 1  # autocommitted
    seen = found[0].epoch if found else None
    return seen, [row for row in found if row.id is not None]


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
