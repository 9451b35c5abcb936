"""Which publisher relays: one at a time per ledger, so per-session order holds with
replicas, and proven on every write rather than assumed.

On PostgreSQL a publisher leads while it holds an advisory lock on the connection it
also LISTENs on; a standby blocks in `pg_advisory_lock` and takes over the moment that
connection ends. The lock alone proves nothing later: the connection can end (a network
cut, `pg_terminate_backend`, a server restart) while the process lives on, and the
process would go on relaying beside its successor. So:

- **The epoch.** Holding the lock, the new leader adds one to `publisher_leader.epoch`,
  on the lock's own connection, and keeps the value it got.
- **The fence.** Every write a publisher makes (marking outbox rows sent with their hook
  deliveries, recording a hook attempt) first reads that row `FOR SHARE` in the same
  transaction and commits only if the epoch is still its own (`Leadership.fence`). A new
  leader's increment waits for every such transaction in flight, and every one after it
  sees the new epoch. So a deposed leader commits nothing after its successor took the
  lead: no outbox row is marked sent by two publishers.
- **Stopping.** A leader stops relaying and stands by again as soon as it learns it was
  deposed: its lock connection ended (asyncpg's termination listener), a read shows
  another epoch (the relay reads the epoch with every batch and checks it when idle), or
  the fence refused a write. The relay publishes before it marks sent, so a deposed
  leader that read a batch before its successor took the lead may still publish that one
  batch; the successor sends those rows again, with the same message ids, and every
  consumer drops the duplicate (docs/design.md, "Scale and failover").

SQLite runs on one machine with exactly one publisher: no epoch and no fence, but a
second publisher must not relay beside the first, so each takes an exclusive lock on a
file beside the ledger's (`only_relay`) and one that finds it taken refuses to start,
naming the publisher that holds it. The kernel drops the lock when its holder dies,
however it dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from sqlalchemy import select
from sqlalchemy.engine import make_url

from shared.ledger.database import notify_channel
from shared.ledger.tables import TABLES
from shared.settings import Settings

log = logging.getLogger("signoff.publisher")
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


class AnotherRelay(SystemExit):
    def __init__(self, lock: Path, holder: str) -> None:
        super().__init__(
            f"signoff: another publisher already relays this SQLite ledger ({holder or 'its holder did not say'};"
            f" lock {lock}); the embedded default runs exactly one publisher: stop that one first, or use"
            " PostgreSQL (SIGNOFF_DATABASE_URL) for a standby"
        )


def only_relay(settings: Settings) -> IO[str]:
    """Hold the SQLite ledger's relay lock for as long as this process lives (keep the
    file open), or refuse to start. The lock's file says who holds it."""
    ledger = Path(make_url(settings.ledger_url).database or "")
    lock = ledger.with_name(ledger.name + ".publisher.lock")
    held = open(lock, "a+")  # held open until the process ends: closing it would drop the lock
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.seek(0)
        holder = held.read().strip()
        held.close()
        raise AnotherRelay(lock, holder) from None
    held.seek(0)
    held.truncate()
    held.write(f"pid {os.getpid()} on {socket.gethostname()}, since {datetime.now(UTC).isoformat(timespec='seconds')}")
    held.flush()
    return held


class LeadershipLost(Exception):
    """This publisher no longer leads: it writes nothing more and stands by again."""


def leader_lock(settings: Settings) -> int:
    """The advisory lock key of this ledger's relay (one per notify channel, so per schema)."""
    channel = notify_channel(settings)
    assert channel is not None
    return LEADER_LOCK ^ zlib.crc32(channel.encode()) % 2**31


@dataclass
class Leadership:
    """One term of leadership: the lock connection and the epoch taken with it."""

    connection: Any  # asyncpg.Connection
    epoch: int
    wake: asyncio.Event
    # Why this term ended, once it has; then the relay stops and the publisher stands by.
    lost: str | None = None
    _closed: bool = field(default=False, repr=False)

    def lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            self.wake.set()  # the relay loop notices at once, even while idle

    def ensure(self) -> None:
        """Raise LeadershipLost once this term has ended."""
        if self.lost is not None:
            raise LeadershipLost(self.lost)

    def check(self, epoch: int | None) -> None:
        """The epoch a read saw: another one means another publisher leads now (raise)."""
        if epoch != self.epoch:
            reason = f"another publisher took the lead (epoch {epoch}; this one's was {self.epoch})"
            self.lose(reason)
            raise LeadershipLost(reason)

    async def fence(self, conn) -> None:
        """Inside a write transaction (a Connection or Session), before it commits: go on
        only if the epoch is still this leader's; otherwise raise, and the write rolls back.
        The epoch alone decides: while it is still ours no other publisher has led since,
        so the write is safe even if our lock connection has just ended."""
        self.check((await conn.execute(_FENCE)).scalar())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.lost is not None:
            self.connection.terminate()  # its socket may be dead: do not wait on it
            return
        with contextlib.suppress(Exception):
            await self.connection.close(timeout=2)


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


async def lead(settings: Settings, wake: asyncio.Event) -> Leadership:
    """Become the leader (waiting as a standby while another leads), take the next
    epoch, then wake on every NOTIFY; the term lasts while its connection and epoch do."""
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
        epoch = await connection.fetchval(_TAKE_EPOCH, f"{socket.gethostname()} pid {os.getpid()}"[:128])
        if epoch is None:
            raise RuntimeError("publisher_leader has no row 1: the ledger's migrations did not run to the end")
        leadership = Leadership(connection, epoch, wake)
        connection.add_termination_listener(lambda _: leadership.lose("its lock connection to PostgreSQL ended"))
        await connection.add_listener(channel, lambda *_: wake.set())
    except BaseException:
        connection.terminate()
        raise
    log.info("publisher leading the relay (epoch %d)", epoch)
    wake.set()  # whatever was committed while it stood by
    return leadership


async def lead_again(settings: Settings, wake: asyncio.Event) -> Leadership:
    """After a lost term: stand by (and lead) again, retrying while PostgreSQL is away."""
    delay = 0.5
    while True:
        try:
            return await lead(settings, wake)
        except (TimeoutError, OSError) as error:
            log.warning("publisher cannot reach PostgreSQL to stand by (%r); retrying in %.1fs", error, delay)
        except Exception as error:
            # asyncpg's own errors (the server shutting down, too many connections, …)
            if type(error).__module__.split(".")[0] != "asyncpg":
                raise
            log.warning("publisher cannot stand by (%r); retrying in %.1fs", error, delay)
        await asyncio.sleep(delay)
        delay = min(5.0, delay * 2)
