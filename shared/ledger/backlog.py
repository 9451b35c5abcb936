"""What waits, measured on a timer for the operators' gauges: approval requests waiting
for a person (by tool, the oldest, the first to expire), outbox rows not yet relayed
(the relay's lag) and hook deliveries not yet delivered. One read-only transaction of
grouped queries every few seconds, on indexes the ledger keeps anyway, never on a
message's path. Every ledger replica measures the same rows; dashboards take the max
over replicas (services/approval_ledger/backlog.py sets the gauges; `signoff status`
shows the same measurement).

The pending requests are read by their indexes' shape, whatever their number
(this read used to join every pending row to its call every 5 seconds):
the count per tool is the sum of `pending_tally` (kept by triggers, migration 0015),
and each counted tool's oldest and first to expire are the heads of the partial
indexes `ix_approval_requests_pending_tool_age` / `_tool_expiry`. When the tally has
gathered more than `FOLD_AT` rows, the reading folds them into one per tool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import bindparam, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.ledger.tables import TABLES, from_the_first_unsent
from shared.observability import tool_label

REQUESTS = TABLES["approval_requests"]
CALLS = TABLES["tool_calls"]
OUTBOX = TABLES["outbox"]
HOOKS = TABLES["hook_deliveries"]

TALLY = TABLES["pending_tally"]
# The tally has one row per change since the last fold: fold past this many.
FOLD_AT = 64

_TALLY = select(TALLY.c.tool, func.sum(TALLY.c.delta), func.count()).group_by(TALLY.c.tool)
_waiting = REQUESTS.alias("waiting")


def _head(column):
    """The tool's first pending value of `column`: one entry of its partial index. ORDER BY
    + LIMIT 1, not min(): without statistics PostgreSQL may plan min() as an aggregate over
    every entry of the tool (a bitmap scan of all of them), where this reads the first."""
    return (
        select(column)
        .where(_waiting.c.status == "pending", _waiting.c.tool == bindparam("tool"), column.is_not(None))
        .order_by(column)
        .limit(1)
        .scalar_subquery()
    )


_HEADS = select(_head(_waiting.c.created_at), _head(_waiting.c.expires_at))
# From the first unsent row on, as the relay reads: the count walks no entry of the relayed history.
_UNSENT = select(func.count(), func.min(OUTBOX.c.created_at)).where(OUTBOX.c.sent_at.is_(None), from_the_first_unsent())
_UNDELIVERED = (
    select(HOOKS.c.hook, func.count(), func.min(HOOKS.c.created_at))
    .where(HOOKS.c.delivered_at.is_(None), HOOKS.c.given_up_at.is_(None))
    .group_by(HOOKS.c.hook)
)


def as_utc(value: datetime | str | None) -> datetime | None:
    # min() over a column loses its type on SQLite: it comes back as stored text.
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


@dataclass
class Backlog:
    """One measurement, as the gauges show it."""

    # tool -> (waiting, oldest created_at, soonest expires_at)
    pending: dict[str, tuple[int, datetime | None, datetime | None]] = field(default_factory=dict)
    unsent: int = 0
    oldest_unsent: datetime | None = None
    # hook -> (undelivered, oldest created_at)
    undelivered: dict[str, tuple[int, datetime | None]] = field(default_factory=dict)


async def fold(engine: AsyncEngine) -> None:
    """The tally's rows folded into one per tool. Deleting first takes exactly the rows
    it sums (each at most once, also with every replica folding at once: a row another
    fold deleted is skipped) and leaves any committed since to the next fold."""
    async with engine.begin() as conn:
        sums: dict[str | None, int] = {}
        for tool, delta in (await conn.execute(delete(TALLY).returning(TALLY.c.tool, TALLY.c.delta))).all():
            sums[tool] = sums.get(tool, 0) + delta
        rows = [{"tool": tool, "delta": delta} for tool, delta in sums.items() if delta]
        if rows:
            await conn.execute(insert(TALLY), rows)


async def measure(engine: AsyncEngine) -> Backlog:
    backlog = Backlog()
    changes = 0
    async with engine.connect() as conn:
        for tool, count, rows in (await conn.execute(_TALLY)).all():
            changes += rows
            if not count:
                continue
            oldest, soonest = (await conn.execute(_HEADS, {"tool": tool})).one()
            label = tool_label(tool)
            waiting, first, expiring = backlog.pending.get(label, (0, None, None))
            oldest, soonest = as_utc(oldest), as_utc(soonest)
            backlog.pending[label] = (
                waiting + count,
                min((t for t in (first, oldest) if t), default=None),
                min((t for t in (expiring, soonest) if t), default=None),
            )
        count, oldest = (await conn.execute(_UNSENT)).one()
        backlog.unsent, backlog.oldest_unsent = count, as_utc(oldest)
        for hook, count, oldest in (await conn.execute(_UNDELIVERED)).all():
            backlog.undelivered[hook] = (count, as_utc(oldest))
        await conn.rollback()
    if changes > FOLD_AT:
        await fold(engine)
    return backlog
