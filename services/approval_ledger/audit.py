"""The global audit chain, linked after commit on a timer: how a pass links the entries
no running transaction can still add to, on each database, is
shared/ledger/audit_chain.py's; any ledger replica may run it (the chain's head row
is locked while a pass links)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("signoff.ledger")


async def link_forever(link_once: Callable[[], Awaitable[int]], every: float) -> None:
    """Any ledger replica may run it: the head row's lock takes turns."""
    while True:
        try:
            await link_once()
        except Exception:
            # The database away, or SQLite busy: what is not linked now is linked next time.
            log.exception("audit linking failed; retrying")
        await asyncio.sleep(every)
