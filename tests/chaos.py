"""`make chaos`: many concurrent sessions while a random service is SIGKILLed at
a random moment, over and over; then a Jepsen-style check of what happened.

    python -m tests.chaos [--seconds 180] [--sessions 16] [--seed N] [--store both|postgres|sqlite] [--cluster]

The run is made on each store: `--store both` (the default) runs it on SQLite,
then on PostgreSQL, each for `--seconds`, with the same seed; the exit status is
non-zero if either run has a violation. `--store sqlite` or `--store postgres`
runs one. (tests/crash/test_chaos.py makes a short run on each.)

`--cluster`: one run, on PostgreSQL, on the cluster of
deploy/local/cluster_up.sh (three RabbitMQ nodes, a primary and its synchronous
standby; started if down, stopped at the end if this started it; needs root).
Besides the service kills, every 30 to 60 s a part of the cluster is lost in
turn: a RabbitMQ node SIGKILLed and brought back 5 to 15 s later, or the
database primary SIGKILLed (every process), its standby promoted and the lost
one rebuilt as the new standby. The sessions read their progress from the
ledger (a console's watch queue dies with its node), and the same checks end it.

Checks, after the killing stops and the system settles (tests/invariants.py's
end-of-run check, given the events the driver saw and the sink's requests):
- every approval request shown is answerable (pending) or closed with a reason;
- no request id changed: each tool call was shown under exactly one request id;
- no tool ran twice: each outward call's idempotency key reached the sink once;
- no message was lost: every queue drained, nothing dead-lettered, outbox sent;
- every session is `waiting` or `idle`, never stuck `running`; no call closed
  without a closure; every session loop finished its turn.
Prints the counts and exits non-zero on any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from sqlalchemy import func, select

from shared.ledger.tables import OutboxRow, Session
from shared.messages import EVENT, StartTurn, mint
from shared.settings import PROJECT_ROOT
from tests.harness import SERVICES, Deployment, require_services
from tests.invariants import check_run
from tests.sink import Sink

STORES = ("sqlite", "postgres")


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


async def check(observed: Observed, sink: Sink, console, unfinished: int) -> list[str]:
    verdict = await check_run(console, shown=observed.requests_by_call, sink_requests=sink.requests,
                              seen=[f"{unfinished} session(s) never finished their turn"] if unfinished else [])
    figures = verdict.figures
    print(f"chaos: {len(observed.shown)} requests shown, {observed.completed_turns} turns completed, "
          f"{len(sink.requests)} outward calls, {figures['closures_by_kind'].get('outcome_unknown', 0)} closed "
          f"outcome-unknown (surfaced), sessions {figures['sessions_by_status']}")
    print(f"chaos: events {dict(observed.event_counts)}")
    return verdict.violations


async def run(seconds: float, sessions: int, seed: int, data_dir: Path, store: str = "postgres") -> int:
    """One run on one store ("sqlite" or "postgres"): 0 if nothing was violated, else 1."""
    if store not in STORES:
        raise ValueError(f"store is one of {STORES}, not {store!r}")
    require_services(postgres=store == "postgres")
    print(f"chaos: {store} ledger")
    rng = random.Random(seed)
    kills: Counter[str] = Counter()
    with Sink() as sink:
        deployment = Deployment(store=store, data_dir=data_dir)
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
                violations = await check(observed, sink, console, len(pending))
            print(f"chaos: kills {dict(kills)}")
        finally:
            await deployment.cleanup()
    for violation in violations:
        print(f"VIOLATION: {violation}")
    print(f"chaos: {store}: OK" if not violations else f"chaos: {store}: {len(violations)} violation(s)")
    return 1 if violations else 0


def cluster_killer(stop_at: float, rng: random.Random, kills: Counter) -> None:
    """A part of the cluster lost every 30 to 60 s, in turn a broker node and the database primary."""
    from tests.cluster import rig

    turn = 0
    while time.monotonic() + 30 < stop_at:
        time.sleep(rng.uniform(30, 60))
        if time.monotonic() >= stop_at:
            return
        if turn % 2 == 0:
            node = rng.choice(rig.NODES)
            rig.kill_node(node)
            kills[f"rabbitmq {rig.node_name(node)}"] += 1
            time.sleep(rng.uniform(5, 15))
            started = time.monotonic()
            rig.start_nodes()
            print(f"\nchaos: {rig.node_name(node)} killed, back in {time.monotonic() - started:.0f}s", file=sys.stderr)
        else:
            lost = rig.PG_CLUSTERS[rig.primary_port()]
            promoted, rebuilt = rig.fail_over_database()
            kills[f"postgresql primary ({lost})"] += 1
            print(f"\nchaos: primary {lost} lost, standby promoted in {promoted:.1f}s, the lost one rebuilt as the "
                  f"standby in {rebuilt:.0f}s", file=sys.stderr)
        turn += 1


async def run_cluster(seconds: float, sessions: int, seed: int, data_dir: Path) -> int:
    """One run on the cluster rig (PostgreSQL ledger): 0 if nothing was violated, else 1."""
    from tests.cluster import rig

    require_services(postgres=False)  # Redis (and the shared broker, which provisioning leaves alone)
    was_up = rig.up(5681)
    rig.cluster_up()
    print("chaos: cluster (three RabbitMQ nodes, a PostgreSQL primary and its synchronous standby)")
    rng = random.Random(seed)
    kills: Counter[str] = Counter()
    violations: list[str] = []
    try:
        with Sink() as sink:
            deployment = rig.cluster_deployment(data_dir, sink)
            try:
                deployment.start()
                async with deployment.console() as console:
                    flow = rig.Flow(console, sessions)
                    started = time.monotonic()
                    stop_at = started + seconds
                    threads = [asyncio.create_task(asyncio.to_thread(killer, deployment, stop_at, rng, kills)),
                               asyncio.create_task(asyncio.to_thread(cluster_killer, stop_at, rng, kills))]
                    while not all(t.done() for t in threads):
                        await asyncio.sleep(1)
                        print(f"\rchaos: {time.monotonic() - started:5.0f}/{seconds:.0f}s  turns "
                              f"{flow.observed.completed_turns}  kills {sum(kills.values())}", end="",
                              file=sys.stderr, flush=True)
                    for thread in threads:
                        await thread
                    print(file=sys.stderr)
                    for service in SERVICES:
                        if service not in deployment.processes:
                            deployment.start(service)
                    verdict = await flow.finish(deployment, sink)
                    violations = verdict.violations
                    figures = verdict.figures
                    print(f"chaos: {flow.observed.completed_turns} turns completed, {len(sink.requests)} outward "
                          f"calls, {figures['closures_by_kind'].get('outcome_unknown', 0)} closed outcome-unknown "
                          f"(surfaced), sessions {figures['sessions_by_status']}; longest pause between completions "
                          f"{flow.longest_pause(started):.1f}s")
                print(f"chaos: kills {dict(kills)}")
            finally:
                await deployment.cleanup()
    finally:
        await asyncio.to_thread(rig.restore_database_roles)
        if not was_up:
            subprocess.run(["bash", str(PROJECT_ROOT / "deploy/local/cluster_down.sh")], check=False)
    for violation in violations:
        print(f"VIOLATION: {violation}")
    print("chaos: cluster: OK" if not violations else f"chaos: cluster: {len(violations)} violation(s)")
    return 1 if violations else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180, help="seconds of killing per store (default 180)")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--store", choices=("both", *STORES), default="both",
                        help="the ledger's store: both (default: SQLite, then PostgreSQL), sqlite or postgres")
    parser.add_argument("--cluster", action="store_true",
                        help="on the cluster of deploy/local/cluster_up.sh (PostgreSQL), losing broker nodes and "
                        "the database primary among the service kills")
    args = parser.parse_args()
    if args.cluster:
        print(f"chaos: {args.seconds:.0f}s on the cluster, {args.sessions} concurrent sessions, seed {args.seed}")
        with tempfile.TemporaryDirectory(prefix="signoff-chaos-cluster-") as data_dir:
            sys.exit(asyncio.run(run_cluster(args.seconds, args.sessions, args.seed, Path(data_dir))))
    stores = STORES if args.store == "both" else (args.store,)
    print(f"chaos: {args.seconds:.0f}s per store ({', '.join(stores)}), {args.sessions} concurrent sessions, "
          f"seed {args.seed}")
    failed = []
    for store in stores:
        with tempfile.TemporaryDirectory(prefix=f"signoff-chaos-{store}-") as data_dir:
            if asyncio.run(run(args.seconds, args.sessions, args.seed, Path(data_dir), store)):
                failed.append(store)
    if len(stores) > 1:
        print(f"chaos: violations on {', '.join(failed)}" if failed else f"chaos: OK on {', '.join(stores)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
