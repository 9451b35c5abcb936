"""Durable claims: a call is claimed in the ledger before its tool runs (invariant 4).

The claim row decides everything a redelivery may do: report a recorded result,
wait for a live holder, retry a read or idempotent call with the same key, or
close an outward call as outcome-unknown. Leases are timestamps in the row, so
losing Redis loses nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import bindparam, exists, literal, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared.authorization import Authorization, request_seal_names
from shared.ledger import driver
from shared.ledger.call_on_record import CALL_ON_RECORD
from shared.ledger.database import insert_unless_present
from shared.ledger.tables import TABLES, ExecutionClaim
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


def ledger_allows(
    call: CallOnRecord | None, granted: Authorization, tool: str, fingerprint: str, ledger_key: Ed25519PublicKey
) -> str | None:
    """Whether the ledger's own rows allow what the authorization says: the call was
    made with this tool and these arguments (fingerprinted from the row itself, not a
    stored hash), and a person approved the request it names, whose seal the ledger
    made when it minted the request names this call, tool and arguments; or the call
    needed no approval. None: allowed; else why not. A forged authorization would need
    forged ledger rows as well, and rows rewritten in the database fail the seal."""
    if call is None:
        return "the ledger has no such call"
    if call.tool != tool or arguments_fingerprint(call.arguments) != fingerprint:
        return "the ledger's call has another tool or other arguments"
    if granted.basis == "policy":
        return None if call.request_id is None else "the call needs a person's approval"
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


# What the executor reads of the ledger's rows, in one query of the ledger's (shared/ledger/call_on_record.py).
_CALL_ON_RECORD = CALL_ON_RECORD
CLAIMS = TABLES["execution_claims"]
# Built once: the hot path runs them for every call, and building costs more than executing a cached one.
_FRESH = {dialect: insert_unless_present(CLAIMS, "call_id", dialect) for dialect in ("postgresql", "sqlite")}
# PostgreSQL: the record read and the fresh claim in one statement (a data-modifying CTE).
# The claim is inserted only when the ledger has the call; whether the record allows what
# the authorization says is still decided in Python (ledger_allows), and a refusal rolls
# the claim back (Claims.take), so no rule is written twice.
_FRESH_COLUMNS = (
    "call_id",
    "idempotency_key",
    "status",
    "holder",
    "lease_expires_at",
    "attempts",
    "claimed_at",
    "authorization",
)
_RECORD = _CALL_ON_RECORD.cte("record")
_CLAIMED = (
    postgresql.insert(CLAIMS)
    .from_select(
        list(_FRESH_COLUMNS),
        select(*(bindparam(name, type_=CLAIMS.c[name].type) for name in _FRESH_COLUMNS)).where(
            exists(select(literal(1)).select_from(_RECORD))
        ),
    )
    .on_conflict_do_nothing(index_elements=[CLAIMS.c.call_id])
    .returning(CLAIMS.c.call_id)
    .cte("claimed")
)
_RECORD_AND_FRESH_CLAIM = select(
    *_RECORD.c, exists(select(literal(1)).select_from(_CLAIMED)).label("fresh")
).select_from(_RECORD)
# An update of a claim this executor still holds; its SET clause: `_update_own_setting`.
_UPDATE_OWN = update(CLAIMS).where(
    CLAIMS.c.call_id == bindparam("call_id_"), CLAIMS.c.holder == bindparam("holder_"), CLAIMS.c.status == "claimed"
)


@functools.cache
def _update_own_setting(columns: tuple[str, ...]) -> Any:
    """`_UPDATE_OWN` setting `columns`, built once per set (both stores; asyncpg compiles it once)."""
    return _UPDATE_OWN.values({name: bindparam(name, type_=CLAIMS.c[name].type) for name in columns})


class Claims:
    """The executor's claims, on Core: one statement for the common case (a fresh claim)."""

    def __init__(
        self,
        engine: AsyncEngine,
        holder: str,
        lease_seconds: float,
        ledger_key: Ed25519PublicKey,
        heartbeat: AsyncEngine | None = None,
    ) -> None:
        self.engine = engine
        # Renewals on a connection of their own: a heartbeat that queues for the pool behind
        # the claims it guards misses its lease under load, and another delivery then takes
        # a call that is still running (an idempotent one runs twice, an outward one is
        # closed as outcome-unknown).
        self.heartbeat = heartbeat or engine
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
    ) -> ClaimOutcome:
        try:
            async with self.engine.begin() as conn:
                return await self._take(
                    conn, call_id, idempotency_key, effect, granted, tool, fingerprint, authorization
                )
        except _Refused as refused:
            # Raised inside the transaction so that a claim inserted with the record is rolled back.
            return ClaimOutcome("refused", refusal=str(refused))

    async def _take(
        self,
        conn: AsyncConnection,
        call_id: str,
        idempotency_key: str,
        effect: str,
        granted: Authorization,
        tool: str,
        fingerprint: str,
        authorization: str,
    ) -> ClaimOutcome:
        at = now()
        fresh_values = fresh_claim(
            call_id, idempotency_key, self.holder, at=at, lease=self.lease, authorization=authorization
        )
        record: Any
        if conn.dialect.name == "postgresql":
            record = (await conn.execute(_RECORD_AND_FRESH_CLAIM, fresh_values)).first()
            fresh = record is not None and record.fresh
        else:
            record = (await conn.execute(_CALL_ON_RECORD, {"call_id": call_id})).first()
            fresh = None
        refusal = ledger_allows(record and CallOnRecord(*record[:5]), granted, tool, fingerprint, self.ledger_key)
        if refusal is not None:
            raise _Refused(refusal)
        if fresh is None:
            fresh = (await conn.execute(_FRESH[conn.dialect.name], fresh_values)).rowcount == 1
        if fresh:
            return ClaimOutcome("run", attempt=1)
        row = (await conn.execute(select(CLAIMS).where(CLAIMS.c.call_id == call_id).with_for_update())).one()
        verdict = decide(ExecutionClaim(**row._mapping), effect=effect, at=at)
        if verdict.action == "run":
            await conn.execute(
                update(CLAIMS)
                .where(CLAIMS.c.call_id == call_id)
                .values(retaken_claim(self.holder, verdict.attempt, at=at, lease=self.lease))
            )
        elif verdict.action == "lost":
            await conn.execute(update(CLAIMS).where(CLAIMS.c.call_id == call_id).values(lost_call(at)))
        return verdict

    async def _update_own(self, call_id: str, engine: AsyncEngine | None = None, **values) -> bool:
        engine = engine or self.engine
        statement = _update_own_setting(tuple(values))
        parameters = {"call_id_": call_id, "holder_": self.holder, **values}
        if engine.dialect.name == "postgresql":
            # One statement is atomic by itself: autocommitted straight on asyncpg, one
            # round trip instead of SQLAlchemy's BEGIN, UPDATE and COMMIT.
            async with engine.connect() as conn:
                return await driver.execute(conn, statement, parameters) == 1
        async with engine.begin() as conn:
            result = await conn.execute(statement, parameters)
            return result.rowcount == 1

    async def renew(self, call_id: str) -> bool:
        return await self._update_own(call_id, self.heartbeat, lease_expires_at=renewed_lease(now(), self.lease))

    async def finish(self, call_id: str, outcome: str, result: dict[str, Any]) -> bool:
        """Record the result; False if this executor no longer holds the claim."""
        return await self._update_own(call_id, status="finished", outcome=outcome, result=result, finished_at=now())
