"""`make bench`: one approval round trip, measured on the real services.

    .venv/bin/python -m tests.bench [--seconds 20] [--levels 1,16,64] [--recovery-tries 3]
                                    [--output PATH] [--quick] [--profile DIR]

The workload is one approval round trip: a session's model step asks for one
tool call that needs approval (sessions named `bench-*` get the `count` script
in tests/fixtures/script.yaml) -> the request is committed and its event
published -> the driver approves it -> the tool runs once -> its result closes
the call -> the next model step finishes the turn. The model is the scripted
provider and the tool increments an in-process counter, so the figures measure
Signoff, not its dependencies.

The four services run as separate processes on PostgreSQL (tests/harness.py's
`Deployment`, its own namespace and schema, removed at the end even on failure).
This module is the channel adapter: it starts sessions, listens on ONE watch
queue bound to the events exchange with `#` (events are dispatched by session
id to per-session futures), and answers every approval.requested with an
approve carrying the card's args_digest.

How each figure is taken (docs/performance.md repeats this):

- round trips/s: a closed loop of N slots is in steady state once N round trips
  have completed (about one per slot); the rate is the number of
  round trips completed from then (and not before a short warm-up, 10 % of the
  level, at most 2 s) to the level's deadline, divided by that window. Slots
  stop starting sessions at the deadline and finish the one they have; those
  drain round trips count for costs, not for the rate. A level too short to
  reach steady state falls back to all round trips over the whole level
  (`steady_state: false` in the JSON). Latency percentiles are over round
  trips started after the first completion (the second wave on).
- response -> tool executed: from just before the driver publishes the approve
  to `execution_claims.finished_at`, which the executor writes right after the
  tool returned (the durable "it ran" record). The JSON also keeps response ->
  closure committed (`closures.created_at`, the ledger's transaction time for
  tool.completed) and response -> tool.closed as seen by the driver, plus a
  median breakdown of every hop.
- turn start -> approval event: from just before the driver publishes
  turn.start to the driver receiving approval.requested.
- ledger transactions per round trip: inbox rows (one per ledger transition).
  "write transactions" adds the executor's two claim transactions per call
  (take, finish) and the publisher's mark-sent transactions (one per relay
  batch = distinct outbox.sent_at values). Read-only transactions (the relay's
  SELECT) are not counted.
- messages per round trip: outbox rows (published by the publisher) plus inbox
  rows (every message the ledger consumed: the driver's turn.start and
  approval.respond, model-step's step.completed, the executor's tool.completed).
  That is every message published to RabbitMQ once; redeliveries are not seen.
- CPU per round trip: utime+stime from /proc/<pid>/stat of each service process
  before and after the level (drain included), divided by the level's round
  trips. The driver's own CPU and the dependencies' (postgres, beam.smp,
  redis-server, summed over their processes, machine-wide) are shown apart.
- floor: 16 asyncpg connections doing BEGIN; INSERT one row; COMMIT into a
  table in the bench schema; and aio-pika with publisher confirms, 16
  concurrent publishers of persistent 1 KB messages to a quorum queue under the
  bench namespace, consumed and acked by a consumer on another connection.
- recovery: N sessions wait on approval; SIGKILL approval-ledger and publisher;
  publish approvals for all of them while they are down; start both again and
  time from just before the start to the first of those calls executed
  (execution_claims.finished_at) and closed (closures.created_at). Each try is
  made three ways: a warm restart (a fork of an interpreter that has the
  services loaded, as `signoff up` restarts a service), a cold one (a new
  interpreter, as a container restarts), and failover (nothing restarts: a
  second ledger and a standby publisher, started before the kill, carry on;
  timed from the kill).
- exactly once: at the end, every tool call of the run has exactly one claim
  with attempts == 1 and outcome output, exactly one closure of kind output,
  and the counter values recorded in the closures are exactly 1..N with N the
  number of round trips the driver saw complete (the executor is never
  restarted, so its counter counts every execution). Sessions idle, turns
  completed, no pending request, no dead letter, no rejection or failed turn.
  Any violation makes the run fail (exit status 1) after the figures are written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from shared.messages import Envelope, RespondToApproval, StartTurn, encode
from shared.settings import PROJECT_ROOT
from shared.topology import Topology
from tests.harness import POSTGRES_URL, RABBITMQ_URL, Deployment, require_services

CLK_TCK = os.sysconf("SC_CLK_TCK")
DEPENDENCIES = ("postgres", "beam.smp", "redis-server")
SHORT = {"approval-ledger": "ledger", "publisher": "publisher", "model-step": "model", "tool-executor": "executor"}


class BenchFailure(AssertionError):
    """The system under test did something wrong: the benchmark fails."""


# --- small helpers ------------------------------------------------------------


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary_ms(values: list[float]) -> dict[str, float | None]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90), "p99": percentile(ms, 99),
            "max": max(ms) if ms else None}


def process_cpu(pid: int) -> float | None:
    """utime + stime of one process, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def dependency_cpu() -> dict[str, dict[int, float]]:
    """CPU of every postgres / beam.smp / redis-server process on the machine, by pid."""
    found: dict[str, dict[int, float]] = {name: {} for name in DEPENDENCIES}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in found:
            cpu = process_cpu(int(entry))
            if cpu is not None:
                found[comm][int(entry)] = cpu
    return found


