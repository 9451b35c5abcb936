"""`make bench-backlog`: what a backlog of requests waiting for a person costs
PostgreSQL ("Costs that grow with the backlog").

    .venv/bin/python -m tests.bench.backlog [--pending 0,1000,5000,20000] [--rate 150]
                                           [--idle-seconds 60] [--approvals 200] [--output PATH]

Per level, a fresh deployment (the four services, PostgreSQL, the ledger's gauge on):
1. the backlog: `pending` sessions started over the bus (`turn.start`, paced at
   `--rate` per second), each left waiting on its approval request; built once every
   request is committed (the rate reached is reported: sessions / seconds from the
   first start to the last request committed);
2. idle: nothing due, nothing sent, for `--idle-seconds`: PostgreSQL's CPU in
   CPU-seconds per minute (the sweeps every second, the gauge every 5 s, the
   publisher's and the executor's polls);
3. approvals: `--approvals` round trips (8 slots, closed loop; start, approve, tool
   runs, turn completes): PostgreSQL's CPU per round trip, in ms.

PostgreSQL's CPU is that of this deployment's own backends only (the pids
`pg_stat_activity` shows for its roles, from /proc), so other work on the machine's
shared PostgreSQL does not count. The load average is reported with each level: on a
loaded machine compare ratios to the empty ledger's (level 0) of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from tests.bench.adapter import ChannelAdapter
from tests.bench.cpu import process_cpu
from tests.harness import POSTGRES_URL, Deployment, free_port, require_services

SERVICES = ("approval-ledger", "publisher", "model-step", "tool-executor")


async def backend_cpu(admin: asyncpg.Connection, namespace: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend of this deployment's roles."""
    pids = await admin.fetch("SELECT pid FROM pg_stat_activity WHERE usename LIKE $1", f"{namespace}\\_%")
    return {row["pid"]: cpu for row in pids if (cpu := process_cpu(row["pid"])) is not None}


def delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


async def pending_count(ledger: asyncpg.Connection) -> int:
    return await ledger.fetchval("SELECT count(*) FROM approval_requests WHERE status = 'pending'")


async def build_backlog(adapter: ChannelAdapter, ledger: asyncpg.Connection, pending: int, rate: float) -> float:
    """`pending` sessions started at `rate` per second, each left at its approval; the rate reached."""
    started = time.monotonic()
    for n in range(pending):
        await adapter.start(f"bench-backlog-{n}")
        ahead = started + (n + 1) / rate - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
    while (await pending_count(ledger)) < pending:
        await asyncio.sleep(0.5)
    return pending / max(time.monotonic() - started, 1e-9) if pending else 0.0


async def approvals(adapter: ChannelAdapter, count: int, slots: int = 8) -> None:
    left = count

    async def slot() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await adapter.round_trip()

    await asyncio.gather(*(slot() for _ in range(slots)))


async def level(pending: int, rate: float, idle_seconds: float, round_trips: int) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="signoff-bench-backlog-"))
    deployment = Deployment(store="postgres", data_dir=base / "data")
    deployment.metrics_ports["approval-ledger"] = free_port()  # the gauge runs only with /metrics on
    result: dict[str, Any] = {"pending": pending, "load_average_at_start": os.getloadavg()}
    admin = await asyncpg.connect(POSTGRES_URL)
    try:
        deployment.start(*SERVICES)
        ledger = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": deployment.namespace})
        adapter = ChannelAdapter(timeout=120.0)
        async with deployment.console() as console:
            await adapter.open(console)
            result["sessions_per_second"] = round(await build_backlog(adapter, ledger, pending, rate), 1)
            await asyncio.sleep(5)  # the last events relayed, the gauge's first fold done
            result["pending_measured"] = await pending_count(ledger)
            before, t0 = await backend_cpu(admin, deployment.namespace), time.monotonic()
            await asyncio.sleep(idle_seconds)
            after, t1 = await backend_cpu(admin, deployment.namespace), time.monotonic()
            result["idle_cpu_seconds_per_minute"] = round(delta(before, after) * 60 / (t1 - t0), 4)
            result["load_average_idle"] = os.getloadavg()
            before = await backend_cpu(admin, deployment.namespace)
            await approvals(adapter, round_trips)
            after = await backend_cpu(admin, deployment.namespace)
            result["cpu_ms_per_approval"] = round(1000 * delta(before, after) / round_trips, 2)
            result["load_average_end"] = os.getloadavg()
            result["problems"] = adapter.problems[:5]
        await ledger.close()
    finally:
        await admin.close()
        await deployment.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.backlog")
    parser.add_argument("--pending", default="0,1000,5000,20000")
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--approvals", type=int, default=200)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--levers", help="instead: each lever alone, with and without its index, at these backlogs")
    args = parser.parse_args(argv)
    require_services(postgres=True)
    if args.levers:
        for pending in (int(p) for p in args.levers.split(",")):
            for row in asyncio.run(levers(pending)):
                print(json.dumps(row), flush=True)
        return 0
    results = []
    for pending in (int(p) for p in args.pending.split(",")):
        figures = asyncio.run(level(pending, args.rate, args.idle_seconds, args.approvals))
        print(json.dumps(figures), flush=True)
        results.append(figures)
    empty = next((r for r in results if r["pending"] == 0), None)
    if empty:
        for r in results:
            for key in ("idle_cpu_seconds_per_minute", "cpu_ms_per_approval"):
                r[f"{key}_vs_empty"] = round(r[key] / empty[key], 2) if empty[key] else None
    print(f"{'pending':>8} {'sessions/s':>10} {'idle CPU-s/min':>15} {'x empty':>8} {'ms/approval':>12} {'x empty':>8}")
    for r in results:
        print(
            f"{r['pending']:>8} {r['sessions_per_second']:>10} {r['idle_cpu_seconds_per_minute']:>15} "
            f"{r.get('idle_cpu_seconds_per_minute_vs_empty', '')!s:>8} {r['cpu_ms_per_approval']:>12} "
            f"{r.get('cpu_ms_per_approval_vs_empty', '')!s:>8}"
        )
    if args.output:
        args.output.write_text(json.dumps(results, indent=2))
    return 0


