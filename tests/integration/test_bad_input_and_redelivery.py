"""Redelivery is applied once (the inbox, invariant 8); bad input is answered,
never applied, and never blocks the queue (invariant 9)."""

import asyncio
import json

import aio_pika
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from shared.ledger.tables import ApprovalRequest, Decision, InboxRow, OutboxRow, TranscriptRow
from shared.messages import RespondToApproval, StartTurn, mint
from shared.consuming import NO_MESSAGE_ID
from shared.dead_letters import DETAIL_HEADER, REASON_HEADER
from shared.provisioning import management_api
from shared.settings import Settings
from tests.harness import POSTGRES_URL, SERVICES, eventually, next_event, rows, start_and_wait_for_approval


async def test_a_redelivered_response_executes_the_tool_once_even_with_redis_flushed(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        response = console.sign(RespondToApproval(session_id=session_id, request_id=requested.request_id,
                                                  decision="approve", args_digest=requested.args_digest,
                                                  responder="tester"))
        await console.send(response)
        await next_event(events, "turn.completed")
        # Redis holds no "seen" marks (nothing is skipped on its word; invariant 8), and is
        # flushed anyway: the ledger's inbox alone drops the duplicate.
        await deployment.forget_redis()
        await console.send(response)
        await console.send(response)
        async with deployment.ledger() as ledger:
            async def duplicates_seen():
                async with ledger() as db:
                    return await db.scalar(select(func.count()).select_from(InboxRow)
                                           .where(InboxRow.message_id == response.message_id))
            await eventually(duplicates_seen)
            # Give the ledger the time to (wrongly) act on them before counting.
            await console.send(StartTurn(session_id=session_id, text="after the duplicates"))
            after = await next_event(events, "turn.completed", "message.rejected")
            assert after.type == "turn.completed", "the duplicates were dropped silently, not judged as stale"
            async with ledger() as db:
                assert await db.scalar(select(func.count()).select_from(Decision)) == 1
    assert sink.counts["/sink"] == 1


async def test_a_response_to_an_unknown_request_is_rejected_with_a_reason_and_changes_nothing(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        async with deployment.ledger() as ledger, ledger() as db:
            outbox_before = await db.scalar(select(func.count()).select_from(OutboxRow))
        bogus = console.sign(RespondToApproval(session_id=session_id, request_id=mint("apr"), decision="approve",
                                               args_digest=requested.args_digest))
        await console.send(bogus)
        rejected = await next_event(events, "message.rejected")
        assert rejected.rejected_message_id == bogus.message_id
        assert rejected.reason_code == "unknown_request"
        async with deployment.ledger() as ledger, ledger() as db:
            assert await db.scalar(select(func.count()).select_from(Decision)) == 0
            # Only the rejection itself was added.
            assert await db.scalar(select(func.count()).select_from(OutboxRow)) == outbox_before + 1
    assert sink.counts["/sink"] == 0


async def test_an_approval_for_other_arguments_than_shown_is_refused(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.send(console.sign(RespondToApproval(session_id=session_id, request_id=requested.request_id,
                                                          decision="approve", args_digest="sha256:" + "0" * 64)))
        rejected = await next_event(events, "message.rejected")
        assert rejected.reason_code == "digest_mismatch"
        # The request is still open and answerable with the right digest.
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "turn.completed")
    assert sink.counts["/sink"] == 1


async def test_a_denied_call_closes_with_the_persons_reason_and_never_runs(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "deny", "not on a Friday", "", "tester")
        closed = await next_event(events, "tool.closed")
        assert (closed.kind, closed.reason_text) == ("denied", "not on a Friday")
        await next_event(events, "turn.completed")
    assert sink.counts["/sink"] == 0


async def test_a_call_answered_in_the_tools_place_never_runs_and_the_model_reads_the_answer_as_its_result(
    deployment, sink
):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "respond", "", "Already posted by hand; say so.", "tester")
        closed = await next_event(events, "tool.closed")
        assert (closed.kind, closed.reason_code) == ("answered", "answered_by_person")
        await next_event(events, "turn.completed")
    assert sink.counts["/sink"] == 0
    [request] = await rows(deployment, ApprovalRequest, session_id=session_id)
    assert request.status == "answered"
    transcript = [r.entry for r in sorted(await rows(deployment, TranscriptRow, session_id=session_id),
                                          key=lambda r: r.position)]
    answers = [e for e in transcript if e["role"] == "tool"]
    assert [(e["text"], e["closure"]) for e in answers] == [("Already posted by hand; say so.", "answered")]
    # Said once, as the tool's result: no note besides it.
    assert not any("with their decision" in (e.get("text") or "") for e in transcript)


async def test_a_message_that_fails_validation_is_dead_lettered_with_its_reason_and_the_next_is_processed(
    deployment, sink
):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start()
    topology_queue = f"{deployment.namespace}.dead-letters"
    session_id = mint("ses")
    # Valid but for its missing message id: a consumer minting one would mint another on every delivery.
    anonymous = RespondToApproval(session_id=session_id, request_id=mint("apr"), decision="deny",
                                  args_digest="sha256:x").model_dump(mode="json")
    del anonymous["message_id"]
    async with deployment.console() as console:
        exchange = await console.channel.get_exchange(f"{deployment.namespace}.channels")
        for body, message_id in ((b'{"type": "approval.respond", "session_id": "x"', "bad-json"),
                                 (b'{"type": "approval.respond", "session_id": "s", "request_id": 5}', "bad-shape"),
                                 (b"x" * (300 * 1024), "too-big"),
                                 (json.dumps(anonymous).encode(), "no-id")):
            await exchange.publish(aio_pika.Message(body, message_id=message_id), routing_key="approval.respond")
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "turn.completed")

    async with deployment.console(identity="console") as operator:
        dead = await operator.channel.declare_queue(topology_queue, passive=True)
        reasons = {}
        async def all_dead():
            while (raw := await dead.get(no_ack=True, fail=False)) is not None:
                reasons[raw.message_id] = (raw.headers[REASON_HEADER], raw.headers[DETAIL_HEADER])
            return len(reasons) == 4
        await eventually(all_dead)
    assert reasons["no-id"] == ("invalid", NO_MESSAGE_ID)
    assert reasons["bad-json"][0] == "invalid"
    assert reasons["bad-shape"][0] == "invalid" and "request_id" in reasons["bad-shape"][1]
    assert reasons["too-big"][0] == "oversized"
    assert sink.counts["/sink"] == 1


