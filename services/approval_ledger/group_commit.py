"""Group commit: the transitions that are waiting when the ledger is ready for
the next, applied in one transaction (one COMMIT, one fsync, one NOTIFY), each
with its own inbox row, state rows and outbox rows (invariant 1 holds per
transition because it holds for the whole transaction).

Deliveries go to one of a few lanes by session id, so one session's messages are
applied in the order they were delivered, one after another; lanes run at the
same time on their own connections. A lane takes what is waiting when it is
free (up to a bound), nothing more: at one session a group is one message and
costs nothing extra; under load N commits become one. Within a group the
messages are ordered by session id (each session's in delivery order), so every
group takes its session locks in the same order and two ledger replicas'
groups cannot deadlock on them.

A group fails as a whole (the handler of one message raised, the database went
away): it is rolled back and each of its messages is applied alone, in order,
in its own transaction, as without grouping, so one bad message cannot take the
others down and each caller gets its own outcome (Inbound counts, retries or
parks it as before). Each caller is answered only after the commit that holds
its effect: the ack follows durability (invariant 9).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from shared import logs
from shared.consuming import sender
from shared.messages import Envelope
from shared.observability import LEDGER_TRANSACTION, counting_on_commit

from .handlers import Ledger
from .store import Duplicate

log = logging.getLogger("signoff.ledger")

Transition = Callable[[Ledger, Envelope], Awaitable[None]]


@dataclass(slots=True)
class _Waiting:
    transition: Transition
    message: Envelope
    # The broker user that published it (the consumer's ContextVar, read in the lane).
    sent_by: str | None
    done: asyncio.Future[None]


class GroupCommit:
    def __init__(self, ledger: Ledger, *, lanes: int, bound: int) -> None:
        self._ledger = ledger
        self._bound = bound
        self._queues: list[asyncio.Queue[_Waiting]] = [asyncio.Queue() for _ in range(lanes)]
        self._lanes: list[asyncio.Task[None]] = []

    async def apply(self, transition: Transition, message: Envelope) -> None:
        """Apply one message's transition; return once it is committed (or raise its error)."""
        if not self._lanes:
            self._lanes = [asyncio.create_task(self._run(queue)) for queue in self._queues]
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lane = zlib.crc32(message.session_id.encode()) % len(self._queues)
        self._queues[lane].put_nowait(_Waiting(transition, message, sender.get(), done))
        await done

    async def _run(self, queue: asyncio.Queue[_Waiting]) -> None:
        while True:
            group = [await queue.get()]
            # One turn of the loop lets deliveries read in the same batch reach the queue.
            await asyncio.sleep(0)
            while len(group) < self._bound and not queue.empty():
                group.append(queue.get_nowait())
            try:
                if len(group) == 1:
                    await self._apply_alone(group[0])
                else:
                    await self._apply_together(group)
            finally:
                for waiting in group:
                    if not waiting.done.done():
                        waiting.done.cancel()

    async def _apply_together(self, group: list[_Waiting]) -> None:
        ordered = sorted(group, key=lambda w: w.message.session_id)
        started = time.perf_counter()
        try:
            # A failed group's counts are dropped with it; alone, each message counts its own.
            with counting_on_commit() as committed:
                async with self._ledger.unit_of_work() as uow:
                    for waiting in ordered:
                        sender.set(waiting.sent_by)
                        logs.concerning(waiting.message)
                        try:
                            await waiting.transition.within(self._ledger, uow, waiting.message)  # type: ignore[attr-defined]
                        except Duplicate:
                            continue
                        await uow.settle()
                    if uow.settled:
                        await uow.commit()
                committed()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("a group of %d transitions failed (%s); applying each alone", len(group), error)
            for waiting in group:
                await self._apply_alone(waiting)
            return
        # Each message's transition took, to its commit, as long as the group's.
        elapsed = time.perf_counter() - started
        for waiting in group:
            LEDGER_TRANSACTION.labels(waiting.message.type).observe(elapsed)
            waiting.done.set_result(None)

    async def _apply_alone(self, waiting: _Waiting) -> None:
        sender.set(waiting.sent_by)
        # A lane is a task of its own: its log lines name the message it applies now.
        logs.concerning(waiting.message)
        try:
            await waiting.transition(self._ledger, waiting.message)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            waiting.done.set_exception(error)
            return
        waiting.done.set_result(None)
