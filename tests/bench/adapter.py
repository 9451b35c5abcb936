"""The driver's channel adapter: it starts sessions, approves what they ask, and
hears every event of the deployment on one watch queue."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import aio_pika

from services.operations.console import Console
from shared.messages import Envelope, RespondToApproval, StartTurn, encode


class BenchFailure(AssertionError):
    """The system under test did something wrong: the benchmark fails."""


class Waiter:
    """The events the driver waits for in one session, with when they arrived."""

    KINDS = ("approval.requested", "tool.closed", "turn.completed")

    def __init__(self, session_id: str) -> None:
        loop = asyncio.get_running_loop()
        self.session_id = session_id
        self.futures: dict[str, asyncio.Future] = {kind: loop.create_future() for kind in self.KINDS}
        self.times: dict[str, float] = {}

    def deliver(self, kind: str, body: dict[str, Any], at: float) -> None:
        self.times.setdefault(kind, at)  # at least once: keep the first arrival
        future = self.futures.get(kind)
        if future is not None and not future.done():
            future.set_result(body)
        if kind in ("turn.failed", "message.rejected"):
            for future in self.futures.values():
                if not future.done():
                    future.set_exception(BenchFailure(f"{kind} in {self.session_id}: {body.get('reason_code')}: "
                                                      f"{body.get('reason_text')}"))

    async def wait(self, kind: str, timeout: float) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(asyncio.shield(self.futures[kind]), timeout)
        except TimeoutError:
            raise BenchFailure(f"no {kind} for {self.session_id} within {timeout:.0f}s") from None


@dataclass
class RoundTrip:
    session_id: str
    call_id: str
    started: float  # just before turn.start was published
    requested_seen: float  # approval.requested received
    responded: float  # just before approval.respond was published
    closed_seen: float | None  # tool.closed received
    completed_seen: float  # turn.completed received


class ChannelAdapter:
    """The tests' client, `services.operations.console.Console` (the harness's `Deployment.console()`),
    carries it: its connection and confirming channel, its topology, its `watch`
    queue and, for the end-of-run check, its ledger sessions. Two things are the
    adapter's own, deliberately leaner than the Console's, because the driver's CPU
    is a column of the figures (and counts in `cpu limit`) and its work sits inside
    every latency it measures:

    - it publishes with aio-pika, the message `shared.consuming.publish` makes
      (persistent, message id, JSON, confirmed), not through faststream as
      `Console.send` does: faststream's publish path cost ~100 µs more CPU per
      message here (~440 against ~340 µs, 1,500 confirmed publishes each way), two
      publishes per round trip; and it approves with the digest of the
      approval.requested event, where `Console.respond` first reads the request
      from the ledger (a database round trip inside "response -> executed");
    - it hears events on a no-ack consumer, decoded with `json` and dispatched by
      session id, not validated into pydantic events as the tests' listeners do.
    """

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.waiters: dict[str, Waiter] = {}
        self.problems: list[str] = []
        self.events = Counter()
        self.sent = Counter()
        self.completed = 0
        # call id -> the request ids its approval.requested events carried (one, or one was renamed)
        self.shown: dict[str, set[str]] = defaultdict(set)

    async def open(self, console: Console) -> None:
        self.console = console
        self.topology = console.topology
        self.exchanges = {
            name: await console.channel.get_exchange(name, ensure=False)
            for name in (self.topology.exchange("channels").name, self.topology.events.name)
        }
        queue = await console.watch("*")
        await queue.consume(self._on_event, no_ack=True)

    async def _on_event(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        at = time.time()
        body = json.loads(message.body)
        kind = body.get("type", "?")
        self.events[kind] += 1
        if kind == "approval.requested":
            self.shown[body.get("call_id")].add(body.get("request_id"))
        elif kind in ("turn.failed", "message.rejected"):
            self.problems.append(f"{kind} in {body.get('session_id')}: {body.get('reason_code')}: "
                                 f"{body.get('reason_text')}")
        waiter = self.waiters.get(body.get("session_id"))
        if waiter is not None:
            waiter.deliver(kind, body, at)

    async def send(self, message: Envelope) -> None:
        exchange, routing_key = self.topology.route(message)
        await self.exchanges[exchange].publish(
            aio_pika.Message(encode(message), message_id=message.message_id, content_type="application/json",
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT, user_id=self.console.user),
            routing_key=routing_key,
        )
        self.sent[message.type] += 1  # type: ignore[attr-defined]

    def watch(self, session_id: str) -> Waiter:
        waiter = self.waiters[session_id] = Waiter(session_id)
        return waiter

    def unwatch(self, session_id: str) -> None:
        self.waiters.pop(session_id, None)

    async def start(self, session_id: str) -> float:
        started = time.time()
        await self.send(StartTurn(session_id=session_id, text="Count, please."))
        return started

    async def approve(self, session_id: str, requested: dict[str, Any]) -> float:
        responded = time.time()
        await self.send(self.console.sign(RespondToApproval(
            session_id=session_id, request_id=requested["request_id"], decision="approve",
            args_digest=requested["args_digest"], responder="bench")))
        return responded

    async def finished(self, waiter: Waiter, timeout: float | None = None) -> dict[str, Any]:
        completed = await waiter.wait("turn.completed", timeout or self.timeout)
        if completed.get("text") != "Counted.":
            raise BenchFailure(f"{waiter.session_id} completed with {completed.get('text')!r}, not 'Counted.'")
        self.completed += 1
        return completed

    async def round_trip(self) -> RoundTrip:
        session_id = f"bench-{uuid.uuid4().hex}"
        waiter = self.watch(session_id)
        try:
            started = await self.start(session_id)
            requested = await waiter.wait("approval.requested", self.timeout)
            responded = await self.approve(session_id, requested)
            await self.finished(waiter)
            return RoundTrip(session_id, requested["call_id"], started, waiter.times["approval.requested"], responded,
                             waiter.times.get("tool.closed"), waiter.times["turn.completed"])
        finally:
            self.unwatch(session_id)
