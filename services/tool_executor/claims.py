"""Durable claims: a call is claimed in the ledger before its tool runs (invariant 4).

The claim row decides everything a redelivery may do: report a recorded result,
wait for a live holder, retry a read or idempotent call with the same key, or
close an outward call as outcome-unknown. Leases are timestamps in the row, so
losing Redis loses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import async_sessionmaker

from services.approval_ledger.models import ExecutionClaim
from shared.messages import now


@dataclass(frozen=True)
class ClaimOutcome:
    """What the executor must do with a call it was asked to run."""

    action: Literal["run", "report", "wait", "lost"]
    attempt: int = 1
    outcome: str | None = None
    result: dict[str, Any] | None = None
    wait_until: datetime | None = None


def decide(claim: ExecutionClaim | None, *, effect: str, at: datetime) -> ClaimOutcome:
    """Pure: given the current claim row, what may happen now."""
    if claim is None:
        return ClaimOutcome("run", attempt=1)
    if claim.status == "finished":
        return ClaimOutcome("report", outcome=claim.outcome, result=claim.result)
    if claim.lease_expires_at > at:
        return ClaimOutcome("wait", wait_until=claim.lease_expires_at)
    # The holder died mid-call.
    if effect == "outward":
        return ClaimOutcome("lost")
    return ClaimOutcome("run", attempt=claim.attempts + 1)


class Claims:
    def __init__(self, sessions: async_sessionmaker, holder: str, lease_seconds: float) -> None:
        self.sessions = sessions
        self.holder = holder
        self.lease = timedelta(seconds=lease_seconds)

    async def take(self, call_id: str, idempotency_key: str, effect: str) -> ClaimOutcome:
        async with self.sessions() as db, db.begin():
            at = now()
            claim = (
                await db.execute(select(ExecutionClaim).where(ExecutionClaim.call_id == call_id).with_for_update())
            ).scalar_one_or_none()
            verdict = decide(claim, effect=effect, at=at)
            if verdict.action == "run" and claim is None:
                db.add(ExecutionClaim(call_id=call_id, idempotency_key=idempotency_key, status="claimed",
                                      holder=self.holder, lease_expires_at=at + self.lease, attempts=1, claimed_at=at))
                try:
                    await db.flush()
                except IntegrityError:
                    # Another executor claimed it in the meantime: look again.
                    return ClaimOutcome("wait", wait_until=at)
            elif verdict.action == "run":
                claim.holder, claim.attempts, claim.lease_expires_at = self.holder, verdict.attempt, at + self.lease
            elif verdict.action == "lost":
                claim.status, claim.outcome, claim.finished_at = "finished", "outcome_unknown", at
                claim.result = {"error": "the executor holding this outward call stopped mid-call; "
                                         "it was not retried and its outcome is unknown"}
            return verdict

    async def renew(self, call_id: str) -> bool:
        async with self.sessions() as db, db.begin():
            result = await db.execute(
                update(ExecutionClaim)
                .where(ExecutionClaim.call_id == call_id, ExecutionClaim.holder == self.holder,
                       ExecutionClaim.status == "claimed")
                .values(lease_expires_at=now() + self.lease)
            )
            return result.rowcount == 1

    async def finish(self, call_id: str, outcome: str, result: dict[str, Any]) -> bool:
        """Record the result; False if this executor no longer holds the claim."""
        async with self.sessions() as db, db.begin():
            updated = await db.execute(
                update(ExecutionClaim)
                .where(ExecutionClaim.call_id == call_id, ExecutionClaim.holder == self.holder,
                       ExecutionClaim.status == "claimed")
                .values(status="finished", outcome=outcome, result=result, finished_at=now())
            )
            return updated.rowcount == 1
