"""Costs that stay flat as the backlog grows: with thousands of requests
waiting, in tables autovacuum never touched and never analyzed (as on the machines
that run Signoff), the sweeps, the approval path's per-session reads and the pending
gauge read the partial indexes of pending rows by their shape; the gauge's count,
kept by triggers, is exact through every change."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from services.approval_ledger import store_sql
from shared.ledger import backlog
from shared.ledger.database import migrate
from shared.ledger.retention import _OLDEST
from shared.messages import now

WAITING = 20000

# sessions, turns, steps, calls and their requests: `WAITING` pending (expiring in a day,
# a tenth of them to escalate in an hour) and as many decided; all of tool `fetch`,
# but for one `publish_post` request.
_SEED = [
    "INSERT INTO sessions (id, status, provider, event_seq, transcript_len, created_at, updated_at, audit_seq)"
    " SELECT 'ses_' || g, 'waiting', 'scripted', 0, 0, now(), now(), 0 FROM generate_series(1, :n) g",
    "INSERT INTO turns (id, session_id, status, created_at)"
    " SELECT 'trn_' || g, 'ses_' || g, 'running', now() FROM generate_series(1, :n) g",
    "INSERT INTO steps (id, session_id, turn_id, status, created_at)"
    " SELECT 'stp_' || g, 'ses_' || g, 'trn_' || g, 'completed', now() FROM generate_series(1, :n) g",
    "INSERT INTO tool_calls (id, session_id, step_id, position, provider_call_id, tool, arguments, args_digest,"
    " status, idempotency_key, created_at)"
    " SELECT 'call_' || g, 'ses_' || ((g + 1) / 2), 'stp_' || ((g + 1) / 2), g % 2, 'p' || g,"
    " CASE WHEN g = 1 THEN 'publish_post' ELSE 'fetch' END, '{}', 'd', 'awaiting_approval', 'k' || g, now()"
    " FROM generate_series(1, 2 * :n) g",
    "INSERT INTO approval_requests (id, call_id, session_id, tool, status, args_digest, card, created_at,"
    " expires_at, escalate_at)"
    " SELECT 'apr_' || g, 'call_' || g, 'ses_' || ((g + 1) / 2), CASE WHEN g = 1 THEN 'publish_post' ELSE 'fetch' END,"
    " CASE WHEN g % 2 = 1 THEN 'pending' ELSE 'approved' END, 'd', '{}',"
    " now() - g * interval '1 second', now() + interval '1 day' + g * interval '1 second',"
    " CASE WHEN g % 20 = 1 THEN now() + interval '1 hour' END"
    " FROM generate_series(1, 2 * :n) g",
    # What retention keeps: received and sent within the window.
    "INSERT INTO inbox (message_id, message_type, session_id, received_at)"
    " SELECT 'msg_' || g, 'turn.start', 'ses_' || g, now() - g * interval '1 millisecond'"
    " FROM generate_series(1, :n) g",
    "INSERT INTO outbox (message_id, session_id, message_type, exchange, routing_key, body, created_at, sent_at)"
    " SELECT 'evt_' || g, 'ses_' || g, 'turn.completed', 'x', 'k', '{}', now(), now() FROM generate_series(1, :n) g",
]
STALE = ("sessions", "turns", "steps", "tool_calls", "approval_requests", "pending_tally", "inbox", "outbox")


@pytest.fixture
async def ledger(pg_deployment):
    """The ledger's engine on a schema with `WAITING` pending requests, never analyzed."""
    pg_deployment.setup()
    async with pg_deployment.engine("approval-ledger") as engine:
        await migrate(engine, pg_deployment.settings)
        async with engine.begin() as conn:
            for table in STALE:
                await conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = off)"))
            for statement in _SEED:
                await conn.execute(text(statement), {"n": WAITING})
        yield engine


async def plan(engine, query, **parameters) -> str:
    """PostgreSQL's plan for one of the ledger's Core queries, as the ledger sends it."""
    compiled = query.compile(dialect=engine.dialect)
    values = compiled.construct_params(parameters)
    positional = tuple(values[name] for name in compiled.positiontup)
    async with engine.connect() as conn:
        rows = (await conn.exec_driver_sql("EXPLAIN " + str(compiled), positional)).all()
    return "\n".join(row[0] for row in rows)


async def test_the_expiry_and_escalation_sweeps_read_only_the_head_of_their_partial_indexes(ledger):
    due = await plan(ledger, store_sql._DUE, at=now(), limit=100)
    assert "ix_approval_requests_pending_expiry" in due, due
    escalations = await plan(ledger, store_sql._DUE_ESCALATIONS, at=now(), limit=100)
    assert "ix_approval_requests_pending_escalation" in escalations, escalations
    # Only the due entries are read (a range of the index ending now), however many wait.
    assert "Index Cond: (expires_at <=" in due and "Index Cond: (escalate_at <=" in escalations
    for shown in (due, escalations):
        assert "Seq Scan" not in shown and "BitmapAnd" not in shown and "Limit" in shown, shown


async def test_a_sessions_pending_reads_use_the_pending_session_index_not_the_status_index(ledger):
    for query, parameters in (
        (store_sql._PENDING, {"session_id": "ses_7"}),
        (store_sql._PENDING_TOOLS, {"session_id": "ses_7"}),
        (store_sql._STEP, {"step_id": "stp_7", "session_id": "ses_7"}),
        (store_sql._CALL_AND_SIBLINGS, {"call_id": "call_13", "session_id": "ses_7"}),
        (store_sql._REQUEST_AND_CALLS, {"request_id": "apr_13", "session_id": "ses_7", "responder": "alice"}),
    ):
        shown = await plan(ledger, query, **parameters)
        assert "ix_approval_requests_pending_session" in shown, shown
        assert "ix_approval_requests_status" not in shown and "BitmapAnd" not in shown, shown


