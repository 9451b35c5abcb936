"""What waits, measured on a timer for the operators' gauges: approval requests waiting
for a person (by tool, the oldest, the first to expire), outbox rows not yet relayed
(the relay's lag) and hook deliveries not yet delivered. One read-only transaction of
three grouped queries every few seconds, on indexes the ledger keeps anyway
(`ix_approval_requests_due`, `ix_outbox_unsent`, `ix_hook_pending`): cheap beside the
traffic, and never on a message's path. Every ledger replica measures the same rows;
dashboards take the max over replicas (services/approval_ledger/backlog.py sets
the gauges; `signoff status` shows the same measurement)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.ledger.tables import TABLES
from shared.observability import tool_label

REQUESTS = TABLES["approval_requests"]
CALLS = TABLES["tool_calls"]
OUTBOX = TABLES["outbox"]
HOOKS = TABLES["hook_deliveries"]

_PENDING = (
    select(CALLS.c.tool, func.count(), func.min(REQUESTS.c.created_at), func.min(REQUESTS.c.expires_at))
    .select_from(REQUESTS.join(CALLS, CALLS.c.id == REQUESTS.c.call_id))
    .where(REQUESTS.c.status == "pending")
    .group_by(CALLS.c.tool)
)
_UNSENT = select(func.count(), func.min(OUTBOX.c.created_at)).where(OUTBOX.c.sent_at.is_(None))
_UNDELIVERED = (
    select(HOOKS.c.hook, func.count(), func.min(HOOKS.c.created_at))
    .where(HOOKS.c.delivered_at.is_(None), HOOKS.c.given_up_at.is_(None))
    .group_by(HOOKS.c.hook)
)


def _utc(value: datetime | str | None) -> datetime | None:
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


async def measure(engine: AsyncEngine) -> Backlog:
    backlog = Backlog()
    async with engine.connect() as conn:
        for tool, count, oldest, soonest in (await conn.execute(_PENDING)).all():
            label = tool_label(tool)
            waiting, first, expiring = backlog.pending.get(label, (0, None, None))
            oldest, soonest = _utc(oldest), _utc(soonest)
            backlog.pending[label] = (
                waiting + count,
                min((t for t in (first, oldest) if t), default=None),
                min((t for t in (expiring, soonest) if t), default=None),
            )
        count, oldest = (await conn.execute(_UNSENT)).one()
        backlog.unsent, backlog.oldest_unsent = count, _utc(oldest)
        for hook, count, oldest in (await conn.execute(_UNDELIVERED)).all():
            backlog.undelivered[hook] = (count, _utc(oldest))
        await conn.rollback()
    return backlog
