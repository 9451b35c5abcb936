"""Nothing waits forever: an unanswered request expires, the model is told, and a
late answer decides nothing (docs/design.md, invariant 5)."""

import asyncio

from sqlalchemy import select

from shared.ledger.tables import ApprovalRequest, Closure, Session, TranscriptRow
from shared.messages import CancelTurn, RespondToApproval, StartTurn, mint
from tests.harness import SERVICES, drain_events, next_event, rows, start_and_wait_for_approval
from tests.integration.test_command_line import signoff


async def test_an_unanswered_request_expires_the_model_is_told_and_a_late_answer_is_refused(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t", SIGNOFF_APPROVAL_TIMEOUT_SECONDS="1",
                                SIGNOFF_EXPIRY_SWEEP_SECONDS="0.2")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        # Where it came from, on the card's event and in its row (provenance).
        assert requested.turn_id and requested.attempt == 1 and requested.run_id.startswith("run_")
        assert (requested.expires_at - requested.occurred_at).total_seconds() <= 1.01
        expired = await next_event(events, "approval.expired", timeout=10)
        closed = await next_event(events, "tool.closed")
        assert (expired.request_id, closed.call_id, closed.kind, closed.reason_code) == (
            requested.request_id, requested.call_id, "expired", "expired")
        await next_event(events, "turn.completed", timeout=30)
        late = console.sign(RespondToApproval(session_id=session_id, request_id=requested.request_id,
                                              decision="approve", args_digest=requested.args_digest))
        await console.send(late)
        rejected = await next_event(events, "message.rejected")
        assert (rejected.rejected_message_id, rejected.reason_code) == (late.message_id, "expired")
    [request] = await rows(deployment, ApprovalRequest, id=requested.request_id)
    assert (request.status, request.turn_id, request.step_id, request.attempt, request.run_id) == (
        "expired", requested.turn_id, requested.step_id, 1, requested.run_id)
    [closure] = await rows(deployment, Closure, call_id=requested.call_id)
    assert closure.kind == "expired" and closure.reason_text.startswith("Nobody decided in time: it expired at ")
    async with deployment.ledger() as ledger, ledger() as db:
        said = [r.entry for r in await db.scalars(select(TranscriptRow).where(TranscriptRow.session_id == session_id))]
    assert any(e.get("closure") == "expired" and e["text"].startswith("Expired: Nobody decided in time")
               for e in said), "the model was told the request expired"
    assert sink.counts["/sink"] == 0


async def test_cancelling_a_waiting_session_closes_its_request_and_the_session_takes_a_new_turn(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        said = await asyncio.to_thread(signoff, deployment, "cancel", session_id, "--reason", "wrong day", "--as", "ann")
        assert said.strip() == f"cancelled turn {requested.turn_id} of session {session_id}"
        closed = await next_event(events, "tool.closed")
        cancelled = await next_event(events, "turn.cancelled")
        assert (closed.kind, closed.reason_text) == ("cancelled", "Cancelled by ann: wrong day")
        assert (cancelled.turn_id, cancelled.cancelled_by) == (requested.turn_id, "ann")
        [session] = await rows(deployment, Session, id=session_id)
        assert session.status == "cancelled"
        late = console.sign(RespondToApproval(session_id=session_id, request_id=requested.request_id,
                                              decision="approve", args_digest=requested.args_digest))
        await console.send(late)
        assert (await next_event(events, "message.rejected")).reason_code == "already_decided"
        again = await asyncio.to_thread(signoff, deployment, "cancel", session_id, check=False)
        assert "nothing_to_cancel" in again
        missing = await asyncio.to_thread(signoff, deployment, "cancel", mint("ses"), "--as", "ann", check=False)
        assert "not cancelled: unknown_session: There is no such session." in missing, missing
        # A new turn: the model sees the cancelled call closed, and carries on.
        await console.send(StartTurn(session_id=session_id, text="never mind"))
        await next_event(events, "turn.completed", timeout=30)
    [request] = await rows(deployment, ApprovalRequest, id=requested.request_id)
    assert request.status == "cancelled"
    assert sink.counts["/sink"] == 0


async def test_cancelling_while_an_outward_call_runs_closes_it_as_outcome_unknown_and_tells_an_operator(
    deployment, sink
):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    session_id = mint("ses")
    sink.hold_next("/sink")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await asyncio.to_thread(sink.wait_held)
        await console.send(CancelTurn(session_id=session_id, cancelled_by="ann"))
        closed = await next_event(events, "tool.closed")
        alert = await next_event(events, "operator.alerted")
        await next_event(events, "turn.cancelled")
        sink.release()
        assert (closed.kind, alert.call_id) == ("outcome_unknown", requested.call_id)
        await asyncio.sleep(1)  # the executor's late report changes nothing
        [closure] = await rows(deployment, Closure, call_id=requested.call_id)
        assert closure.kind == "outcome_unknown"
    assert sink.counts["/sink"] == 1


async def test_a_call_cancelled_before_the_executor_took_it_never_runs(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        deployment.kill("tool-executor")
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "approval.decided")
        await console.send(CancelTurn(session_id=session_id, cancelled_by="ann"))
        closed = await next_event(events, "tool.closed")
        await next_event(events, "turn.cancelled")
        assert closed.kind == "cancelled"
        deployment.start("tool-executor")  # the approved tool.execute still waits in its queue
        await asyncio.sleep(2)
    assert sink.counts["/sink"] == 0, "the ledger's own claim kept it from running"


async def test_a_model_result_that_fails_on_every_delivery_fails_its_turn_with_the_reason_instead_of_a_stuck_session(
    deployment, sink
):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t", SIGNOFF_DELIVERY_LIMIT="2")
    deployment.start(*(s for s in SERVICES if s != "approval-ledger"))
    deployment.start("approval-ledger", faults="ledger.before_commit@step.completed:raise")
    session_id = mint("ses")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="go"))
        failed = await next_event(events, "turn.failed", timeout=30)
    assert failed.reason_code == "message_parked"
    assert failed.reason_text.startswith("step.completed msg_") and "(delivery_limit)" in failed.reason_text
    [session] = await rows(deployment, Session, id=session_id)
    assert session.status == "idle", "the session can take a new turn"
    listed = await asyncio.to_thread(signoff, deployment, "dead-letters")
    assert f"type=step.completed session={session_id}" in listed, "the dead letter names the session it failed"


