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
import fcntl
import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from shared.ledger.leadership import (
    fenced_epoch,
    is_database_error,
    relay_lock_file,
    release_the_lead,
    take_the_lead,
)
from shared.settings import Settings

log = logging.getLogger("signoff.publisher")


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
    lock = relay_lock_file(settings)
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


@dataclass
class Leadership:
    """One term of leadership: the lock connection and the epoch taken with it."""

    connection: Any  # the lock's own connection (shared/ledger/leadership.py)
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
        self.check(await fenced_epoch(conn))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # A lost term's socket may be dead: do not wait on it.
        await release_the_lead(self.connection, lost=self.lost is not None)


async def lead(settings: Settings, wake: asyncio.Event) -> Leadership:
    """Become the leader (waiting as a standby while another leads), take the next
    epoch, then wake on every NOTIFY; the term lasts while its connection and epoch do."""
    leadership = await take_the_lead(
        settings,
        f"{socket.gethostname()} pid {os.getpid()}"[:128],
        lambda connection, epoch: Leadership(connection, epoch, wake),
        lambda taken: taken.lose("its lock connection to PostgreSQL ended"),
        wake.set,
    )
    log.info("publisher leading the relay (epoch %d)", leadership.epoch)
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
            # The database's own errors (the server shutting down, too many connections, …)
            if not is_database_error(error):
                raise
            log.warning("publisher cannot stand by (%r); retrying in %.1fs", error, delay)
        await asyncio.sleep(delay)
        delay = min(5.0, delay * 2)
