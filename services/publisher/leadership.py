"""Which publisher relays: only one at a time per ledger, so per-session order
holds with replicas. On PostgreSQL the leader holds an advisory lock on the
connection it also LISTENs on; SQLite runs on one machine with one publisher."""

from __future__ import annotations

import asyncio
import logging
import zlib

from sqlalchemy.engine import make_url

from shared.ledger.database import notify_channel
from shared.settings import Settings

log = logging.getLogger("signoff.publisher")
LEADER_LOCK = 0x5160FE


async def lead(settings: Settings, wake: asyncio.Event):
    """Become the leader (waiting as a standby while another leads), then wake on
    every NOTIFY; return the connection, whose life is the leadership."""
    import asyncpg

    url = make_url(settings.database_login("publisher"))
    connection = await asyncpg.connect(
        user=url.username,
        password=url.password,
        host=url.host or "localhost",
        port=url.port or 5432,
        database=url.database,
    )
    # Hold leadership for as long as this connection lives; a killed leader's lock goes with it.
    # A standby blocks in pg_advisory_lock and so takes over the moment the leader's
    # connection ends (PostgreSQL sees a SIGKILLed client's socket close at once).
    channel = notify_channel(settings)
    assert channel is not None
    lock = LEADER_LOCK ^ zlib.crc32(channel.encode()) % 2**31
    if not await connection.fetchval("SELECT pg_try_advisory_lock($1)", lock):
        log.info("publisher standing by: another publisher is relaying this ledger; taking over when it stops")
        await connection.execute("SELECT pg_advisory_lock($1)", lock)
        log.info("publisher taking over the relay")
    await connection.add_listener(channel, lambda *_: wake.set())
    return connection
