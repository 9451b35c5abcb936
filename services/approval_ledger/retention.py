"""Nothing is kept forever: the ledger deletes what is past its retention on a timer
(what goes, and why the inbox's horizon must exceed a redelivery's wait, is
shared/ledger/retention.py's). Any ledger replica may run it: each batch is one
statement on rows nothing will read again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("signoff.ledger")


async def sweep_forever(sweep_once: Callable[[], Awaitable[dict[str, int]]], every: float) -> None:
    while True:
        try:
            deleted = await sweep_once()
            if any(deleted.values()):
                log.info("retention: deleted %s", ", ".join(f"{n} {what}" for what, n in deleted.items() if n))
        except Exception:
            log.exception("retention sweep failed; retrying")
        await asyncio.sleep(every)
