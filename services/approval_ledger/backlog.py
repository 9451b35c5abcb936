"""What waits, shown on the operators' gauges: the ledger measures it on a timer
(shared/ledger/backlog.py's one read-only transaction) and sets the gauges here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

from shared.ledger.backlog import Backlog
from shared.messages import now
from shared.observability import (
    APPROVALS_PENDING,
    BACKLOG_MEASURED,
    HOOKS_UNDELIVERED,
    OLDEST_PENDING,
    OLDEST_UNDELIVERED,
    OUTBOX_UNSENT,
    RELAY_LAG,
    SOONEST_EXPIRY,
    known_tools,
)

log = logging.getLogger("signoff.ledger")


def show(backlog: Backlog, at: datetime) -> None:
    """Set the gauges: every tool of the catalogue shows its count, 0 when none waits; a
    hook with nothing undelivered disappears. Cleared and set again with no await
    between: a scrape never sees them half-set."""
    for gauge in (APPROVALS_PENDING, OLDEST_PENDING, SOONEST_EXPIRY, HOOKS_UNDELIVERED, OLDEST_UNDELIVERED):
        gauge.clear()
    for tool in known_tools() - backlog.pending.keys():
        APPROVALS_PENDING.labels(tool).set(0)
        OLDEST_PENDING.labels(tool).set(0)
    for tool, (waiting, oldest, soonest) in backlog.pending.items():
        APPROVALS_PENDING.labels(tool).set(waiting)
        OLDEST_PENDING.labels(tool).set((at - oldest).total_seconds() if oldest else 0)
        if soonest is not None:
            SOONEST_EXPIRY.labels(tool).set((soonest - at).total_seconds())
    OUTBOX_UNSENT.set(backlog.unsent)
    RELAY_LAG.set(max(0.0, (at - backlog.oldest_unsent).total_seconds()) if backlog.oldest_unsent else 0)
    for hook, (count, oldest) in backlog.undelivered.items():
        HOOKS_UNDELIVERED.labels(hook).set(count)
        OLDEST_UNDELIVERED.labels(hook).set(max(0.0, (at - oldest).total_seconds()) if oldest else 0)
    BACKLOG_MEASURED.set(time.time())


async def measure_forever(measure: Callable[[], Awaitable[Backlog]], every: float) -> None:
    """Forever: measure and show. A failed measurement (the database away) keeps the
    last values; `signoff_backlog_measured_timestamp_seconds` tells how old they are."""
    while True:
        try:
            show(await measure(), now())
        except Exception as error:
            log.warning("measuring the backlog failed (%r); retrying", error)
        await asyncio.sleep(every)
