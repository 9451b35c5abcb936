"""The publisher's leadership on the database (services/publisher/leadership.py says why
and how): the advisory lock and its connection, the epoch taken with it, the fence every
leader's write reads, and, on SQLite, where the one publisher's lock file lives. The
publisher's only crossing into `publisher_leader`."""

from __future__ import annotations

import contextlib
import logging
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.engine import make_url

from shared.ledger.database import notify_channel
from shared.ledger.tables import TABLES
from shared.settings import Settings

log = logging.getLogger("signoff.publisher")
Term = TypeVar("Term")
LEADER_LOCK = 0x5160FE
LEADER = TABLES["publisher_leader"]
# The one row of publisher_leader.
LEADER_ROW = 1
# Taken on the lock's own connection, once it holds the lock.
_TAKE_EPOCH = "UPDATE publisher_leader SET epoch = epoch + 1, holder = $1, since = now() WHERE id = 1 RETURNING epoch"
# Read in every write transaction of a leader: FOR SHARE, so that a successor's increment
# (which takes the row's update lock) waits for the transaction and every later one sees it.
_FENCE = select(LEADER.c.epoch).where(LEADER.c.id == LEADER_ROW).with_for_update(read=True)
EPOCH = select(LEADER.c.epoch).where(LEADER.c.id == LEADER_ROW)


def publishers_take_turns(settings: Settings) -> bool:
    """PostgreSQL: publishers take turns leading (a standby waits for the lock); SQLite:
    exactly one publisher, which holds the ledger's relay lock file (`relay_lock_file`)."""
    return settings.is_postgres


def relay_lock_file(settings: Settings) -> Path:
    """The SQLite ledger's relay lock: a file beside the ledger's."""
    ledger = Path(make_url(settings.ledger_url).database or "")
    return ledger.with_name(ledger.name + ".publisher.lock")


def leader_lock(settings: Settings) -> int:
    """The advisory lock key of this ledger's relay (one per notify channel, so per schema)."""
    channel = notify_channel(settings)
    assert channel is not None
    return LEADER_LOCK ^ zlib.crc32(channel.encode()) % 2**31


async def fenced_epoch(conn: Any) -> int | None:
    """Inside a write transaction (a Connection or Session): the epoch, read FOR SHARE."""
    return (await conn.execute(_FENCE)).scalar()


def _where(url: Any) -> dict[str, Any]:
    """asyncpg's host and port arguments for the URL: its one host, or (a primary and its
    standby, shared/settings.py:several_hosts) every `host=` of its query, with its
    target_session_attrs, so after a promotion the lock is taken on the new primary."""
    hosts = url.query.get("host")
    if not hosts:
        return {"host": url.host or "localhost", "port": url.port or 5432}
    hosts = [hosts] if isinstance(hosts, str) else list(hosts)
    where: dict[str, Any] = {
        "host": [h.rpartition(":")[0] if ":" in h else h for h in hosts],
        "port": [int(h.rpartition(":")[2]) if ":" in h else 5432 for h in hosts],
    }
    if attrs := url.query.get("target_session_attrs"):
        where["target_session_attrs"] = attrs
    return where


async def take_the_lead(
    settings: Settings,
    holder: str,
    term: Callable[[Any, int], Term],
    on_end: Callable[[Term], None],
    on_notify: Callable[[], None],
) -> Term:
    """Hold the relay's advisory lock on a connection of its own (waiting as a standby
    while another holds it) and take the next epoch on it; then `term(connection, epoch)`
    is the term, `on_end(term)` is called once that connection ends (however it ends), and
    `on_notify()` on every NOTIFY of the outbox. On any failure the connection is dropped."""
    import asyncpg

    url = make_url(settings.database_login("publisher"))
    server_settings = {
        # Operators (and tests) can find the lock's connection: pg_stat_activity.application_name.
        "application_name": f"{settings.namespace} publisher {os.getpid()} leader lock"[:63],
        # A leader whose host vanished without closing its socket frees the lock within
        # about half a minute, not after the kernel's two hours of keepalive silence.
        "tcp_keepalives_idle": "10",
        "tcp_keepalives_interval": "5",
        "tcp_keepalives_count": "3",
    }
    if settings.database_schema:
        server_settings["search_path"] = settings.database_schema
    connection = await asyncpg.connect(
        user=url.username,
        password=url.password,
        database=url.database,
        server_settings=server_settings,
        **_where(url),
    )
    try:
        # Hold leadership for as long as this connection lives; a killed leader's lock goes with it.
        # A standby blocks in pg_advisory_lock and so takes over the moment the leader's
        # connection ends (PostgreSQL sees a SIGKILLed client's socket close at once).
        channel = notify_channel(settings)
        assert channel is not None
        lock = leader_lock(settings)
        if not await connection.fetchval("SELECT pg_try_advisory_lock($1)", lock):
            log.info("publisher standing by: another publisher is relaying this ledger; taking over when it stops")
            await connection.execute("SELECT pg_advisory_lock($1)", lock)
            log.info("publisher taking over the relay")
        # Waits for any write of a deposed leader still in flight (it holds the row FOR SHARE).
        epoch = await connection.fetchval(_TAKE_EPOCH, holder)
        if epoch is None:
            raise RuntimeError("publisher_leader has no row 1: the ledger's migrations did not run to the end")
        taken = term(connection, epoch)
        connection.add_termination_listener(lambda _: on_end(taken))
        await connection.add_listener(channel, lambda *_: on_notify())
    except BaseException:
        connection.terminate()
        raise
    return taken


async def release_the_lead(connection: Any, *, lost: bool) -> None:
    """Close the lock's connection; a lost term's at once, without waiting on a socket that may be dead."""
    if lost:
        connection.terminate()
        return
    with contextlib.suppress(Exception):
        await connection.close(timeout=2)


def is_database_error(error: BaseException) -> bool:
    """asyncpg's own errors (the server shutting down, too many connections, …)."""
    return type(error).__module__.split(".")[0] == "asyncpg"
