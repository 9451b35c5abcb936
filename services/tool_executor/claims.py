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

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from shared.authorization import Authorization, GrantTerms, grant_seal_names, request_seal_names
from shared.ledger.claims import ClaimRows
from shared.ledger.tables import ExecutionClaim
from shared.messages import Outcome, now
from shared.signatures import arguments_fingerprint


@dataclass(frozen=True)
class ClaimOutcome:
    """What the executor must do with a call it was asked to run."""

    action: Literal["run", "report", "wait", "lost", "refused"]
    attempt: int = 1
    outcome: Outcome | None = None
    result: dict[str, Any] | None = None
    # "refused": why the ledger's record does not allow this call.
    refusal: str | None = None
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


# What each write puts in the claim row, as values: pure, so the rules can be stated without a database.


def fresh_claim(
    call_id: str, idempotency_key: str, holder: str, *, at: datetime, lease: timedelta, authorization: str
) -> dict[str, Any]:
    """A first claim: held by `holder` as attempt 1, its lease ending one lease from now,
    under the ledger's `authorization` (the ledger believes its result only then)."""
    return {
        "call_id": call_id,
        "idempotency_key": idempotency_key,
        "status": "claimed",
        "holder": holder,
        "lease_expires_at": renewed_lease(at, lease),
        "attempts": 1,
        "claimed_at": at,
        "authorization": authorization,
    }


def retaken_claim(holder: str, attempt: int, *, at: datetime, lease: timedelta) -> dict[str, Any]:
    """A dead holder's read or idempotent call, taken over by `holder` as the next attempt."""
    return {"holder": holder, "attempts": attempt, "lease_expires_at": renewed_lease(at, lease)}


def renewed_lease(at: datetime, lease: timedelta) -> datetime:
    """A lease taken or renewed at `at` ends one lease later."""
    return at + lease


LOST = "the executor holding this outward call stopped mid-call; it was not retried and its outcome is unknown"


def lost_call(at: datetime) -> dict[str, Any]:
    """A dead holder's outward call is finished as outcome-unknown, never run again (invariant 4)."""
    return {"status": "finished", "outcome": "outcome_unknown", "finished_at": at, "result": {"error": LOST}}


class _Refused(Exception):
    """The ledger's record does not allow the call (the text says why)."""


@dataclass(frozen=True)
class CallOnRecord:
    """A call as the ledger recorded it, with its request (and the ledger's seal over
    it) and decision if it needed one."""

    tool: str
    arguments: dict[str, Any]
    request_id: str | None
    decision: str | None
    call_seal: str | None = None
    session_id: str | None = None
    # When the ledger recorded (and so decided) the call.
    created_at: datetime | None = None
    # The grant the ledger recorded as authorizing it with no card, and that grant's row.
    grant_id: str | None = None
    grant: GrantOnRecord | None = None


@dataclass(frozen=True)
class GrantOnRecord:
    """A grant's row as the executor reads it (`grants`), with the ledger's seal over its terms."""

    terms: GrantTerms
    revoked_at: datetime | None
    seal: str | None


def call_on_record(record: Any) -> CallOnRecord:
    """The executor's read of the ledger's rows (shared/ledger/call_on_record.py) as a value."""
    grant = None
    if record.grant_row_id is not None:
        grant = GrantOnRecord(
            GrantTerms(
                grant_id=record.grant_row_id,
                session_id=record.grant_session_id,
                tool=record.grant_tool,
                tool_version=record.tool_version,
                target=record.target,
                approvals_required=record.approvals_required,
                expires_at=record.expires_at,
            ),
            record.revoked_at,
            record.grant_seal,
        )
    return CallOnRecord(
        record.tool,
        record.arguments,
        record.id,
        record.decision,
        record.call_seal,
        session_id=record.session_id,
        created_at=record.created_at,
        grant_id=record.grant_id,
        grant=grant,
    )


def grant_allows(
    call: CallOnRecord, granted: Authorization, tool: str, target: str | None, ledger_key: Ed25519PublicKey
) -> str | None:
    """Whether a remembered approval on record covers the call its authorization names:
    the call asked nobody and names this very grant; the grant's row carries the
    ledger's seal over its terms (a grant widened in the database fails it); its terms
    are this session, tool and target (or any target); and it had neither expired nor
    been revoked when the ledger decided the call. None: allowed; else why not."""
    grant = call.grant
    if call.request_id is not None or granted.grant_id is None or call.grant_id != granted.grant_id:
        return "no grant of this call is on record"
    if grant is None or not grant_seal_names(ledger_key, grant.seal, grant.terms):
        return "the grant's row does not carry the ledger's seal over its terms: it was changed"
    terms = grant.terms
    if (terms.session_id, terms.tool) != (call.session_id, tool) or terms.session_id != granted.session_id:
        return "the grant is for another session or tool"
    if terms.target is not None and terms.target != target:
        return "the grant is for another target"
    decided = call.created_at
    if decided is None:
        return "the ledger's call has no time of decision"
    if terms.expires_at is not None and terms.expires_at <= decided:
        return "the grant had expired when the call was decided"
    if grant.revoked_at is not None and grant.revoked_at <= decided:
        return "the grant was revoked before the call was decided"
    return None


