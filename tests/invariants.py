"""The end-of-run check: what must hold once a run of the real services has
settled. `make bench`, `make chaos` (and its short test) and the harness's
`assert_nothing_left_in_any_queue` all check through this module, on either store.

`check_run` always checks, from the ledger and the broker:
- nothing lost or stuck: every queue of the deployment is empty (after waiting up
  to `queue_timeout` for it to drain), nothing dead-lettered;
- every committed outbox row was relayed (no `sent_at` missing);
- no session is still `running`;
- no call is `closed` without a closure;
- the audit log verifies: every entry and both hash chains intact (entries not
  yet linked into the global chain are allowed).
Given what the client saw (`shown`: call id -> the request ids its
`approval.requested` events carried):
- every request shown is in the ledger, and is pending or its call is closed;
- no request id was renamed: each call was shown under exactly one request id.
Given the sink's requests (`sink_requests`):
- no tool ran twice: each outward call's Idempotency-Key reached the sink once.
Given `round_trips` (the bench's workload: every call of the run one approved
`count` call, N = the round trips the client saw complete):
- N tool calls; exactly one closure per call, all `output`; exactly one execution
  claim per call, each with attempts == 1, finished, outcome `output`;
- the counter values in the closures are exactly 1..N (the executor is never
  restarted, so a second run of any call leaves a duplicate or a gap);
- every session idle, every request approved, every turn completed.
And whatever the client itself saw go wrong (`seen`) is a violation as it stands.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, exists, func, select

from shared import audit
from shared.ledger.tables import (
    ApprovalRequest,
    Closure,
    ExecutionClaim,
    OutboxRow,
    Session,
    ToolCall,
    Turn,
)
from shared.topology import Topology


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.violations

    def require(self, ok: bool, what: str) -> None:
        if not ok:
            self.violations.append(what)


async def queues_left(console, namespace: str, timeout: float = 0.0) -> dict[str, int]:
    """Messages still ready in the deployment's queues (the dead-letter queue too), by
    queue; waits up to `timeout` for them to drain (0: look once)."""

    async def left() -> dict[str, int]:
        # On the underlying channel: aio-pika answers a repeated passive declare on a
        # robust channel from its cache, so the counts would never change between looks.
        channel = await console.channel.get_underlay_channel()
        counts = {}
        for name in Topology(namespace).all_queue_names():
            declared = await channel.queue_declare(name, passive=True)
            if declared.message_count:
                counts[name] = declared.message_count
        return counts

    deadline = time.monotonic() + timeout
    while (counts := await left()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return counts


async def _by(db, column) -> dict[str, int]:
    return dict((await db.execute(select(column, func.count()).group_by(column))).all())


async def check_run(console, *, queue_timeout: float = 0.0, shown: dict[str, set[str]] | None = None,
                    sink_requests: list[dict] | None = None, round_trips: int | None = None,
                    seen: Iterable[str] = ()) -> Verdict:
    """Every check above that the arguments allow, through a `services.operations.console.Console`
    of the deployment (its ledger sessions and its channel). Violations are sentences."""
    verdict = Verdict()
    figures = verdict.figures
    require = verdict.require
    async with console.ledger.sessions() as db:
        figures["tool_calls"] = await db.scalar(select(func.count()).select_from(ToolCall))
        figures["closures_by_kind"] = await _by(db, Closure.kind)
        figures["sessions_by_status"] = await _by(db, Session.status)
        figures["requests_by_status"] = await _by(db, ApprovalRequest.status)
        figures["turns_by_status"] = await _by(db, Turn.status)
        figures["unsent"] = await db.scalar(select(func.count()).select_from(OutboxRow)
                                            .where(OutboxRow.sent_at.is_(None)))
        closed_unclosed = list(await db.scalars(select(ToolCall.id).where(
            ToolCall.status == "closed", ~exists().where(Closure.call_id == ToolCall.id))))
        if shown is not None:
            requests = {r.id: r for r in (await db.execute(
                select(ApprovalRequest.id, ApprovalRequest.status, ApprovalRequest.call_id))).all()}
            closed = set(await db.scalars(select(Closure.call_id)))
        if round_trips is not None:
            claims = (await db.execute(select(
                func.count().label("n"),
                func.coalesce(func.sum(ExecutionClaim.attempts), 0).label("attempts"),
                func.count().filter(and_(ExecutionClaim.attempts == 1, ExecutionClaim.status == "finished",
                                         ExecutionClaim.outcome == "output")).label("clean"),
            ))).one()
            unclaimed = await db.scalar(select(func.count()).select_from(ToolCall).where(
                ~exists().where(ExecutionClaim.call_id == ToolCall.id)))
            unclosed = await db.scalar(select(func.count()).select_from(ToolCall).where(
                ~exists().where(Closure.call_id == ToolCall.id)))
            outputs = list(await db.scalars(select(Closure.output).where(Closure.kind == "output")))
    from shared.ledger.console_reads import read_audit

    audited = audit.verify(*await read_audit(console.settings), by_txid=console.settings.is_postgres)
    figures["audit_entries"] = audited.entries
    left = await queues_left(console, console.topology.namespace, queue_timeout)
    dead_letter_queue = console.topology.dead_letter_queue.name
    figures["dead_letters"] = left.get(dead_letter_queue, 0)
    figures["queues_left"] = left

    if shown is not None:
        figures["requests_shown"] = sum(len(ids) for ids in shown.values())
        for request_id in sorted(set().union(*shown.values())):
            request = requests.get(request_id)
            if request is None:
                require(False, f"request {request_id} was shown but is not in the ledger")
            else:
                require(request.status == "pending" or request.call_id in closed,
                        f"request {request_id} is {request.status} but its call has no closure")
        for call_id, ids in shown.items():
            require(len(ids) == 1, f"call {call_id} was shown under {len(ids)} request ids: {sorted(ids)}")
    if sink_requests is not None:
        keys = Counter(r["headers"].get("Idempotency-Key") for r in sink_requests)
        verdict.violations += [f"an outward call ran {n} times (key {key})" for key, n in keys.items() if n > 1]
    for call_id in closed_unclosed:
        require(False, f"call {call_id} is closed without a closure")
    if audited.broken is not None:
        require(False, f"the audit log is broken at {audited.broken.line()}")
    running = figures["sessions_by_status"].get("running", 0)
    require(not running, f"{running} session(s) still running after settling")
    require(not figures["unsent"], f"{figures['unsent']} outbox row(s) never sent")
    for name, count in left.items():
        if name != dead_letter_queue:
            require(False, f"queue {name} still holds {count} message(s)")
    require(not figures["dead_letters"], f"{figures['dead_letters']} dead-lettered message(s)")

    if round_trips is not None:
        expected, calls, closures = round_trips, figures["tool_calls"], figures["closures_by_kind"]
        values = sorted(v for o in outputs if isinstance(v := ((o or {}).get("value") or {}).get("value"), int))
        figures["claims"] = dict(claims._mapping)
        figures["counter_max"] = max(values) if values else 0
        figures["counter_distinct"] = len(set(values))
        require(calls == expected, f"{calls} tool calls in the ledger, {expected} round trips completed")
        require(closures == {"output": expected}, f"closures by kind {closures}, expected {{'output': {expected}}}")
        require(claims.n == expected and claims.clean == expected and claims.attempts == expected,
                f"execution claims: {figures['claims']}, expected {expected} each with attempts == 1 and outcome "
                f"output")
        require(unclaimed == 0, f"{unclaimed} calls without an execution claim")
        require(unclosed == 0, f"{unclosed} calls without a closure")
        require(len(values) == len(outputs) and values == list(range(1, expected + 1)),
                f"counter values are not exactly 1..{expected} (n={len(outputs)}, distinct={len(set(values))}, "
                f"max={max(values) if values else None}): a tool ran more or less than once per call")
        for what, statuses, allowed in (("sessions", figures["sessions_by_status"], "idle"),
                                        ("approval requests", figures["requests_by_status"], "approved"),
                                        ("turns", figures["turns_by_status"], "completed")):
            require(set(statuses) <= {allowed}, f"{what} by status {statuses}, expected all {allowed}")
    verdict.violations += list(seen)
    return verdict