async def test_the_gauge_reads_the_tally_and_each_tools_heads_never_every_pending_row(ledger):
    heads = await plan(ledger, backlog._HEADS, tool="fetch")
    assert "ix_approval_requests_pending_tool_age" in heads, heads
    assert "ix_approval_requests_pending_tool_expiry" in heads, heads
    assert "Seq Scan on approval_requests" not in heads and "Bitmap" not in heads, heads
    # Each head is the first entry (a Limit over an ordered index scan), not an aggregate over the tool.
    assert heads.count("Limit") == 2 and "Aggregate" not in heads, heads
    tally = await plan(ledger, backlog._TALLY)
    assert "approval_requests" not in tally and "tool_calls" not in tally, tally


async def test_retention_finds_nothing_past_its_time_from_one_entry_of_the_inbox_and_outbox_time_indexes(ledger):
    inbox = await plan(ledger, _OLDEST["inbox rows"])
    assert "ix_inbox_received" in inbox and "Seq Scan" not in inbox, inbox
    outbox = await plan(ledger, _OLDEST["sent outbox rows"])
    assert "ix_outbox_unsent" in outbox and "Seq Scan" not in outbox, outbox


async def test_the_gauge_counts_each_tools_pending_requests_exactly_through_changes_and_folds(ledger):
    measured = await backlog.measure(ledger)
    assert measured.pending["unknown"][0] == WAITING  # fetch and publish_post: not in this process's catalogue
    async with ledger.begin() as conn:
        # Decided, expired, cancelled: each leaves the count; one made pending again returns.
        await conn.execute(text("UPDATE approval_requests SET status = 'approved' WHERE id IN ('apr_3', 'apr_5')"))
        await conn.execute(text("UPDATE approval_requests SET status = 'expired' WHERE id = 'apr_7'"))
        await conn.execute(text("UPDATE approval_requests SET status = 'pending' WHERE id = 'apr_2'"))
        await conn.execute(text("UPDATE approval_requests SET escalated_at = now() WHERE id = 'apr_9'"))
    async with ledger.begin() as conn:
        await conn.execute(text("UPDATE approval_requests SET status = 'cancelled' WHERE id = 'apr_11'"))
        await conn.rollback()  # what does not commit does not count
    tally = await _tally(ledger)
    assert tally == {"fetch": WAITING - 1 - 3 + 1, "publish_post": 1}
    await backlog.fold(ledger)
    assert await _tally(ledger) == tally
    async with ledger.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM pending_tally"))).scalar() == 2
        truth = dict(
            (
                await conn.execute(
                    text("SELECT tool, count(*) FROM approval_requests WHERE status = 'pending' GROUP BY tool")
                )
            ).all()
        )
    assert truth == tally


async def _tally(engine) -> dict[str, int]:
    async with engine.connect() as conn:
        return {tool: count for tool, count, _ in (await conn.execute(backlog._TALLY)).all() if count}


async def test_on_sqlite_too_the_tally_follows_each_committed_change_and_the_fold_keeps_the_sum(sqlite_deployment):
    from sqlalchemy import insert, update

    from shared.ledger.tables import ApprovalRequest, Session, Step, ToolCall, Turn

    sqlite_deployment.setup()
    at = now()
    async with sqlite_deployment.engine("approval-ledger") as engine:
        await migrate(engine, sqlite_deployment.settings)
        async with engine.begin() as conn:
            for n in range(1, 71):  # past FOLD_AT changes, so the reading folds
                ids = {k: f"{k}_{n}" for k in ("ses", "trn", "stp", "call", "apr")}
                await conn.execute(
                    insert(Session).values(
                        id=ids["ses"], status="waiting", provider="scripted", created_at=at, updated_at=at
                    )
                )
                await conn.execute(
                    insert(Turn).values(id=ids["trn"], session_id=ids["ses"], status="running", created_at=at)
                )
                await conn.execute(
                    insert(Step).values(
                        id=ids["stp"], session_id=ids["ses"], turn_id=ids["trn"], status="completed", created_at=at
                    )
                )
                tool = "fetch" if n % 7 else "publish_post"
                await conn.execute(
                    insert(ToolCall).values(
                        id=ids["call"],
                        session_id=ids["ses"],
                        step_id=ids["stp"],
                        position=0,
                        provider_call_id="p",
                        tool=tool,
                        arguments={},
                        args_digest="d",
                        status="awaiting_approval",
                        idempotency_key="k",
                        created_at=at,
                    )
                )
                await conn.execute(
                    insert(ApprovalRequest).values(
                        id=ids["apr"],
                        call_id=ids["call"],
                        session_id=ids["ses"],
                        tool=tool,
                        status="pending",
                        args_digest="d",
                        card={},
                        created_at=at,
                        expires_at=at + timedelta(days=1),
                    )
                )
        async with engine.begin() as conn:
            decided = ApprovalRequest.id.in_([f"apr_{n}" for n in range(1, 11)])  # 1 publish_post, 9 fetch
            await conn.execute(update(ApprovalRequest).where(decided).values(status="approved"))
        measured = await backlog.measure(engine)  # reads, then folds the 80 changes
        assert measured.pending["unknown"][0] == 60
        assert await _tally(engine) == {"fetch": 60 - 9, "publish_post": 9}
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM pending_tally"))).scalar() == 2