# --- each lever's own A/B: the statements' server time with and without its index -------------

# The gauge's read before its partial indexes: every pending row joined to its call.
_OLD_GAUGE = (
    "SELECT c.tool, count(*), min(r.created_at), min(r.expires_at) FROM approval_requests r"
    " JOIN tool_calls c ON c.id = r.call_id WHERE r.status = 'pending' GROUP BY c.tool"
)
# Retention's inbox read without its time index (no index on received_at, no order).
_OLD_INBOX = "SELECT message_id FROM inbox WHERE received_at < $1 LIMIT 500"


async def server_ms(conn, sql: str, values: tuple, runs: int = 15) -> float:
    """The median of PostgreSQL's own execution time for one statement (EXPLAIN ANALYZE)."""
    times = []
    for _ in range(runs):
        plan = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *values)
        times.append((json.loads(plan) if isinstance(plan, str) else plan)[0]["Execution Time"])
    return sorted(times)[len(times) // 2]


async def levers(pending: int) -> list[dict[str, Any]]:
    """A schema with `pending` requests waiting (and as many decided), seeded as the plan
    tests seed it, never analyzed, autovacuum off; per lever, its statement's time as it
    is and with its index dropped (in a transaction rolled back), or the statement before."""
    from datetime import timedelta

    from sqlalchemy.dialects import postgresql

    from services.approval_ledger import store_sql
    from shared.ledger import backlog, retention
    from shared.ledger.database import migrate
    from shared.messages import now
    from tests.integration.test_backlog_indexes import _SEED, STALE

    def compiled(query, **parameters) -> tuple[str, tuple]:
        done = query.compile(dialect=postgresql.asyncpg.dialect())
        values = done.construct_params(parameters)
        return str(done), tuple(values[name] for name in done.positiontup)

    base = Path(tempfile.mkdtemp(prefix="signoff-bench-levers-"))
    deployment = Deployment(store="postgres", data_dir=base / "data")
    deployment.setup()
    results = []
    try:
        async with deployment.engine("approval-ledger") as engine:
            await migrate(engine, deployment.settings)
        conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": deployment.namespace})
        for table in STALE:
            await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
        for statement in _SEED:
            await conn.execute(statement.replace(":n", "$1"), pending)
        # Folded, as the gauge folds it within 5 s of the changes.
        await conn.execute(
            "WITH gone AS (DELETE FROM pending_tally RETURNING tool, delta)"
            " INSERT INTO pending_tally (tool, delta) SELECT tool, sum(delta) FROM gone GROUP BY tool"
        )
        at = now()
        cases = [
            (
                "escalation sweep (every 1 s)",
                compiled(store_sql._DUE_ESCALATIONS, at=at, limit=100),
                "ix_approval_requests_pending_escalation",
                None,
            ),
            (
                "expiry sweep (every 1 s)",
                compiled(store_sql._DUE, at=at, limit=100),
                "ix_approval_requests_pending_expiry",
                None,
            ),
            (
                "a session's pending requests (approval path)",
                compiled(store_sql._PENDING, session_id="ses_7"),
                "ix_approval_requests_pending_session",
                None,
            ),
            (
                "a request and its calls (approval path)",
                compiled(store_sql._REQUEST_AND_CALLS, request_id="apr_13", session_id="ses_7", responder="a"),
                "ix_approval_requests_pending_session",
                None,
            ),
            ("the gauge: the count per tool (every 5 s)", compiled(backlog._TALLY), None, (_OLD_GAUGE, ())),
            (
                "the gauge: one tool's heads",
                compiled(backlog._HEADS, tool="fetch"),
                "ix_approval_requests_pending_tool_age",
                None,
            ),
            (
                "retention: the oldest inbox row",
                compiled(retention._OLDEST["inbox rows"]),
                None,
                (_OLD_INBOX, (at - timedelta(hours=1),)),
            ),
        ]
        for name, (sql, values), index, before in cases:
            after_ms = await server_ms(conn, sql, values)
            if index is not None:
                dropped = conn.transaction()
                await dropped.start()
                await conn.execute(f"DROP INDEX {index}")
                before_ms = await server_ms(conn, sql, values)
                await dropped.rollback()  # the index stays for the next case
            else:
                assert before is not None
                before_ms = await server_ms(conn, before[0], before[1])
            results.append(
                {"lever": name, "pending": pending, "before_ms": round(before_ms, 3), "after_ms": round(after_ms, 3)}
            )
        await conn.close()
    finally:
        await deployment.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    return results


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
