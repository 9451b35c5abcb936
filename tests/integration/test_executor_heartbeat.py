"""The executor's heartbeat (services/tool_executor/claims.py, Claims.renew) keeps a
running call's claim alive on a connection of its own. Under load every pooled
connection can be busy taking claims; a renewal that waits behind them misses the
5 s lease, and another delivery takes over a call that is still running. Seen in a
bench run at a load of 20 on 2 cores: `could not renew the claim (QueuePool limit ...
reached)`, then one call ran twice."""

import asyncio
from services.tool_executor.claims import Claims, fresh_claim
from shared import keyring
from shared.ledger.database import create_engine
from shared.ledger.tables import TABLES
from shared.messages import mint, now

CLAIMS = TABLES["execution_claims"]


async def test_a_claim_is_renewed_while_every_pooled_connection_is_busy(pg_deployment):
    deployment = pg_deployment
    deployment.setup()
    settings = deployment.settings
    # The executor's own role, as it builds its engines at start (services/tool_executor/main.py).
    work = create_engine(settings, identity="tool-executor", pool_size=1)
    heartbeat = create_engine(settings, identity="tool-executor", pool_size=1)
    try:
        claims = Claims(
            work, "executor-a", settings.claim_lease_seconds, keyring.ledger_public_key(settings.keys_path), heartbeat
        )
        call_id, lease = mint("call"), claims.lease
        async with work.begin() as conn:
            await conn.execute(
                CLAIMS.insert().values(
                    fresh_claim(call_id, mint("idk"), "executor-a", at=now() - lease, lease=lease, authorization="")
                )
            )
        async with work.connect() as busy:  # the work pool's only connection, held as a slow claim holds it
            await busy.execute(CLAIMS.select().where(CLAIMS.c.call_id == call_id))
            renewed_at = now()
            renewed = await asyncio.wait_for(claims.renew(call_id), timeout=3)
        assert renewed, "the holder renewed its own claim"
        async with work.connect() as conn:
            [claim] = (await conn.execute(CLAIMS.select().where(CLAIMS.c.call_id == call_id))).all()
        assert claim.lease_expires_at >= renewed_at + lease
    finally:
        await work.dispose()
        await heartbeat.dispose()