def dependency_cpu_delta(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) -> dict[str, float]:
    """Processes that ended in between are lost; new ones count from zero."""
    return {name: sum(cpu - before[name].get(pid, 0.0) for pid, cpu in after[name].items()) for name in after}


def ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


class Progress:
    """One updating line on stderr per phase."""

    def __init__(self, label: str, render) -> None:
        self.label = label
        self.render = render
        self.started = time.time()
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> Progress:
        self.task = asyncio.create_task(self._loop())
        return self

    async def _loop(self) -> None:
        while True:
            self._write()
            await asyncio.sleep(0.25)

    def _write(self, end: str = "") -> None:
        line = f"\r[{self.label}] {self.render(time.time() - self.started)}"
        sys.stderr.write(line.ljust(100) + end)
        sys.stderr.flush()

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        self._write("\n")


# --- the driver: a channel adapter --------------------------------------------


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


class Driver:
    def __init__(self, namespace: str, timeout: float = 60.0) -> None:
        self.topology = Topology(namespace)
        self.timeout = timeout
        self.waiters: dict[str, Waiter] = {}
        self.problems: list[str] = []
        self.events = Counter()
        self.sent = Counter()
        self.completed = 0

    async def open(self) -> None:
        self.connection = await aio_pika.connect(RABBITMQ_URL)
        self.channel = await self.connection.channel(publisher_confirms=True)
        self.exchanges = {
            name: await self.channel.get_exchange(name, ensure=False)
            for name in (self.topology.commands.name, self.topology.events.name)
        }
        self.event_channel = await self.connection.channel(publisher_confirms=False)
        events = await self.event_channel.declare_exchange(self.topology.events.name, aio_pika.ExchangeType.TOPIC,
                                                           durable=True)
        self.queue = await self.event_channel.declare_queue(exclusive=True, auto_delete=True)
        await self.queue.bind(events, routing_key="#")
        await self.queue.consume(self._on_event, no_ack=True)

    async def close(self) -> None:
        await self.connection.close()

    async def _on_event(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        at = time.time()
        body = json.loads(message.body)
        kind = body.get("type", "?")
        self.events[kind] += 1
        if kind in ("turn.failed", "message.rejected"):
            self.problems.append(f"{kind} in {body.get('session_id')}: {body.get('reason_code')}: "
                                 f"{body.get('reason_text')}")
        waiter = self.waiters.get(body.get("session_id"))
        if waiter is not None:
            waiter.deliver(kind, body, at)

    async def send(self, message: Envelope) -> None:
        exchange, routing_key = self.topology.route(message)
        await self.exchanges[exchange].publish(
            aio_pika.Message(encode(message), message_id=message.message_id, content_type="application/json",
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
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
        await self.send(RespondToApproval(session_id=session_id, request_id=requested["request_id"],
                                          decision="approve", args_digest=requested["args_digest"],
                                          responder="bench"))
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


# --- reading the ledger -------------------------------------------------------


class LedgerReader:
    """A plain asyncpg connection to the bench schema, for counts and timestamps."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    async def open(self) -> None:
        self.db = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": self.schema})

    async def close(self) -> None:
        await self.db.close()

    async def counts(self) -> dict[str, Any]:
        inbox = dict(await self.db.fetch("SELECT message_type, count(*) FROM inbox GROUP BY 1"))
        outbox = dict(await self.db.fetch("SELECT message_type, count(*) FROM outbox GROUP BY 1"))
        return {
            "inbox": inbox,
            "outbox": outbox,
            "relay_batches": await self.db.fetchval("SELECT count(DISTINCT sent_at) FROM outbox"),
            "claims": await self.db.fetchval("SELECT count(*) FROM execution_claims"),
        }

    async def quiescent(self, timeout: float = 15.0) -> None:
        """Wait until every committed outbox row has been relayed and marked sent."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if await self.db.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0:
                return
            await asyncio.sleep(0.02)
        raise BenchFailure(f"outbox rows still unsent after {timeout:.0f}s")

    async def call_times(self, call_ids: list[str]) -> dict[str, dict[str, float | None]]:
        rows = await self.db.fetch(
            """
            SELECT tc.id, d.decided_at, ec.claimed_at, ec.finished_at, c.created_at AS closed_at
            FROM tool_calls tc
            LEFT JOIN approval_requests ar ON ar.call_id = tc.id
            LEFT JOIN decisions d ON d.request_id = ar.id
            LEFT JOIN execution_claims ec ON ec.call_id = tc.id
            LEFT JOIN closures c ON c.call_id = tc.id
            WHERE tc.id = ANY($1::text[])
            """,
            call_ids,
        )
        return {r["id"]: {k: ts(r[k]) for k in ("decided_at", "claimed_at", "finished_at", "closed_at")} for r in rows}


def cost_delta(before: dict[str, Any], after: dict[str, Any], round_trips: int) -> dict[str, Any]:
    def diff(key: str) -> dict[str, int]:
        keys = set(before[key]) | set(after[key])
        return {k: after[key].get(k, 0) - before[key].get(k, 0) for k in sorted(keys)}

    inbox, outbox = diff("inbox"), diff("outbox")
    transitions = sum(inbox.values())
    claims = after["claims"] - before["claims"]
    batches = after["relay_batches"] - before["relay_batches"]
    writes = transitions + 2 * claims + batches
    n = max(round_trips, 1)
    return {
        "inbox_by_type": inbox,
        "outbox_by_type": outbox,
        "ledger_transactions_per_rt": transitions / n,
        "claim_transactions_per_rt": 2 * claims / n,
        "relay_batches_per_rt": batches / n,
        "write_transactions_per_rt": writes / n,
        "messages_per_rt": (sum(outbox.values()) + transitions) / n,
        "outbox_rows_per_rt": sum(outbox.values()) / n,
    }


# --- phases -----------------------------------------------------------------------


@dataclass
class Context:
    deployment: Deployment
    driver: Driver
    ledger: LedgerReader
    failures: list[str] = field(default_factory=list)


def service_cpu(deployment: Deployment) -> dict[str, float]:
    return {name: process_cpu(p.pid) or 0.0 for name, p in deployment.processes.items()}


async def run_level(ctx: Context, concurrency: int, seconds: float, label: str,
                    profile_dir: Path | None = None) -> dict[str, Any]:
    driver, ledger = ctx.driver, ctx.ledger
    await ledger.quiescent()
    counts_before = await ledger.counts()
    cpu_before, deps_before, own_before = service_cpu(ctx.deployment), dependency_cpu(), time.process_time()
    load_before = os.getloadavg()[0]
    profilers = start_profilers(ctx.deployment, profile_dir, seconds) if profile_dir else []
    results: list[RoundTrip] = []
    errors: list[str] = []
    started = time.time()
    deadline = started + seconds
    warmup = min(2.0, 0.1 * seconds)

    async def slot() -> None:
        while time.time() < deadline:
            try:
                results.append(await driver.round_trip())
            except Exception as error:  # noqa: BLE001 - recorded, makes the bench fail
                errors.append(f"{type(error).__name__}: {error}")
                return

    def render(elapsed: float) -> str:
        return f"{concurrency:>2} sessions: {len(results):6d} round trips  {elapsed:5.1f}/{seconds:.0f} s"

    async with Progress(label, render):
        await asyncio.gather(*(slot() for _ in range(concurrency)))
    finished = time.time()
    await ledger.quiescent()
    cpu_after, deps_after, own_after = service_cpu(ctx.deployment), dependency_cpu(), time.process_time()
    counts_after = await ledger.counts()
    for profiler in profilers:
        try:
            profiler.wait(30)
        except subprocess.TimeoutExpired:
            profiler.kill()
    if errors:
        ctx.failures.extend(f"{label}: {e}" for e in errors[:5])
        for name, process in ctx.deployment.processes.items():
            if process.poll() is not None:
                ctx.failures.append(f"{label}: {name} exited with {process.returncode} "
                                    f"(log: {ctx.deployment.log_path(name)})")

    n = len(results)
    # A closed loop of N slots is in steady state once N round trips have completed: the rate
    # is taken from then (and not before the warm-up) to the deadline, by completion time.
    completions = sorted(r.completed_seen for r in results)
    window_start = max(started + warmup, completions[concurrency - 1] if len(completions) >= concurrency else deadline)
    steady_state = window_start < deadline - 0.2 * seconds
    if not steady_state:  # too short a level for this concurrency: whole level, drain included
        window_start = started
    in_window = [c for c in completions if window_start < c <= (deadline if steady_state else finished)]
    rate = len(in_window) / ((deadline if steady_state else finished) - window_start)
    # Latencies: round trips started once the first wave is over (or all of them, if none).
    first_completion = completions[0] if completions else started
    steady = [r for r in results if r.started >= max(first_completion, started + warmup)] or results
    times = await ledger.call_times([r.call_id for r in steady])

    executed = [t["finished_at"] - r.responded for r in steady if (t := times.get(r.call_id)) and t["finished_at"]]
    closed = [t["closed_at"] - r.responded for r in steady if (t := times.get(r.call_id)) and t["closed_at"]]
    closed_seen = [r.closed_seen - r.responded for r in steady if r.closed_seen]
    to_approval = [r.requested_seen - r.started for r in steady]
    full = [r.completed_seen - r.started for r in steady]

    def med(pairs) -> float | None:
        values = [b - a for a, b in pairs if a is not None and b is not None]
        return round(statistics.median(values) * 1000, 2) if values else None

    t = {r.call_id: times.get(r.call_id, {}) for r in steady}
    breakdown = {
        "turn_start_to_approval_seen": med((r.started, r.requested_seen) for r in steady),
        "approval_seen_to_response_sent": med((r.requested_seen, r.responded) for r in steady),
        "response_sent_to_decision_tx": med((r.responded, t[r.call_id].get("decided_at")) for r in steady),
        "decision_tx_to_claimed": med((t[r.call_id].get("decided_at"), t[r.call_id].get("claimed_at")) for r in steady),
        "claimed_to_finished": med((t[r.call_id].get("claimed_at"), t[r.call_id].get("finished_at")) for r in steady),
        "finished_to_closure_tx": med((t[r.call_id].get("finished_at"), t[r.call_id].get("closed_at")) for r in steady),
        "closure_tx_to_closed_seen": med((t[r.call_id].get("closed_at"), r.closed_seen) for r in steady),
        "closed_seen_to_turn_completed_seen": med((r.closed_seen, r.completed_seen) for r in steady),
    }
    cpu = {name: cpu_after.get(name, 0.0) - cpu_before.get(name, 0.0) for name in cpu_before}
    deps = dependency_cpu_delta(deps_before, deps_after)
    per_rt = max(n, 1)
    return {
        "concurrency": concurrency,
        "load_average_before": load_before,
        "seconds": seconds,
        "warmup_seconds": warmup,
        "round_trips": n,
        "round_trips_in_window": len(in_window),
        "rate_window_seconds": round((deadline if steady_state else finished) - window_start, 3),
        "steady_state": steady_state,
        "latency_sample": len(steady),
        "drain_seconds": round(finished - deadline, 3),
        "round_trips_per_second": rate,
        "errors": errors,
        "latency_ms": {
            "response_to_tool_executed": summary_ms(executed),
            "response_to_closure_committed": summary_ms(closed),
            "response_to_closed_seen": summary_ms(closed_seen),
            "turn_start_to_approval_event": summary_ms(to_approval),
            "turn_start_to_turn_completed": summary_ms(full),
        },
        "breakdown_median_ms": breakdown,
        "cpu_ms_per_rt": {**{SHORT[k]: v / per_rt * 1000 for k, v in cpu.items()},
                          "signoff_total": sum(cpu.values()) / per_rt * 1000},
        "driver_cpu_ms_per_rt": (own_after - own_before) / per_rt * 1000,
        "dependency_cpu_ms_per_rt": {k: v / per_rt * 1000 for k, v in deps.items()},
        # Round trips/s if every CPU of the machine did nothing else (Signoff + driver + dependencies).
        "cpu_bound_round_trips_per_second": (os.cpu_count() or 1) * per_rt
        / max(sum(cpu.values()) + sum(deps.values()) + (own_after - own_before), 1e-9),
        "cpu_utilisation": {
            **{SHORT[k]: v / (finished - started) for k, v in cpu.items()},
            **{k: v / (finished - started) for k, v in deps.items()},
            "driver": (own_after - own_before) / (finished - started),
        },
        **cost_delta(counts_before, counts_after, n),
    }


async def recovery_try(ctx: Context, sessions: int, mode: str) -> dict[str, Any]:
    """`mode` "warm": the two services restart as forks of a preloaded interpreter, as
    `signoff up` restarts them; "cold": as new interpreters, as a container restarts;
    "failover": nothing restarts, a second ledger and a standby publisher, running
    before the kill, carry on (timed from the kill)."""
    deployment, driver, ledger = ctx.deployment, ctx.driver, ctx.ledger
    ids = [f"bench-recovery-{uuid.uuid4().hex}" for _ in range(sessions)]
    waiters = [driver.watch(i) for i in ids]
    if mode == "failover":
        await asyncio.to_thread(deployment.start, *REPLICAS)
    try:
        await asyncio.gather(*(driver.start(i) for i in ids))
        requested = await asyncio.gather(*(w.wait("approval.requested", driver.timeout) for w in waiters))
        await ledger.quiescent()  # every event of the waiting sessions is out
        deployment.kill("approval-ledger")
        deployment.kill("publisher")
        killed = time.time()
        await asyncio.gather(*(driver.approve(i, r) for i, r in zip(ids, requested, strict=True)))
        restarted = killed if mode == "failover" else time.time()
        if mode != "failover":
            deployment.cold = mode == "cold"
            try:
                await asyncio.to_thread(deployment.start, "approval-ledger", "publisher")
            finally:
                deployment.cold = False
        ready_returned = time.time()
        await asyncio.gather(*(driver.finished(w, 60) for w in waiters))
        all_completed = time.time()
    finally:
        for i in ids:
            driver.unwatch(i)
    await ledger.quiescent()
    times = await ledger.call_times([r["call_id"] for r in requested])
    executed = [t["finished_at"] for t in times.values() if t["finished_at"]]
    closed = [t["closed_at"] for t in times.values() if t["closed_at"]]
    decided = [t["decided_at"] for t in times.values() if t["decided_at"]]
    if len(closed) != sessions:
        raise BenchFailure(f"recovery: {len(closed)} of {sessions} approved calls closed")
    if mode == "failover":
        # Back to one of each, the same processes as before: the restarted ones stand
        # by (the publisher) until the replicas go.
        await asyncio.to_thread(deployment.start, "approval-ledger", "publisher")
        for name in REPLICAS:
            deployment.kill(name)
    return {
        "mode": mode,
        "sessions": sessions,
        "ledger_ready": None if mode == "failover" else ready_time(deployment, "approval-ledger") - restarted,
        "publisher_ready": None if mode == "failover" else ready_time(deployment, "publisher") - restarted,
        "start_returned": ready_returned - restarted,
        "first_decision_committed": min(decided) - restarted,
        "first_executed": min(executed) - restarted,
        "first_closed": min(closed) - restarted,
        "all_closed": max(closed) - restarted,
        "all_turns_completed_seen": all_completed - restarted,
    }


RECOVERY_MODES = ("warm", "cold", "failover")
REPLICAS = ("approval-ledger#2", "publisher#2")


def ready_time(deployment: Deployment, service: str) -> float:
    """When the service logged `<service> ready` in its latest start (log clock, ms)."""
    text = deployment.log_path(service).read_text(errors="replace").split("--- start ")[-1]
    for line in text.splitlines():
        if f"{service} ready" in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return math.nan


# --- the floor --------------------------------------------------------------------


async def postgres_floor(schema: str, seconds: float, connections: int = 16) -> dict[str, Any]:
    setup = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    await setup.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, v integer NOT NULL, "
                        "at timestamptz NOT NULL DEFAULT now())")
    pool = [await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema}) for _ in range(connections)]
    done = 0
    deadline = time.time() + seconds

    async def worker(db: asyncpg.Connection) -> None:
        nonlocal done
        insert = await db.prepare("INSERT INTO bench_floor (v) VALUES ($1)")
        while time.time() < deadline:
            async with db.transaction():
                await insert.fetch(1)
            done += 1

    try:
        started = time.time()
        async with Progress("floor: postgres", lambda e: f"{connections} connections: {done:7d} commits  "
                                                         f"{e:4.1f}/{seconds:.0f} s"):
            await asyncio.gather(*(worker(db) for db in pool))
        elapsed = time.time() - started
    finally:
        for db in pool:
            await db.close()
        await setup.execute("DROP TABLE IF EXISTS bench_floor")
        await setup.close()
    return {"connections": connections, "commits": done, "seconds": elapsed, "commits_per_second": done / elapsed}


