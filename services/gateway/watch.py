"""One watcher of the ledger per gateway process, shared by every request that waits on it.

Before it, each open event stream polled the outbox five times a second and each
decision polled the audit log until its verdict came (make bench, the gateway level:
those polls were most of the gateway's CPU). Now one task per process does both:

- **The outbox tail.** It reads the committed events after its cursor
  (`Ledger.events_after`, the same horizon-guarded (txid, id) order) into a bounded
  buffer of recent rows, and every open stream takes what lies after its own cursor
  from there: one query per wake for all streams, each event's JSON parsed once. A
  stream whose cursor is older than the buffer reads the ledger itself until it
  catches up (`rows_after` answers None), so resuming is exact as before.
- **The verdicts.** Every decision waiting for the ledger's verdict registers its
  message id; one query per wake asks for all of them.

It wakes on the ledger's own NOTIFY (PostgreSQL: every ledger transaction notifies the
outbox channel on commit, `shared/ledger/database.notify_channel`; the publisher wakes
on it too), at most every `GAP` seconds, and otherwise polls: every
`gateway_poll_seconds` while its last read found a writer open below the horizon (a
row may then be held back, `events_after`, and a writer that rolls back notifies
nobody) or a decision waits, otherwise every `gateway_idle_poll_seconds`. On SQLite,
or while its LISTEN connection is away, it polls every `gateway_poll_seconds` as
before. With nobody waiting it does nothing. A logout's NOTIFY (payload `logins`)
goes to the open streams' login check instead (`on_logins`, auth.py `OpenStreams`).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.ledger.event_stream import CommitFeed, Cursor
from shared.ledger.gateway_logins import LOGINS_ENDED

from .reads import Ledger

log = logging.getLogger("signoff.gateway")

# The shortest time between two reads: notifies that come closer together share one read.
GAP = 0.05
# How many recent rows the tail keeps for streams that are behind it.
KEPT = 5000
# How long after the last row or notify it polls at the short interval.
WARM_SECONDS = 2.0


@dataclass
class Row:
    """An event as the tail read it; its JSON parsed once, for every stream."""

    txid: int
    id: int
    session_id: str
    message_type: str
    body: str
    parsed: dict[str, Any] | None = field(default=None, repr=False)
    _shown: str | None = field(default=None, repr=False)

    @property
    def cursor(self) -> Cursor:
        return (self.txid, self.id)

    def loaded(self) -> dict[str, Any]:
        if self.parsed is None:
            self.parsed = json.loads(self.body)
        return self.parsed

    def shown(self) -> str:
        """The event as a stream sends it. The one-time response token is for the channel
        that shows the card, never for a stream."""
        if self._shown is None:
            self._shown = json.dumps({k: v for k, v in self.loaded().items() if k != "response_token"})
        return self._shown


class LedgerWatch:
    def __init__(self, ledger: Ledger, poll_seconds: float, idle_poll_seconds: float, listen_channel: str | None):
        self.ledger = ledger
        self.poll_seconds = poll_seconds
        self.idle_poll_seconds = idle_poll_seconds
        self.listen_channel = listen_channel
        self.listening = False
        self.streams = 0
        # The tail: rows after `base` up to `cursor`, in order (None: not started).
        self.base: Cursor | None = None
        self.cursor: Cursor | None = None
        self.rows: list[Row] = []
        self.keys: list[Cursor] = []
        # Decisions waiting for their verdicts, by (session id, message id).
        self.waiting: dict[tuple[str, str], set[asyncio.Future]] = {}
        self._wake = asyncio.Event()
        self._interest = asyncio.Event()
        self._changed = asyncio.Event()
        self._last_activity = 0.0
        self._tasks: list[asyncio.Task] = []
        # The LISTEN connection, which also runs the reads while it is there.
        self._feed: CommitFeed | None = None
        # Called on a logout's NOTIFY (services/gateway/auth.py `OpenStreams.wake`).
        self.on_logins: Callable[[], None] | None = None

    # --- life ---------------------------------------------------------------------

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._run(), name="gateway ledger watch"))
        if self.listen_channel:
            self._tasks.append(asyncio.create_task(self._listen(), name="gateway ledger listen"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()

    # --- for the event streams ------------------------------------------------------

    @contextlib.contextmanager
    def stream(self):
        """While a stream is open the tail follows the ledger."""
        self.streams += 1
        self._interest.set()
        self._wake.set()
        try:
            yield
        finally:
            self.streams -= 1

    def rows_after(self, cursor: Cursor, limit: int = 200) -> list[Row] | None:
        """The tail's rows after `cursor`; None when the tail cannot answer for it (not
        started, or the cursor is older than the rows it keeps): read the ledger."""
        if self.base is None or cursor < self.base:
            return None
        start = bisect.bisect_right(self.keys, cursor)
        return self.rows[start : start + limit]

    async def changed(self, timeout: float | None = None) -> None:
        """Until the tail has read new rows (or `timeout`)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def newest(self) -> Cursor:
        """Where a stream "from now" starts: the tail's cursor, or the ledger's newest
        event every transaction before it has ended."""
        if self.cursor is not None and self.streams:
            return self.cursor
        return await self.ledger.newest_event()

    # --- for decisions ----------------------------------------------------------------

    async def verdict(self, session_id: str, message_id: str, timeout: float, send) -> Any:
        """Send (`send()`) and wait up to `timeout` for the ledger's verdict on the message;
        registered before sending, so a verdict committed at once is not missed."""
        key = (session_id, message_id)
        future = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(key, set()).add(future)
        self._interest.set()
        try:
            await send()
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return None
        finally:
            futures = self.waiting.get(key, set())
            futures.discard(future)
            if not futures:
                self.waiting.pop(key, None)

    # --- the one loop ---------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._wait()
                if self.streams:
                    await self._read_tail()
                elif self.base is not None:
                    self._forget()  # nobody follows: start afresh from "now" next time
                if self.waiting:
                    await self._read_verdicts()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("gateway ledger watch: %r; retrying", error)
                await asyncio.sleep(self.poll_seconds)
            await asyncio.sleep(GAP)

    async def _wait(self) -> None:
        if not self.streams and not self.waiting:
            self._interest.clear()
            await self._interest.wait()  # nobody waits: no reads at all
        timeout = self.poll_seconds if self._may_be_held() else self.idle_poll_seconds
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    def _may_be_held(self) -> bool:
        """Whether a committed row may wait unannounced: without NOTIFY (SQLite, or the
        LISTEN connection away), or while the last read found a writer open below the
        horizon (rows behind it show once it ends, and one that rolls back notifies
        nobody). Otherwise every new row comes with its transaction's NOTIFY, and the
        watcher sleeps until then (the idle poll only as a backstop)."""
        feed = self._feed
        if not self.listening or feed is None:
            return True
        if self.streams and feed.held[0]:
            return True
        return bool(self.waiting) and time.monotonic() - self._last_activity < WARM_SECONDS

    def _forget(self) -> None:
        self.base = self.cursor = None
        self.rows, self.keys = [], []

    async def _read_tail(self) -> None:
        if self.base is None:
            self.base = self.cursor = await self.ledger.newest_event()
        assert self.cursor is not None
        found = False
        while True:
            rows = await self._events_after(self.cursor)
            for row in rows:
                self.rows.append(row)
                self.keys.append(row.cursor)
                self.cursor = row.cursor
            found = found or bool(rows)
            if len(rows) < 200:
                break
        if found:
            self._last_activity = time.monotonic()
            if len(self.rows) > KEPT:
                dropped = len(self.rows) - KEPT
                self.base = self.keys[dropped - 1]
                del self.rows[:dropped], self.keys[:dropped]
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    async def _read_verdicts(self) -> None:
        waiting = list(self.waiting)
        if not waiting:
            return
        for entry in await self._verdicts(waiting):
            for future in self.waiting.get((entry.session_id, entry.message_id or ""), ()):
                if not future.done():
                    future.set_result(entry)

    async def _events_after(self, cursor: Cursor) -> list[Row]:
        feed = self._feed
        found = await (self.ledger.events_after(cursor) if feed is None else feed.events_after(cursor, 200))
        return [Row(int(r[0]), int(r[1]), r[2], r[3], r[4]) for r in found]

    async def _verdicts(self, waiting: list[tuple[str, str]]) -> Any:
        feed = self._feed
        if feed is None:
            return await self.ledger.verdicts(waiting)
        return await feed.verdicts(waiting)

    # --- NOTIFY -------------------------------------------------------------------------

    async def _listen(self) -> None:
        """Hold one connection LISTENing on the ledger's outbox channel; again after it drops."""
        channel = self.listen_channel
        assert channel is not None  # started only with a channel (PostgreSQL)
        delay = 0.5
        while True:
            try:
                async with self.ledger.record.commit_feed(channel, self._notified) as feed:
                    self.listening, delay = True, 0.5
                    self._feed = feed
                    if self.on_logins is not None:
                        self.on_logins()  # what ended while nobody listened is read now
                    try:
                        await feed.ended()
                    finally:
                        self.listening, self._feed = False, None
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("gateway cannot LISTEN for the ledger's commits (%r); polling meanwhile", error)
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)

    def _notified(self, _connection: Any = None, _pid: Any = None, _channel: Any = None, payload: Any = None) -> None:
        if payload == LOGINS_ENDED:
            # A logout, not a commit of the ledger's: the open streams' logins are read again.
            if self.on_logins is not None:
                self.on_logins()
            return
        self._last_activity = time.monotonic()
        self._wake.set()
