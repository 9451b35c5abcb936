"""The event stream's horizon (shared/ledger/event_stream.py): a card is streamed as soon
as it is committed, whatever transaction another role holds open on the same server,
and a stream resumed with `Last-Event-ID` while writers commit out of id order misses
and repeats nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, text

from shared.ledger.tables import OutboxRow
from shared.settings import Settings
from tests.gateway_client import GatewayClient
from tests.harness import POSTGRES_URL, rows
from tests.integration.test_gateway import add_people, committed_event_ids, read_events, start, url


@contextlib.asynccontextmanager
async def a_transaction_held_open(deployment, holder: str):
    """A transaction left open by someone who is not the ledger: a role of its own with no
    grant at all (`stranger`), or the model-step's own role. Each has taken a transaction
    id, as a transaction that wrote something has. SQLite: a reader's open transaction."""
    if deployment.store == "sqlite":
        reader = sqlite3.connect(deployment.data_dir / "ledger.db", isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM outbox").fetchall()
            yield
        finally:
            reader.close()
        return
    if holder == "model-step":
        async with deployment.engine("model-step") as engine, engine.connect() as conn:
            await conn.begin()
            await conn.execute(text("SELECT pg_current_xact_id()"))
            yield
            await conn.rollback()
        return
    import asyncpg

    admin_url = Settings(database_url=POSTGRES_URL).ledger_url.replace("+asyncpg", "")
    stranger = f"{deployment.namespace}_stranger"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE ROLE "{stranger}" LOGIN')
        other = await asyncpg.connect(admin_url, user=stranger)
        try:
            async with other.transaction():
                await other.fetchval("SELECT pg_current_xact_id()")
                yield
        finally:
            await other.close()
    finally:
        await admin.execute(f'DROP ROLE IF EXISTS "{stranger}"')
        await admin.close()


@pytest.mark.parametrize(
    ("store", "holder"), [("postgres", "stranger"), ("postgres", "model-step"), ("sqlite", "reader")]
)
async def test_a_card_is_streamed_within_a_second_of_its_commit_while_another_role_holds_a_transaction_open(
        deployment, sink, store, holder):
    deployment.extra_env["SINK_URL"] = sink.url
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    async with GatewayClient(url(deployment)) as ann, GatewayClient(url(deployment)) as alice:
        await ann.login("ann")  # an operator: every event
        await alice.login("alice")
        seen: list = []
        arrived: dict[str, float] = {}

        def card_seen(seen: list) -> bool:
            if seen[-1][1] == "approval.requested":
                arrived[seen[-1][2]["session_id"]] = time.time()
            return bool(arrived)

        reading = asyncio.create_task(read_events(ann, seen, until=card_seen, params={"since": "now"}))
        while not seen:  # the stream is open: its first block is the id of "now"
            await asyncio.sleep(0.05)
        async with a_transaction_held_open(deployment, holder):
            session_id = await start(alice, "reviewed")
            await asyncio.wait_for(reading, 10)  # the card came while the transaction is still open
    [card] = [r for r in await rows(deployment, OutboxRow, session_id=session_id)
              if r.message_type == "approval.requested"]
    committed = card.created_at if card.created_at.tzinfo else card.created_at.replace(tzinfo=UTC)
    assert arrived[session_id] - committed.timestamp() < 1.0


def turn_completed(number: int) -> dict:
    """An outbox row as the ledger writes one (already sent: no publisher runs here)."""
    now = datetime.now(UTC)
    body = {"type": "turn.completed", "message_id": f"msg_{number}", "session_id": "ses_writers",
            "turn_id": f"trn_{number}", "text": str(number), "schema_version": 1, "occurred_at": now.isoformat()}
    return {"message_id": f"msg_{number}", "session_id": "ses_writers", "message_type": "turn.completed",
            "exchange": "x", "routing_key": "x", "body": json.dumps(body), "created_at": now, "sent_at": now}


async def test_a_stream_resumed_while_writers_commit_out_of_id_order_misses_and_repeats_nothing(deployment):
    """Writers as the ledger's own role commit out of order, round after round: one takes
    its ids first and commits last, after another has committed and the stream has had
    time to read (while, on PostgreSQL, another role also holds a transaction open). A
    stream read halfway, dropped and resumed with its last id serves every committed
    event once, in the ledger's (txid, id) order."""
    add_people(deployment)
    # The rows below are written without a NOTIFY: the watcher reads them at its polls.
    deployment.extra_env["SIGNOFF_GATEWAY_IDLE_POLL_SECONDS"] = "0.1"
    deployment.start("approval-ledger")
    deployment.start("gateway")
    rounds = 6
    total = 2 * rounds

    async def write(engine) -> None:
        for number in range(0, total, 2):
            if deployment.store == "sqlite":  # one writer at a time (and one connection): in order
                for each in (number, number + 1):
                    async with engine.begin() as conn:
                        await conn.execute(insert(OutboxRow), [turn_completed(each)])
                await asyncio.sleep(0.3)
                continue
            async with engine.connect() as early, engine.connect() as late:
                await early.begin()
                await early.execute(insert(OutboxRow), [turn_completed(number)])  # its ids first
                async with late.begin():
                    await late.execute(insert(OutboxRow), [turn_completed(number + 1)])
                await asyncio.sleep(0.3)  # the stream polls meanwhile
                await early.commit()

    async with (deployment.engine("approval-ledger") as engine, GatewayClient(url(deployment)) as ann,
                a_transaction_held_open(deployment, "stranger")):
        await ann.login("ann")
        seen: list = []
        writing = asyncio.create_task(write(engine))
        await asyncio.wait_for(read_events(ann, seen, until=lambda seen: len(seen) >= rounds), 30)
        with contextlib.suppress(TimeoutError):  # a missed event: the assertions below say which
            await asyncio.wait_for(read_events(ann, seen, seen[-1][0], until=lambda seen: len(seen) >= total), 15)
        await writing
    ids = [event_id for event_id, _, _ in seen]
    assert len(ids) == len(set(ids)), "an event was repeated"
    assert ids == await committed_event_ids(deployment), "the stream skipped or reordered committed events"
