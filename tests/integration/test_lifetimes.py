"""Nothing waits forever: an unanswered request expires, the model is told, and a
late answer decides nothing (docs/design.md, invariant 5)."""

from sqlalchemy import select

from shared.ledger.tables import ApprovalRequest, Closure, TranscriptRow
from shared.messages import RespondToApproval, mint
from tests.harness import next_event, rows, start_and_wait_for_approval


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