def ledger_allows(
    call: CallOnRecord | None,
    granted: Authorization,
    tool: str,
    fingerprint: str,
    ledger_key: Ed25519PublicKey,
    target: str | None = None,
) -> str | None:
    """Whether the ledger's own rows allow what the authorization says: the call was
    made with this tool and these arguments (fingerprinted from the row itself, not a
    stored hash), and a person approved the request it names, whose seal the ledger
    made when it minted the request names this call, tool and arguments; or a grant
    on record covers it (`grant_allows`); or the call needed no approval. None:
    allowed; else why not. A forged authorization would need forged ledger rows as
    well, and rows rewritten in the database fail the seals."""
    if call is None:
        return "the ledger has no such call"
    if call.tool != tool or arguments_fingerprint(call.arguments) != fingerprint:
        return "the ledger's call has another tool or other arguments"
    if granted.basis == "policy":
        if call.grant_id is not None:
            return "the call was authorized by a grant, not the policy"
        return None if call.request_id is None else "the call needs a person's approval"
    if granted.basis == "grant":
        return grant_allows(call, granted, tool, target, ledger_key)
    if call.request_id != granted.request_id or call.decision != "approve":
        return "no approval of this call is on record"
    if not request_seal_names(
        ledger_key,
        call.call_seal,
        request_id=call.request_id,
        call_id=granted.call_id,
        tool=tool,
        fingerprint=fingerprint,
    ):
        return "the request's seal does not name this call, tool and arguments: its row was changed"
    return None


class Claims:
    """The executor's claims: the rules here, the rows through shared/ledger/claims.py."""

    def __init__(
        self,
        engine: Any,
        holder: str,
        lease_seconds: float,
        ledger_key: Ed25519PublicKey,
        heartbeat: Any = None,
    ) -> None:
        # Renewals on a connection of their own (`heartbeat`): a heartbeat that queues for
        # the pool behind the claims it guards misses its lease under load, and another
        # delivery then takes a call that is still running (an idempotent one runs twice,
        # an outward one is closed as outcome-unknown).
        self.rows = ClaimRows(engine, heartbeat)
        self.holder = holder
        self.lease = timedelta(seconds=lease_seconds)
        # The ledger's public key: a request's seal in the ledger's rows is checked with it.
        self.ledger_key = ledger_key

    async def take(
        self,
        call_id: str,
        idempotency_key: str,
        effect: str,
        granted: Authorization,
        tool: str,
        fingerprint: str,
        authorization: str,
        target: str | None = None,
    ) -> ClaimOutcome:
        """Claim the call if the ledger's rows allow it; `target`: what the call touches
        by the executor's catalogue, which a grant's target must match."""
        if self.rows.on_driver:
            fresh_values = fresh_claim(
                call_id, idempotency_key, self.holder, at=now(), lease=self.lease, authorization=authorization
            )
            claimed, refusal = await self.rows.take_fresh(
                fresh_values,
                lambda record: ledger_allows(
                    record and call_on_record(record), granted, tool, fingerprint, self.ledger_key, target
                ),
            )
            if claimed:
                return ClaimOutcome("run", attempt=1)
            if refusal is not None:
                return ClaimOutcome("refused", refusal=refusal)
            # The call had a claim: decided below, on the row locked.
        try:
            async with self.rows.claiming() as conn:
                return await self._take(
                    conn, call_id, idempotency_key, effect, granted, tool, fingerprint, authorization, target
                )
        except _Refused as refused:
            # Raised inside the transaction so that a claim inserted with the record is rolled back.
            return ClaimOutcome("refused", refusal=str(refused))

    async def _take(
        self,
        conn: Any,
        call_id: str,
        idempotency_key: str,
        effect: str,
        granted: Authorization,
        tool: str,
        fingerprint: str,
        authorization: str,
        target: str | None = None,
    ) -> ClaimOutcome:
        at = now()
        fresh_values = fresh_claim(
            call_id, idempotency_key, self.holder, at=at, lease=self.lease, authorization=authorization
        )
        record, fresh = await self.rows.record_claiming(conn, fresh_values)
        refusal = ledger_allows(record and call_on_record(record), granted, tool, fingerprint, self.ledger_key, target)
        if refusal is not None:
            raise _Refused(refusal)
        if fresh is None:
            fresh = await self.rows.claim_fresh(conn, fresh_values)
        if fresh:
            return ClaimOutcome("run", attempt=1)
        verdict = decide(await self.rows.locked(conn, call_id), effect=effect, at=at)
        if verdict.action == "run":
            await self.rows.set(conn, call_id, retaken_claim(self.holder, verdict.attempt, at=at, lease=self.lease))
        elif verdict.action == "lost":
            await self.rows.set(conn, call_id, lost_call(at))
        return verdict

    async def _update_own(self, call_id: str, *, heartbeat: bool = False, **values) -> bool:
        return await self.rows.update_own(call_id, self.holder, values, heartbeat=heartbeat)

    async def renew(self, call_id: str) -> bool:
        return await self._update_own(call_id, heartbeat=True, lease_expires_at=renewed_lease(now(), self.lease))

    async def finish(self, call_id: str, outcome: str, result: dict[str, Any]) -> bool:
        """Record the result; False if this executor no longer holds the claim."""
        return await self._update_own(call_id, status="finished", outcome=outcome, result=result, finished_at=now())
