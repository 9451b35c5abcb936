"""`make chaos`: many concurrent sessions while a random service is SIGKILLed at
a random moment, over and over; then a Jepsen-style check of what happened.

    python -m tests.chaos [--seconds 180] [--sessions 16] [--seed N]

Checks, after the killing stops and the system settles:
- every approval request shown is answerable (pending) or closed with a reason;
- no request id changed: each tool call was shown under exactly one request id;
- no tool ran twice: each outward call's idempotency key reached the sink once;
- no message was lost: every queue drained, nothing dead-lettered, outbox sent;
- every session is `waiting` or `idle`, never stuck `running`.
Prints the counts and exits non-zero on any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from sqlalchemy import func, select

from shared.ledger.tables import ApprovalRequest, Closure, OutboxRow, Session, ToolCall
from shared.messages import EVENT, StartTurn, mint
from shared.topology import Topology
from tests.harness import SERVICES, Deployment, require_services
from tests.sink import Sink


class Observed:
    def __init__(self) -> None:
        self.requests_by_call: dict[str, set[str]] = defaultdict(set)
        self.shown: set[str] = set()
        self.completed_turns = 0
        self.event_counts: Counter[str] = Counter()
        self.waiters: dict[str, asyncio.Queue] = defaultdict(asyncio.Queue)


async def listen(console, observed: Observed) -> None:
    queue = await console.watch("*")
    seen_ids: set[str] = set()
    async with queue.iterator() as messages:
        async for raw in messages:
            async with raw.process():
                event = EVENT.validate_json(raw.body)
            if event.message_id in seen_ids:
                observed.event_counts["duplicate deliveries (dropped)"] += 1
                continue
            seen_ids.add(event.message_id)
            observed.event_counts[event.type] += 1
            if event.type == "approval.requested":
                observed.requests_by_call[event.call_id].add(event.request_id)
                observed.shown.add(event.request_id)
            await observed.waiters[event.session_id].put(event)


async def session_loop(console, observed: Observed, stop: asyncio.Event, rng: random.Random) -> None:
    while not stop.is_set():
        session_id = mint("ses")
        inbox = observed.waiters[session_id]
        await console.send(StartTurn(session_id=session_id, text="chaos"))
        while True:
            try:
                event = await asyncio.wait_for(inbox.get(), 120)
            except TimeoutError:
                print(f"\nchaos: session {session_id} heard nothing for 120 s", file=sys.stderr)
                return
            if event.type == "approval.requested":
                await asyncio.sleep(rng.uniform(0, 0.3))
                await console.respond(event.request_id, "approve", "", "", "chaos")
            elif event.type in ("turn.completed", "turn.failed"):
                observed.completed_turns += 1
                break


def killer(deployment: Deployment, stop_at: float, rng: random.Random, kills: Counter) -> None:
    while time.monotonic() < stop_at:
        time.sleep(rng.uniform(0.5, 2.5))
        service = rng.choice(SERVICES)
        deployment.kill(service)
        kills[service] += 1
        time.sleep(rng.uniform(0, 0.8))
        deployment.start(service)


async def settle(deployment: Deployment, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with deployment.ledger() as sessions:
        while time.monotonic() < deadline:
            async with sessions() as db:
                running = await db.scalar(select(func.count()).select_from(Session).where(Session.status == "running"))
                unsent = await db.scalar(select(func.count()).select_from(OutboxRow).where(OutboxRow.sent_at.is_(None)))
            if not running and not unsent:
                return
            await asyncio.sleep(0.2)


async def check(deployment: Deployment, observed: Observed, sink: Sink, console) -> list[str]:
    violations = []
    async with deployment.ledger() as sessions, sessions() as db:
        requests = {r.id: r for r in await db.scalars(select(ApprovalRequest))}
        closures = {c.call_id: c for c in await db.scalars(select(Closure))}
        calls = {c.id: c for c in await db.scalars(select(ToolCall))}
        statuses = Counter(s for s in await db.scalars(select(Session.status)))
        unsent = await db.scalar(select(func.count()).select_from(OutboxRow).where(OutboxRow.sent_at.is_(None)))
    for request_id in observed.shown:
        request = requests.get(request_id)
        if request is None:
            violations.append(f"request {request_id} was shown but is not in the ledger")
        elif request.status != "pending" and request.call_id not in closures:
            violations.append(f"request {request_id} is {request.status} but its call has no closure")
    for call_id, ids in observed.requests_by_call.items():
        if len(ids) != 1:
            violations.append(f"call {call_id} was shown under {len(ids)} request ids: {sorted(ids)}")
    keys = Counter(r["headers"].get("Idempotency-Key") for r in sink.requests)
    violations += [f"an outward call ran {n} times (key {key})" for key, n in keys.items() if n > 1]
    for call in calls.values():
        if call.status == "closed" and call.id not in closures:
            violations.append(f"call {call.id} is closed without a closure")
    if statuses.get("running"):
        violations.append(f"{statuses['running']} session(s) still running after settling")
    if unsent:
        violations.append(f"{unsent} outbox row(s) never sent")
    for name in Topology(deployment.namespace).all_queue_names():
        queue = await console.channel.declare_queue(name, passive=True)
        if queue.declaration_result.message_count:
            violations.append(f"queue {name} still holds {queue.declaration_result.message_count} message(s)")
    unknown = sum(1 for c in closures.values() if c.kind == "outcome_unknown")
    print(f"chaos: {len(observed.shown)} requests shown, {observed.completed_turns} turns completed, "
          f"{len(sink.requests)} outward calls, {unknown} closed outcome-unknown (surfaced), sessions {dict(statuses)}")
    print(f"chaos: events {dict(observed.event_counts)}")
    return violations


async def run(seconds: float, sessions: int, seed: int, data_dir: Path) -> int:
    require_services()
    rng = random.Random(seed)
    kills: Counter[str] = Counter()
    with Sink() as sink:
        deployment = Deployment(store="postgres", data_dir=data_dir)
        deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="chaos")
        try:
            deployment.start()
            observed = Observed()
            async with deployment.console() as console:
                listener = asyncio.create_task(listen(console, observed))
                stop = asyncio.Event()
                loops = [asyncio.create_task(session_loop(console, observed, stop, rng)) for _ in range(sessions)]
                started = time.monotonic()
                kill_thread = asyncio.create_task(asyncio.to_thread(killer, deployment, started + seconds, rng, kills))
                while not kill_thread.done():
                    await asyncio.sleep(1)
                    print(f"\rchaos: {time.monotonic() - started:5.0f}/{seconds:.0f}s  turns {observed.completed_turns}"
                          f"  kills {sum(kills.values())}", end="", file=sys.stderr, flush=True)
                await kill_thread
                print(file=sys.stderr)
                stop.set()
                for service in SERVICES:
                    if service not in deployment.processes:
                        deployment.start(service)
                done, pending = await asyncio.wait(loops, timeout=120)
                if pending:
                    print(f"chaos: {len(pending)} session loop(s) did not finish", file=sys.stderr)
                await settle(deployment, 60)
                listener.cancel()
                violations = await check(deployment, observed, sink, console)
                if pending:
                    violations.append(f"{len(pending)} session(s) never finished their turn")
            print(f"chaos: kills {dict(kills)}")
        finally:
            await deployment.cleanup()
    for violation in violations:
        print(f"VIOLATION: {violation}")
    print("chaos: OK" if not violations else f"chaos: {len(violations)} violation(s)")
    return 1 if violations else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    print(f"chaos: {args.seconds:.0f}s, {args.sessions} concurrent sessions, seed {args.seed}")
    with tempfile.TemporaryDirectory(prefix="signoff-chaos-") as data_dir:
        sys.exit(asyncio.run(run(args.seconds, args.sessions, args.seed, Path(data_dir))))


if __name__ == "__main__":
    main()
