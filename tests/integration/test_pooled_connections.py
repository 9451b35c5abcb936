"""A pooled PostgreSQL connection whose server ended it (a primary lost and its standby
promoted, a backend terminated) must not be handed out again. The hot paths send their
statements straight to asyncpg, past SQLAlchemy's disconnect handling: once, an executor
whose claim path forgot to drop such a connection failed every claim with "connection is
closed" for two minutes after a failover, and 32 approved calls waited."""

import asyncio
from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from services.tool_executor.claims import fresh_claim
from shared.ledger import driver
from shared.ledger.claims import ClaimRows
from shared.ledger.database import create_engine
from shared.messages import mint, now


async def _end_the_backend_under(engine) -> None:
    """Terminate the pool's one connection from another of the same role (a role may end
    its own backends), and wait until asyncpg has seen its socket close."""
    async with engine.connect() as conn:
        pid = await conn.scalar(text("SELECT pg_backend_pid()"))
        raw = await driver.driver_of(conn)
    other = create_async_engine(engine.url, pool_size=1, max_overflow=0)
    try:
        async with other.connect() as conn:
            assert await conn.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    finally:
        await other.dispose()
    for _ in range(200):
        if raw.is_closed():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("asyncpg never noticed its backend was terminated")


async def test_a_claim_taken_after_the_servers_end_of_a_pooled_connection_goes_through_at_once(pg_deployment):
    deployment = pg_deployment
    deployment.setup()
    # The executor's own role and its pool of one, as a replica under load has every connection in use.
    engine = create_engine(deployment.settings, identity="tool-executor", pool_size=1)
    try:
        await _end_the_backend_under(engine)
        call_id = mint("call")
        values = fresh_claim(call_id, mint("idk"), "executor-a", at=now(), lease=timedelta(seconds=5), authorization="")
        # The call is not on record: the judge is asked about None and refuses; what matters
        # is that the claim's statement reached a live server instead of "connection is closed".
        taken, refusal = await ClaimRows(engine).take_fresh(values, lambda record: "not on record" if record is None else None)
        assert (taken, refusal) == (False, "not on record")
        async with engine.connect() as conn:
            assert await conn.scalar(text("SELECT 1")) == 1
    finally:
        await engine.dispose()