async def rabbitmq_floor(namespace: str, seconds: float, publishers: int = 16, size: int = 1024) -> dict[str, Any]:
    name = f"{namespace}.bench-floor"
    publishing = await aio_pika.connect(RABBITMQ_URL)
    consuming = await aio_pika.connect(RABBITMQ_URL)
    published = consumed = 0
    body = b"x" * size
    try:
        channel = await publishing.channel(publisher_confirms=True)
        consumer_channel = await consuming.channel()
        await consumer_channel.set_qos(prefetch_count=64)
        queue = await consumer_channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        all_consumed = asyncio.Event()
        stop_publishing = False

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal consumed
            await message.ack()
            consumed += 1
            if stop_publishing and consumed >= published:
                all_consumed.set()

        await queue.consume(on_message)
        deadline = time.time() + seconds

        async def publisher() -> None:
            nonlocal published
            while time.time() < deadline:
                await channel.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=name)
                published += 1

        started = time.time()
        async with Progress("floor: rabbitmq", lambda e: f"{publishers} publishers: {consumed:7d} consumed  "
                                                         f"{e:4.1f}/{seconds:.0f} s"):
            await asyncio.gather(*(publisher() for _ in range(publishers)))
            stop_publishing = True
            if consumed < published:
                await asyncio.wait_for(all_consumed.wait(), 30)
        elapsed = time.time() - started
    finally:
        try:
            cleanup = await consuming.channel()
            await cleanup.queue_delete(name)
        except Exception:  # noqa: BLE001 - best effort; the namespace is removed at the end anyway
            pass
        await publishing.close()
        await consuming.close()
    return {"publishers": publishers, "message_bytes": size, "queue_type": "quorum", "published": published,
            "consumed": consumed, "seconds": elapsed, "messages_per_second": consumed / elapsed}


