"""The relay's poll as the outbox's history grows: every outbox row is inserted
unsent and then marked sent, so with autovacuum behind the unsent indexes keep an entry
for each row relayed since the last VACUUM. The poll starts at the first unsent row
(`id >= min(id)` over the partial index of unsent ids, an index-only scan that marks the
entries it passes dead) instead of reading every such entry, and reads the same rows."""

from __future__ import annotations

from sqlalchemy import text

from shared.ledger import backlog, outbox_relay
from shared.ledger.database import migrate

RELAYED = 20000


async def relayed_history_then_three_unsent(pg_deployment) -> None:
    """RELAYED rows inserted and marked sent (dead entries in the unsent indexes, autovacuum
    off), then three unsent rows."""
    pg_deployment.setup()
    async with pg_deployment.engine("approval-ledger") as ledger:
        await migrate(ledger, pg_deployment.settings)
        async with ledger.begin() as conn:
            await conn.execute(text("ALTER TABLE outbox SET (autovacuum_enabled = off)"))
            await conn.execute(
                text(
                    "INSERT INTO outbox (message_id, session_id, message_type, exchange, routing_key, body, created_at)"
                    " SELECT 'evt_' || g, 'ses_1', 'turn.completed', 'x', 'k', '{}', now()"
                    " FROM generate_series(1, :n) g"
                ),
                {"n": RELAYED},
            )
        async with ledger.begin() as conn:
            # Relayed: each row's unsent version is now a dead entry in the unsent indexes.
            await conn.execute(text("UPDATE outbox SET sent_at = now()"))
            await conn.execute(
                text(
                    "INSERT INTO outbox (message_id, session_id, message_type, exchange, routing_key, body, created_at)"
                    " SELECT 'new_' || g, 'ses_1', 'turn.completed', 'x', 'k', '{}', now()"
                    " FROM generate_series(1, 3) g"
                )
            )


async def test_the_relays_poll_starts_at_the_first_unsent_row_and_reads_the_same_rows(pg_deployment):
    await relayed_history_then_three_unsent(pg_deployment)
    async with pg_deployment.engine("publisher") as publisher:
        rows = await outbox_relay.unsent(publisher, 500)
        assert [r.message_id for r in rows] == ["new_1", "new_2", "new_3"]
        poll = await plan_of(publisher, outbox_relay._UNSENT, batch_size=500)
    # The head of the unsent ids, then only the entries from there on.
    assert "Index Only Scan using ix_outbox_unsent_id" in poll, poll
    assert "id >= " in poll, poll


async def plan_of(engine, statement, **params) -> str:
    compiled = statement.compile(dialect=engine.dialect)
    values = compiled.construct_params(params)
    async with engine.connect() as conn:
        found = (
            await conn.exec_driver_sql("EXPLAIN " + str(compiled), tuple(values[name] for name in compiled.positiontup))
        ).all()
    return "\n".join(row[0] for row in found)


async def test_the_backlog_gauge_counts_the_unsent_rows_from_the_first_unsent_one(pg_deployment):
    # The gauge reads every few seconds: over the relayed history it walked every dead entry too.
    await relayed_history_then_three_unsent(pg_deployment)
    async with pg_deployment.engine("approval-ledger") as ledger:
        measured = await backlog.measure(ledger)
        assert measured.unsent == 3
        count = await plan_of(ledger, backlog._UNSENT)
    assert "Index Only Scan using ix_outbox_unsent_id" in count, count
    assert "id >= " in count, count
