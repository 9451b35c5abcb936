"""The executor's statements on `execution_claims`, and its one read of the ledger's rows
(shared/ledger/call_on_record.py) beside them (services/tool_executor/claims.py holds the
rules: what a claim row allows, what each write puts in it). The executor's only crossing
into the ledger's database."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy import bindparam, exists, literal, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared.ledger import driver
from shared.ledger.call_on_record import CALL_ON_RECORD
from shared.ledger.database import STATEMENT_COUNTS, create_engine, insert_unless_present
from shared.ledger.tables import TABLES, ExecutionClaim
from shared.settings import Settings

# What the executor reads of the ledger's rows, in one query of the ledger's (shared/ledger/call_on_record.py).
_CALL_ON_RECORD = CALL_ON_RECORD
CLAIMS = TABLES["execution_claims"]
# Built once: the hot path runs them for every call, and building costs more than executing a cached one.
_FRESH = {dialect: insert_unless_present(CLAIMS, "call_id", dialect) for dialect in ("postgresql", "sqlite")}
# PostgreSQL: the record read and the fresh claim in one statement (a data-modifying CTE).
# The claim is inserted only when the ledger has the call; whether the record allows what
# the authorization says is still decided by the executor (ledger_allows), and a refusal
# rolls the claim back (Claims.take), so no rule is written twice.
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


def heartbeat_engine(settings: Settings, identity: str) -> AsyncEngine | None:
    """An engine for lease renewals alone (`ClaimRows.heartbeat`): PostgreSQL gets a
    connection for the heartbeat alone; SQLite has one writer and a pool of one already (None)."""
    return create_engine(settings, identity=identity, pool_size=1) if settings.is_postgres else None


class ClaimRows:
    """The executor's claim rows, on Core: one statement for the common case (a fresh claim).
    `heartbeat`: the engine lease renewals go through."""

    def __init__(self, engine: AsyncEngine, heartbeat: AsyncEngine | None = None) -> None:
        self.engine = engine
        self.heartbeat = heartbeat or engine

    def claiming(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """One claim's transaction: what it reads and writes commits together, or not at all."""
        return self.engine.begin()

    @property
    def on_driver(self) -> bool:
        """Whether `take_fresh` may be used: on PostgreSQL (asyncpg)."""
        return self.engine.dialect.name == "postgresql"

    async def take_fresh(
        self, fresh_values: dict[str, Any], judge: Callable[[Any], str | None]
    ) -> tuple[bool, str | None]:
        """The common case on PostgreSQL, in a transaction begun straight on asyncpg: the
        record read and a fresh claim in one statement (`_RECORD_AND_FRESH_CLAIM`), the
        record `judge`d (None: allowed, else why not). Committed only when the claim went
        in and the judge refused nothing, else rolled back, so a refused call keeps no
        claim. (True, None): claimed; (False, why): refused; (False, None): the call had a
        claim already, which the caller decides on in a transaction of its own
        (`claiming`). SQLAlchemy's begin, execution and commit around this one statement
        cost more of the executor's CPU than the statement (docs/benchmarks.md)."""
        async with self.engine.connect() as conn:
            raw = await driver.driver_of(conn)
            transaction = raw.transaction()
            committed = False
            try:
                await transaction.start()
                rows = await driver.fetch(conn, _RECORD_AND_FRESH_CLAIM, fresh_values, raw=raw)
                record = rows[0] if rows else None
                refusal = judge(record)
                if refusal is None and record is not None and record.fresh:
                    await transaction.commit()
                    committed = True
                    STATEMENT_COUNTS["commits"] += 1
                    return True, None
                return False, refusal
            finally:
                if not committed:
                    await _roll_back(conn, raw, transaction)

    async def record_claiming(self, conn: AsyncConnection, fresh_values: dict[str, Any]) -> tuple[Any, bool | None]:
        """The ledger's record of the call (None: it has none), and whether a fresh claim
        (`fresh_values`) was inserted with it: on PostgreSQL in the same statement, when
        the ledger has the call; elsewhere None, and `claim_fresh` decides."""
        if conn.dialect.name == "postgresql":
            record = (await conn.execute(_RECORD_AND_FRESH_CLAIM, fresh_values)).first()
            return record, record is not None and record.fresh
        return (await conn.execute(_CALL_ON_RECORD, {"call_id": fresh_values["call_id"]})).first(), None

    async def claim_fresh(self, conn: AsyncConnection, fresh_values: dict[str, Any]) -> bool:
        """Insert the fresh claim unless the call has one; whether it was inserted."""
        return (await conn.execute(_FRESH[conn.dialect.name], fresh_values)).rowcount == 1

    async def locked(self, conn: AsyncConnection, call_id: str) -> ExecutionClaim:
        """The call's claim row, locked until the transaction ends."""
        row = (await conn.execute(select(CLAIMS).where(CLAIMS.c.call_id == call_id).with_for_update())).one()
        return ExecutionClaim(**row._mapping)

    async def set(self, conn: AsyncConnection, call_id: str, values: dict[str, Any]) -> None:
        await conn.execute(update(CLAIMS).where(CLAIMS.c.call_id == call_id).values(values))

    async def update_own(self, call_id: str, holder: str, values: dict[str, Any], *, heartbeat: bool = False) -> bool:
        """Set `values` on the claim if `holder` still holds it; False if not. `heartbeat`:
        through the heartbeat's own engine."""
        engine = self.heartbeat if heartbeat else self.engine
        statement = _update_own_setting(tuple(values))
        parameters = {"call_id_": call_id, "holder_": holder, **values}
        if engine.dialect.name == "postgresql":
            # One statement is atomic by itself: autocommitted straight on asyncpg, one
            # round trip instead of SQLAlchemy's BEGIN, UPDATE and COMMIT.
            async with engine.connect() as conn:
                return await driver.execute(conn, statement, parameters) == 1
        async with engine.begin() as conn:
            result = await conn.execute(statement, parameters)
            return result.rowcount == 1


async def _roll_back(conn: AsyncConnection, raw: Any, transaction: Any) -> None:
    """End a transaction begun on asyncpg without its commit; a connection that cannot
    roll back (or that the server closed) is dropped from the pool, not reused."""
    if not raw.is_closed() and raw.is_in_transaction():
        try:
            await transaction.rollback()
            STATEMENT_COUNTS["rollbacks"] += 1
        except Exception:
            await conn.invalidate()
            return
    await driver.forget_if_closed(conn, raw)
