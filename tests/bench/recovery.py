"""Recovery: sessions wait on approval, approval-ledger and publisher are SIGKILLed,
the approvals are published while they are down, and the time to the first of
those calls executed and closed is taken, three ways (warm, cold, failover)."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from datetime import datetime
from typing import Any

from tests.bench.adapter import BenchFailure
from tests.bench.levels import Context
from tests.harness import Deployment

RECOVERY_MODES = ("warm", "cold", "failover")
REPLICAS = ("approval-ledger#2", "publisher#2")


async def recovery_try(ctx: Context, sessions: int, mode: str) -> dict[str, Any]:
    """`mode` "warm": the two services restart as forks of a preloaded interpreter, as
    `signoff up` restarts them; "cold": as new interpreters, as a container restarts;
    "failover": nothing restarts, a second ledger and a standby publisher, running
    before the kill, carry on (timed from the kill)."""
    deployment, adapter, ledger = ctx.deployment, ctx.adapter, ctx.ledger
    ids = [f"bench-recovery-{uuid.uuid4().hex}" for _ in range(sessions)]
    waiters = [adapter.watch(i) for i in ids]
    if mode == "failover":
        await asyncio.to_thread(deployment.start, *REPLICAS)
    try:
        await asyncio.gather(*(adapter.start(i) for i in ids))
        requested = await asyncio.gather(*(w.wait("approval.requested", adapter.timeout) for w in waiters))
        await ledger.quiescent()  # every event of the waiting sessions is out
        deployment.kill("approval-ledger")
        deployment.kill("publisher")
        killed = time.time()
        await asyncio.gather(*(adapter.approve(i, r) for i, r in zip(ids, requested, strict=True)))
        restarted = killed if mode == "failover" else time.time()
        if mode != "failover":
            deployment.cold = mode == "cold"
            try:
                await asyncio.to_thread(deployment.start, "approval-ledger", "publisher")
            finally:
                deployment.cold = False
        ready_returned = time.time()
        await asyncio.gather(*(adapter.finished(w, 60) for w in waiters))
        all_completed = time.time()
    finally:
        for i in ids:
            adapter.unwatch(i)
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


def ready_time(deployment: Deployment, service: str) -> float:
    """When the service logged `<service> ready` in its latest start (log clock, ms)."""
    text = deployment.log_path(service).read_text(errors="replace").split("--- start ")[-1]
    for line in text.splitlines()[1:]:
        try:
            record = json.loads(line)
        except ValueError:  # a child's last words before its logging was set up
            continue
        if record["message"].startswith(f"{service} ready"):
            return datetime.fromisoformat(record["time"]).timestamp()
    return math.nan