async def test_two_first_turns_of_one_new_session_get_one_turn_and_one_session_busy_refusal_at_once(pg_deployment):
    """The first turn holds its transaction open (session row inserted, not committed)
    while the second arrives: the second waits (behind the first in its session's
    group-commit lane, or, from another lane or replica, at the session row) and is
    refused as busy on its first delivery, with no duplicate-key error and no redelivery."""
    deployment = pg_deployment
    deployment.start(*(s for s in SERVICES if s != "approval-ledger"))
    deployment.start("approval-ledger", faults="ledger.before_commit@turn.start:hold")
    session_id = mint("ses")
    first, second = StartTurn(session_id=session_id, text="one"), StartTurn(session_id=session_id, text="two")
    # Another role's queries and waits are visible to the database's administrator only: the test watches as one.
    monitor = create_async_engine(Settings(database_url=POSTGRES_URL).ledger_url)
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(first)
        await eventually(lambda: asyncio.to_thread(deployment.fault_reached, "ledger.before_commit"))
        await console.send(second)

        async def second_waits_on_the_first():
            async with monitor.connect() as db:
                at_the_row = await db.scalar(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'INSERT INTO sessions%'"))
            async with management_api(deployment.settings) as api:
                queue = (await api.get(f"/queues/%2F/{deployment.namespace}.ledger.turns")).json()
            return at_the_row or queue.get("messages_unacknowledged") == 2

        await eventually(second_waits_on_the_first)
        await monitor.dispose()
        deployment.release("ledger.before_commit")
        rejected = await next_event(events, "message.rejected")
        assert (rejected.rejected_message_id, rejected.reason_code) == (second.message_id, "session_busy")
    log = deployment.log_path("approval-ledger").read_text()
    assert "will be redelivered" not in log and "UniqueViolation" not in log, log[-3000:]