async def test_sent_outbox_rows_inbox_rows_and_delivered_hooks_are_deleted_after_their_retention(deployment, sink):
    from sqlalchemy import func

    from shared.ledger.tables import InboxRow, OutboxRow

    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t", SIGNOFF_OUTBOX_RETENTION_SECONDS="1",
                                SIGNOFF_INBOX_RETENTION_SECONDS="1", SIGNOFF_RETENTION_SWEEP_SECONDS="0.3")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "turn.completed", timeout=30)

        async def left() -> tuple[int, int]:
            async with deployment.ledger() as ledger, ledger() as db:
                outbox = await db.scalar(select(func.count()).select_from(OutboxRow)
                                         .where(OutboxRow.session_id == session_id))
                inbox = await db.scalar(select(func.count()).select_from(InboxRow)
                                        .where(InboxRow.session_id == session_id))
            return outbox, inbox

        assert (await left()) != (0, 0)
        await asyncio.sleep(2.5)
        assert await left() == (0, 0), "nothing past its retention is kept"
        # The session lives on: what was deleted is nothing the ledger reads again.
        await console.send(StartTurn(session_id=session_id, text="again"))
        await next_event(events, "turn.completed", timeout=30)
    assert sink.counts["/sink"] == 1


async def test_an_unanswered_request_is_escalated_once_and_the_escalation_group_may_then_approve(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t", SIGNOFF_EXPIRY_SWEEP_SECONDS="0.2")
    deployment.start()
    session_id = "escalated-" + mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)

        def approval_by(who: str) -> RespondToApproval:
            return console.sign(RespondToApproval(session_id=session_id, request_id=requested.request_id,
                                                  decision="approve", args_digest=requested.args_digest,
                                                  responder=who))

        too_early = approval_by("lee")
        await console.send(too_early)
        assert (await next_event(events, "message.rejected")).reason_code == "not_an_approver"
        escalated = await next_event(events, "approval.escalated", timeout=10)
        assert (escalated.request_id, escalated.escalated_to, escalated.args_digest) == (
            requested.request_id, ["lee"], requested.args_digest)
        assert escalated.card == requested.card
        # Once, also across a ledger restart.
        deployment.kill("approval-ledger")
        deployment.start("approval-ledger")
        await asyncio.sleep(1.5)
        await console.send(approval_by("lee"))
        await next_event(events, "turn.completed", timeout=30)
        seen = [e.type async for e in drain_events(events)]
        assert "approval.escalated" not in seen
    [request] = await rows(deployment, ApprovalRequest, id=requested.request_id)
    assert request.status == "approved" and request.escalated_at is not None
    assert sink.counts["/escalated"] == 1