# --- profiling ------------------------------------------------------------------------


def find_py_spy() -> str | None:
    candidate = Path(sys.executable).parent / "py-spy"
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


def start_profilers(deployment: Deployment, directory: Path, seconds: float) -> list[subprocess.Popen]:
    """py-spy on every service for one level (100 Hz; --nonblocking gave garbled stacks here)."""
    py_spy = find_py_spy()
    directory.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [py_spy, "record", "--pid", str(p.pid), "--rate", "100", "--format", "raw",
             "--duration", str(max(1, int(seconds))), "--output", str(directory / f"{name}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for name, p in deployment.processes.items()
    ]


# Leaf frames of a thread that waits: py-spy's idle detection misses some of them in this VM.
IDLE_LEAVES = ("EpollSelector.select ", "Condition.wait ", "_worker (futures/thread.py)", "Event.wait ",
               "Thread._wait_for_tstate_lock ", "Queue.get ")


def summarize_profile(path: Path, top: int = 25) -> str:
    """Self and inclusive sample shares per function from a py-spy raw (collapsed) file,
    samples whose leaf frame is a wait left out."""
    self_samples: Counter = Counter()
    inclusive: Counter = Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";")]
        if frames[-1].startswith(IDLE_LEAVES):
            idle += n
            continue
        total += n
        self_samples[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    out = [f"{path.stem}: {total} busy samples ({idle} waiting samples left out)"]
    total = max(total, 1)
    out.append("  self %   function")
    for frame, n in self_samples.most_common(top):
        out.append(f"  {100 * n / total:5.1f}   {frame}")
    out.append("  incl %   function")
    for frame, n in inclusive.most_common(top * 2):
        out.append(f"  {100 * n / total:5.1f}   {frame}")
    return "\n".join(out)


def _frame(frame: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)" keeps functions, not lines, apart
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = where.split("/")
    if "site-packages" in parts:
        where = "/".join(parts[parts.index("site-packages") + 1:])
    elif len(parts) > 2:
        where = "/".join(parts[-2:])
    return f"{name} ({where})"


# --- checks ---------------------------------------------------------------------------


async def check_exactly_once(ctx: Context) -> dict[str, Any]:
    db = ctx.ledger.db
    calls = await db.fetchval("SELECT count(*) FROM tool_calls")
    closures = dict(await db.fetch("SELECT kind, count(*) FROM closures GROUP BY 1"))
    claims = await db.fetchrow(
        "SELECT count(*) AS n, coalesce(sum(attempts), 0) AS attempts, "
        "count(*) FILTER (WHERE attempts = 1 AND status = 'finished' AND outcome = 'output') AS clean "
        "FROM execution_claims")
    unclaimed = await db.fetchval(
        "SELECT count(*) FROM tool_calls tc WHERE NOT EXISTS (SELECT 1 FROM execution_claims ec WHERE ec.call_id = tc.id)")
    unclosed = await db.fetchval(
        "SELECT count(*) FROM tool_calls tc WHERE NOT EXISTS (SELECT 1 FROM closures c WHERE c.call_id = tc.id)")
    values = [r[0] for r in await db.fetch(
        "SELECT (output->'value'->>'value')::int FROM closures WHERE kind = 'output' ORDER BY 1")]
    sessions = dict(await db.fetch("SELECT status, count(*) FROM sessions GROUP BY 1"))
    requests = dict(await db.fetch("SELECT status, count(*) FROM approval_requests GROUP BY 1"))
    turns = dict(await db.fetch("SELECT status, count(*) FROM turns GROUP BY 1"))
    channel = await ctx.driver.connection.channel()
    dead = await channel.declare_queue(ctx.driver.topology.dead_letter_queue.name, passive=True)
    dead_letters = dead.declaration_result.message_count
    await channel.close()

    expected = ctx.driver.completed
    problems = []

    def require(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    require(calls == expected, f"{calls} tool calls in the ledger, {expected} round trips completed")
    require(closures == {"output": expected}, f"closures by kind {closures}, expected {{'output': {expected}}}")
    require(claims["n"] == expected and claims["clean"] == expected and claims["attempts"] == expected,
            f"execution claims: {dict(claims)}, expected {expected} each with attempts == 1 and outcome output")
    require(unclaimed == 0, f"{unclaimed} calls without an execution claim")
    require(unclosed == 0, f"{unclosed} calls without a closure")
    require(values == list(range(1, expected + 1)),
            f"counter values are not exactly 1..{expected} (n={len(values)}, distinct={len(set(values))}, "
            f"max={max(values) if values else None}): a tool ran more or less than once per call")
    require(set(sessions) <= {"idle"}, f"sessions by status {sessions}, expected all idle")
    require(set(requests) <= {"approved"}, f"approval requests by status {requests}, expected all approved")
    require(set(turns) <= {"completed"}, f"turns by status {turns}, expected all completed")
    require(dead_letters == 0, f"{dead_letters} dead-lettered message(s)")
    require(not ctx.driver.problems, f"rejections or failed turns: {ctx.driver.problems[:5]}")
    return {
        "round_trips_completed": expected,
        "tool_calls": calls,
        "closures_by_kind": closures,
        "claims": dict(claims),
        "counter_max": max(values) if values else 0,
        "counter_distinct": len(set(values)),
        "sessions_by_status": sessions,
        "dead_letters": dead_letters,
        "events_seen": dict(ctx.driver.events),
        "driver_sent": dict(ctx.driver.sent),
        "violations": problems,
        "passed": not problems,
    }


# --- report -------------------------------------------------------------------------


def _median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def render_table(result: dict[str, Any]) -> str:
    lines = []
    floor = result.get("floor", {})
    pg = floor.get("postgres", {}).get("commits_per_second")
    mq = floor.get("rabbitmq", {}).get("messages_per_second")
    lines.append(f"Signoff bench: {result['machine']['cpus']} CPUs, {result['machine']['platform']}, "
                 f"PostgreSQL ledger, {result['settings']['seconds']:.0f} s per level, load average at start "
                 f"{result['machine']['load_average_at_start'][0]:.1f}")
    lines.append(f"floor: PostgreSQL {_f(pg, 0)} one-row commits/s (16 connections); "
                 f"RabbitMQ {_f(mq, 0)} confirmed persistent 1 KB msgs/s published+consumed (quorum queue)")
    lines.append("")
    head = (f"{'sessions':>8} {'rt/s':>7} │ {'resp→executed ms':^20} │ {'start→approval ms':^20} │ "
            f"{'txn/rt':>6} {'wtx/rt':>6} {'msg/rt':>6} │ {'pg limit':>8} {'mq limit':>8}")
    lines.append(head)
    lines.append(f"{'':>8} {'':>7} │ {'p50':>6} {'p90':>6} {'p99':>6} │ {'p50':>6} {'p90':>6} {'p99':>6} │"
                 f" {'':>6} {'':>6} {'':>6} │ {'txn':>8} {'msgs':>8}")
    lines.append("─" * len(head))
    for level in result["levels"]:
        ex = level["latency_ms"]["response_to_tool_executed"]
        ap = level["latency_ms"]["turn_start_to_approval_event"]
        txn, msgs = level["ledger_transactions_per_rt"], level["messages_per_rt"]
        lines.append(
            f"{level['concurrency']:>8} {level['round_trips_per_second']:>6.1f}{' ' if level['steady_state'] else '*'}"
            f" │ {_f(ex['p50']):>6} {_f(ex['p90']):>6}"
            f" {_f(ex['p99']):>6} │ {_f(ap['p50']):>6} {_f(ap['p90']):>6} {_f(ap['p99']):>6} │ {txn:>6.2f}"
            f" {level['write_transactions_per_rt']:>6.2f} {msgs:>6.2f} │"
            f" {_f(pg / txn if pg and txn else None, 0):>8} {_f(mq / msgs if mq and msgs else None, 0):>8}")
    lines.append("")
    head = (f"{'sessions':>8} │ {'CPU ms per round trip':^47} │ {'driver':>6} │ {'deps ms/rt':^20} │ "
            f"{'cpu limit':>9}")
    lines.append(head)
    lines.append(f"{'':>8} │ {'ledger':>8} {'publisher':>9} {'model':>8} {'executor':>8} {'total':>8} │"
                 f" {'':>6} │ {'pg':>6} {'mq':>6} {'redis':>6} │ {'rt/s':>9}")
    lines.append("─" * len(head))
    for level in result["levels"]:
        cpu, deps = level["cpu_ms_per_rt"], level["dependency_cpu_ms_per_rt"]
        lines.append(
            f"{level['concurrency']:>8} │ {cpu.get('ledger', 0):>8.2f} {cpu.get('publisher', 0):>9.2f}"
            f" {cpu.get('model', 0):>8.2f} {cpu.get('executor', 0):>8.2f} {cpu['signoff_total']:>8.2f} │"
            f" {level['driver_cpu_ms_per_rt']:>6.2f} │ {deps.get('postgres', 0):>6.2f} {deps.get('beam.smp', 0):>6.2f}"
            f" {deps.get('redis-server', 0):>6.2f} │ {level['cpu_bound_round_trips_per_second']:>9.1f}")
    lines.append("")
    lines.append("txn/rt: ledger transitions (inbox rows); wtx/rt: all write transactions (ledger + executor claims + "
                 "publisher mark-sent);")
    if not all(level["steady_state"] for level in result["levels"]):
        lines.append("* the level was too short to reach steady state at this concurrency: rate over the whole level.")
    lines.append("pg limit = PostgreSQL floor ÷ txn/rt; mq limit = RabbitMQ floor ÷ msg/rt; cpu limit = CPUs ÷ "
                 "(Signoff + driver + deps CPU per rt).")
    recovery = result.get("recovery")
    if recovery and recovery.get("tries"):
        lines.append("")
        for mode, m in recovery["median"].items():
            tries = [t for t in recovery["tries"] if t["mode"] == mode]
            if mode == "failover":
                lines.append(f"recovery, failover ({len(tries)} tries, {tries[0]['sessions']} pending, median s from "
                             f"the kill): first executed {_f(m['first_executed'], 3)}, first closed "
                             f"{_f(m['first_closed'], 3)}, all closed {_f(m['all_closed'], 3)}")
                continue
            lines.append(f"recovery, {mode} restart ({len(tries)} tries, {tries[0]['sessions']} pending, median s "
                         f"from restart): ledger ready {_f(m['ledger_ready'], 3)}, publisher ready "
                         f"{_f(m['publisher_ready'], 3)}, first executed {_f(m['first_executed'], 3)}, first closed "
                         f"{_f(m['first_closed'], 3)}, all closed {_f(m['all_closed'], 3)}")
        lines.append("  warm: a fork of an interpreter with the services loaded, as `signoff up` restarts a service; "
                     "cold: a new interpreter, as a container restarts; failover: nothing restarts, a second ledger "
                     "and a standby publisher carry on")
    checks = result.get("checks") or {}
    lines.append("")
    if checks.get("passed") and not result["failures"]:
        lines.append(f"exactly once: OK ({checks['round_trips_completed']} round trips, {checks['tool_calls']} calls, "
                     f"{checks['claims']['n']} claims with attempts == 1, counter 1..{checks['counter_max']})")
    else:
        lines.append("FAILED:")
        for problem in result["failures"] + checks.get("violations", []):
            lines.append(f"  - {problem}")
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    require_services(postgres=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    data_dir = PROJECT_ROOT / "data" / "bench" / f"run-{stamp}"
    deployment = Deployment(store="postgres", data_dir=data_dir)
    result: dict[str, Any] = {
        "started_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average_at_start": os.getloadavg()},
        "settings": {"seconds": args.seconds, "levels": args.levels, "recovery_tries": args.recovery_tries,
                     "recovery_sessions": args.recovery_sessions, "floor_seconds": args.floor_seconds,
                     "namespace": deployment.namespace},
        "levels": [],
        "failures": [],
    }
    driver = Driver(deployment.namespace)
    ledger = LedgerReader(deployment.schema)
    ctx = Context(deployment, driver, ledger, result["failures"])
    opened: list[Any] = []
    # SIGTERM (and SIGINT, even where a shell left it ignored) stops the run; the finally clause cleans up.
    loop, main_task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main_task.cancel)
    try:
        sys.stderr.write(f"[bench] starting the four services (namespace {deployment.namespace}, logs in {data_dir})\n")
        await asyncio.to_thread(deployment.start)
        await driver.open()
        opened.append(driver)
        await ledger.open()
        opened.append(ledger)

        result["floor"] = {
            "postgres": await postgres_floor(deployment.schema, args.floor_seconds),
            "rabbitmq": await rabbitmq_floor(deployment.namespace, args.floor_seconds),
        }
        # Warm every process's pools, caches and imports before measuring.
        await run_level(ctx, min(4, max(args.levels)), args.warmup_seconds, "warm-up")
        for concurrency in args.levels:
            profile = args.profile if args.profile and concurrency == max(args.levels) else None
            level = await run_level(ctx, concurrency, args.seconds, f"level {concurrency}", profile)
            result["levels"].append(level)
        tries = []
        for attempt in range(args.recovery_tries):
            for mode in RECOVERY_MODES:
                async with Progress("recovery", lambda e, a=attempt, m=mode: f"{m} try {a + 1}/{args.recovery_tries}"
                                                                             f"  {e:4.1f} s"):
                    tries.append(await recovery_try(ctx, args.recovery_sessions, mode))
        if tries:
            result["recovery"] = {"tries": tries, "median": {
                mode: {k: _median_of([t[k] for t in tries if t["mode"] == mode]) for k in tries[0]
                       if k not in ("sessions", "mode")}
                for mode in RECOVERY_MODES}}
        result["checks"] = await check_exactly_once(ctx)
    except asyncio.CancelledError:
        result["failures"].append("interrupted")
        sys.stderr.write(f"\n[bench] interrupted; cleaning up namespace and schema {deployment.namespace}\n")
    except Exception as error:
        result["failures"].append(f"{type(error).__name__}: {error}")
        sys.stderr.write(f"\n[bench] failed: {type(error).__name__}: {error}; service logs in {data_dir / 'logs'}\n")
        if not isinstance(error, BenchFailure):
            import traceback

            traceback.print_exc()
    finally:
        for thing in reversed(opened):
            try:
                await thing.close()
            except Exception:  # noqa: BLE001 - best effort
                pass
        await deployment.cleanup()
    result["passed"] = not result["failures"] and bool(result.get("checks", {}).get("passed"))
    if result["passed"] and not args.keep_logs:
        shutil.rmtree(data_dir, ignore_errors=True)
    if args.profile:
        summaries = [summarize_profile(p) for p in sorted(args.profile.glob("*.txt")) if p.stat().st_size]
        (args.profile / "summary.txt").write_text("\n\n".join(summaries) + "\n")
        result["profile"] = str(args.profile)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per level (default 20)")
    parser.add_argument("--levels", default="1,16,64", help="concurrent sessions per level (default 1,16,64)")
    parser.add_argument("--recovery-tries", type=int, default=3, help="kill-and-restart tries (default 3)")
    parser.add_argument("--recovery-sessions", type=int, default=8, help="sessions pending during recovery")
    parser.add_argument("--floor-seconds", type=float, default=4.0, help="seconds per floor measurement")
    parser.add_argument("--warmup-seconds", type=float, default=2.0, help="unmeasured warm-up before the levels")
    parser.add_argument("--output", type=Path, help="JSON figures (default data/bench/bench-<timestamp>.json)")
    parser.add_argument("--quick", action="store_true", help="levels 1,4 at 3 s each, 1 recovery try")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="py-spy every service during the highest level; raw stacks and summary.txt in DIR")
    parser.add_argument("--keep-logs", action="store_true", help="keep the services' logs of a passing run")
    args = parser.parse_args(argv)
    if args.quick:
        args.levels, args.seconds, args.recovery_tries = "1,4", 3.0, 1
        args.floor_seconds, args.warmup_seconds = 1.5, 1.0
    args.levels = [int(x) for x in str(args.levels).split(",") if x.strip()]
    if not args.levels or min(args.levels) < 1:
        parser.error("--levels needs positive integers, e.g. 1,16,64")
    if args.output is None:
        args.output = PROJECT_ROOT / "data" / "bench" / f"bench-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    if args.profile is not None:
        if find_py_spy() is None:
            parser.error("--profile needs py-spy: .venv/bin/pip install py-spy (it is not a project dependency)")
        args.profile = args.profile.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    result = asyncio.run(bench(args))
    result["wall_seconds"] = round(time.time() - started, 1)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(render_table(result))
    print(f"\nfigures: {args.output}  ({result['wall_seconds']:.0f} s in all)")
    if args.profile:
        print(f"profile: {args.profile}/summary.txt")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
