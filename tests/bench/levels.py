"""One load level: N slots in a closed loop of round trips for a number of seconds,
the rate over the steady-state window, latencies from the driver's clock and the
ledger's timestamps, and the costs (transactions, messages, CPU) per round trip."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from tests.bench.adapter import BenchFailure, ChannelAdapter, RoundTrip
from tests.bench.cpu import (
    SHORT,
    children_cpu,
    dependency_cpu,
    dependency_cpu_delta,
    service_cpu,
    start_profilers,
    statement_counts,
)
from tests.bench.report import Progress, summary_ms
from tests.harness import POSTGRES_URL, Deployment
from tests.long_session import TABLE_BYTES


def ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


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
            "bytes": sum((await self.table_bytes()).values()),
        }

    async def table_bytes(self) -> dict[str, int]:
        """What each ledger table holds, in bytes (PostgreSQL's size of every row)."""
        return {name: int(await self.db.fetchval(query)) for name, query in TABLE_BYTES.items()}

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
        # What the ledger's rows grew by (before retention deletes sent outbox and old inbox rows).
        "ledger_bytes_per_rt": (after["bytes"] - before["bytes"]) / n,
    }


@dataclass
class Context:
    deployment: Deployment
    adapter: ChannelAdapter
    ledger: LedgerReader
    failures: list[str] = field(default_factory=list)


async def run_level(ctx: Context, concurrency: int, seconds: float, label: str,
                    profile_dir: Path | None = None) -> dict[str, Any]:
    adapter, ledger = ctx.adapter, ctx.ledger
    await ledger.quiescent()
    counts_before = await ledger.counts()
    sql_before = await statement_counts(ctx.deployment)
    cpu_before, deps_before, own_before = service_cpu(ctx.deployment), dependency_cpu(), time.process_time()
    children_before = children_cpu(ctx.deployment)
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
                results.append(await adapter.round_trip())
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
    children_after = children_cpu(ctx.deployment)
    counts_after = await ledger.counts()
    sql_after = await statement_counts(ctx.deployment)
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
        # The services' children (the python tool processes), not in cpu_ms_per_rt nor in the cpu limit.
        "tool_process_cpu_ms_per_rt": (children_after - children_before) / per_rt * 1000,
        # SQL statements (an executemany counts once) and transactions ended, per round trip, by service.
        "sql_per_rt": {
            service: {k: (sql_after[service].get(k, 0) - v) / per_rt for k, v in before.items()}
            for service, before in sql_before.items()
            if service in sql_after
        },
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


class SqliteLedgerReader:
    """`LedgerReader` for the embedded default: the same figures from the SQLite file,
    through SQLAlchemy Core (times come back aware, as the ledger stores them)."""

    def __init__(self, settings) -> None:
        self.settings = settings

    async def open(self) -> None:
        from sqlalchemy.ext.asyncio import create_async_engine

        self.engine = create_async_engine(self.settings.ledger_url, connect_args={"timeout": 30})

    async def close(self) -> None:
        await self.engine.dispose()

    async def _rows(self, statement) -> list:
        async with self.engine.connect() as db:
            return list((await db.execute(statement)).all())

    async def counts(self) -> dict[str, Any]:
        from sqlalchemy import distinct, func, select

        from shared.ledger.tables import TABLES

        inbox, outbox, claims = TABLES["inbox"], TABLES["outbox"], TABLES["execution_claims"]
        return {
            "inbox": dict(await self._rows(select(inbox.c.message_type, func.count()).group_by(inbox.c.message_type))),
            "outbox": dict(await self._rows(
                select(outbox.c.message_type, func.count()).group_by(outbox.c.message_type))),
            "relay_batches": (await self._rows(select(func.count(distinct(outbox.c.sent_at)))))[0][0],
            "claims": (await self._rows(select(func.count()).select_from(claims)))[0][0],
            "bytes": await self.file_bytes(),
        }

    async def file_bytes(self) -> int:
        """What the ledger file holds, in bytes (pages in use; SQLite has no per-row size
        without the dbstat table, which Debian's build leaves out): the same key as
        PostgreSQL's figure, so `cost_delta` reads both stores alike."""
        from sqlalchemy import text

        pages = (await self._rows(text("PRAGMA page_count")))[0][0]
        free = (await self._rows(text("PRAGMA freelist_count")))[0][0]
        size = (await self._rows(text("PRAGMA page_size")))[0][0]
        return int((pages - free) * size)

    async def quiescent(self, timeout: float = 15.0) -> None:
        from sqlalchemy import func, select

        from shared.ledger.tables import TABLES

        outbox = TABLES["outbox"]
        deadline = time.time() + timeout
        while time.time() < deadline:
            unsent = await self._rows(select(func.count()).select_from(outbox).where(outbox.c.sent_at.is_(None)))
            if unsent[0][0] == 0:
                return
            await asyncio.sleep(0.05)
        raise BenchFailure(f"outbox rows still unsent after {timeout:.0f}s")

    async def call_times(self, call_ids: list[str]) -> dict[str, dict[str, float | None]]:
        from sqlalchemy import select

        from shared.ledger.tables import TABLES

        calls, requests, decisions = TABLES["tool_calls"], TABLES["approval_requests"], TABLES["decisions"]
        claims, closures = TABLES["execution_claims"], TABLES["closures"]
        found: dict[str, dict[str, float | None]] = {}
        for start in range(0, len(call_ids), 500):
            rows = await self._rows(
                select(calls.c.id, decisions.c.decided_at, claims.c.claimed_at, claims.c.finished_at,
                       closures.c.created_at.label("closed_at"))
                .select_from(calls.outerjoin(requests, requests.c.call_id == calls.c.id)
                             .outerjoin(decisions, decisions.c.request_id == requests.c.id)
                             .outerjoin(claims, claims.c.call_id == calls.c.id)
                             .outerjoin(closures, closures.c.call_id == calls.c.id))
                .where(calls.c.id.in_(call_ids[start:start + 500])))
            for r in rows:
                found[r.id] = {k: ts(getattr(r, k)) for k in ("decided_at", "claimed_at", "finished_at", "closed_at")}
        return found
