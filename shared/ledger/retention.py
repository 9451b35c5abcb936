"""Nothing is kept forever: sent outbox rows, inbox rows past the redelivery horizon
and delivered or given-up hook rows are deleted after their retention, in small batches.

Each batch is one statement on rows nothing will read again: a sweep killed
half-way and run again deletes the rest, and one running on every ledger replica
at once only does the same work twice. Inbox rows are the ledger's memory of what
it applied (invariant 8): past the horizon a redelivery of such a message would be
applied again, so the horizon must exceed how long a message can wait in a queue
after it was applied (seconds, in practice: the redelivery after a crash between
commit and ack).

The ledger runs the sweep on a timer (services/approval_ledger/retention.py).
The audit log (`audit_log`, `audit_chain`) is never swept: it is the record, and on
PostgreSQL the ledger's role may not delete from it anyway (shared/ledger/roles.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.elements import BindParameter

from shared.ledger.backlog import as_utc
from shared.ledger.tables import TABLES
from shared.messages import now

OUTBOX, INBOX, HOOKS = TABLES["outbox"], TABLES["inbox"], TABLES["hook_deliveries"]
BATCH = 500
_CUT: BindParameter[Any] = bindparam("cut")
_LIMIT: BindParameter[Any] = bindparam("limit")
# (what, statement): each deletes one batch of rows past their time. The outbox's and the
# inbox's are read oldest first along an index on their time (`ix_outbox_unsent`,
# `ix_inbox_received`, migration 0015): a sweep with nothing past its time reads one
# index entry, not every row kept, whatever the planner's statistics say.
_SWEEPS = (
    (
        "sent outbox rows",
        delete(OUTBOX).where(
            OUTBOX.c.id.in_(
                select(OUTBOX.c.id)
                .where(OUTBOX.c.sent_at.is_not(None), OUTBOX.c.sent_at < _CUT)
                .order_by(OUTBOX.c.sent_at)
                .limit(_LIMIT)
                .scalar_subquery()
            )
        ),
    ),
    (
        "inbox rows",
        delete(INBOX).where(
            INBOX.c.message_id.in_(
                select(INBOX.c.message_id)
                .where(INBOX.c.received_at < _CUT)
                .order_by(INBOX.c.received_at)
                .limit(_LIMIT)
                .scalar_subquery()
            )
        ),
    ),
    (
        "delivered or given-up hook rows",
        delete(HOOKS).where(
            HOOKS.c.id.in_(
                select(HOOKS.c.id)
                .where(or_(HOOKS.c.delivered_at < _CUT, HOOKS.c.given_up_at < _CUT))
                .limit(_LIMIT)
                .scalar_subquery()
            )
        ),
    ),
)

# The oldest row each of those sweeps could delete: the head of the same index, read
# first, so a sweep with nothing past its time costs one index entry however many rows
# are kept (the planner, without fresh statistics, may still scan for the DELETE's own
# subquery; min() over an index it takes by shape).
_OLDEST = {
    "sent outbox rows": select(func.min(OUTBOX.c.sent_at)).where(OUTBOX.c.sent_at.is_not(None)),
    "inbox rows": select(func.min(INBOX.c.received_at)),
}


def _passed(oldest: datetime | str | None, cut: datetime) -> bool:
    oldest = as_utc(oldest)
    return oldest is not None and oldest < cut


@dataclass(frozen=True)
class Retention:
    outbox: timedelta
    inbox: timedelta
    hooks: timedelta

    def cutoffs(self) -> tuple[timedelta, ...]:
        return (self.outbox, self.inbox, self.hooks)


async def sweep_once(engine: AsyncEngine, retention: Retention) -> dict[str, int]:
    """Delete what is past its retention; how many rows of each kind went."""
    deleted = {}
    at = now()
    for (what, statement), keep in zip(_SWEEPS, retention.cutoffs(), strict=True):
        total = 0
        if what in _OLDEST:
            async with engine.connect() as conn:
                if not _passed((await conn.execute(_OLDEST[what])).scalar(), at - keep):
                    deleted[what] = 0
                    continue
        while True:
            async with engine.begin() as conn:
                gone = (await conn.execute(statement, {"cut": at - keep, "limit": BATCH})).rowcount
            total += gone
            if gone < BATCH:
                break
        deleted[what] = total
    return deleted
