"""Exactly one closure per call, adjacent to its call, before the next model
call (invariant 3); batches resume once; a person's words reach the model."""

from sqlalchemy import select

from shared.ledger.tables import Closure, ProviderAttemptRow, Session, TranscriptRow
from shared.messages import RespondToApproval, StartTurn, mint
from tests.harness import next_event, rows, start_and_wait_for_approval


async def transcript(deployment, session_id):
    async with deployment.ledger() as sessions, sessions() as db:
        found = await db.scalars(select(TranscriptRow).where(TranscriptRow.session_id == session_id)
                                 .order_by(TranscriptRow.position))
        return [r.entry for r in found]


def assert_every_call_closed_adjacent(entries):
    for i, entry in enumerate(entries):
        if entry["role"] == "assistant" and entry["tool_calls"]:
            results = entries[i + 1: i + 1 + len(entry["tool_calls"])]
            assert [r["call_id"] for r in results] == [c["call_id"] for c in entry["tool_calls"]]
            assert all(r["role"] == "tool" and r["closure"] for r in results)


async def test_a_batch_answered_in_reverse_order_resumes_once_with_every_closure_in_place(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    session_id = "batch-" + mint("ses")
    async with deployment.console() as console:
        events, first = await start_and_wait_for_approval(console, session_id)
        second = await next_event(events, "approval.requested")
        assert [first.card.tool, second.card.tool] == ["post_to_sink", "put_to_sink"]
        # Each card says the session waits on both, in the model's order (invariant 5).
        assert first.pending_request_ids == second.pending_request_ids == [first.request_id, second.request_id]
        # The allowed call ran without waiting for the others' approvals.
        allowed = await next_event(events, "tool.closed")
        assert allowed.kind == "output"
        await console.respond(second.request_id, "approve", "", "", "channel-b")
        await console.respond(first.request_id, "approve", "", "", "channel-a")
        completed = await next_event(events, "turn.completed", timeout=30)
    assert completed.text == "All three are closed."
    entries = await transcript(deployment, session_id)
    assert_every_call_closed_adjacent(entries)
    attempts = await rows(deployment, ProviderAttemptRow, session_id=session_id)
    assert len(attempts) == 2, "the step resumed exactly once"
    assert sink.counts["/sink"] == 1 and sink.counts["/records/k2"] == 1


async def test_a_denied_calls_reason_reaches_the_model_and_an_approval_message_costs_no_extra_model_call(
        deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    session_id = "batch-" + mint("ses")
    async with deployment.console() as console:
        events, first = await start_and_wait_for_approval(console, session_id)
        second = await next_event(events, "approval.requested")
        await console.respond(first.request_id, "deny", "wrong channel", "", "alice")
        await console.respond(second.request_id, "approve", "", "yes, but use staging next time", "bob")
        await next_event(events, "turn.completed", timeout=30)
    entries = await transcript(deployment, session_id)
    assert_every_call_closed_adjacent(entries)
    texts = [e["text"] for e in entries]
    assert "The user denied this tool call. Reason: wrong channel" in texts
    note = next(i for i, t in enumerate(texts) if "use staging next time" in t)
    last_result = max(i for i, e in enumerate(entries) if e["role"] == "tool")
    assert note == last_result + 1, "the message rides right after the tool results"
    assert entries[note + 1]["role"] == "assistant", "and into the very next model call"
    assert len(await rows(deployment, ProviderAttemptRow, session_id=session_id)) == 2
    assert sink.counts["/sink"] == 0


async def test_a_tool_that_throws_an_unknown_tool_and_invalid_arguments_each_get_their_closure_and_the_session_goes_on(
        deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url)
    deployment.start()
    session_id = "bad-" + mint("ses")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="try"))
        completed = await next_event(events, "turn.completed", timeout=30)
        assert completed.text == "I saw three errors."
        await console.send(StartTurn(session_id=session_id, text="again"))
        await next_event(events, "turn.completed", timeout=30)
    closures = await rows(deployment, Closure, session_id=session_id)
    reasons = sorted((c.kind, c.reason_code) for c in closures)
    assert reasons == [("error", "invalid_arguments"), ("error", "tool_failed"), ("error", "unknown_tool")]
    entries = await transcript(deployment, session_id)
    assert_every_call_closed_adjacent(entries)
    assert any("RuntimeError" in e["text"] for e in entries)
    assert (await rows(deployment, Session, id=session_id))[0].status == "idle"
    assert sink.counts["/sink"] == 0


async def test_a_new_turn_while_a_request_is_open_is_rejected_and_the_session_reports_waiting(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url)
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.send(StartTurn(session_id=session_id, text="are you done?"))
        rejected = await next_event(events, "message.rejected")
        assert rejected.reason_code == "session_busy"
        [session] = await rows(deployment, Session, id=session_id)
        assert session.status == "waiting"
        # A second response to the same request is stale.
        await console.respond(requested.request_id, "approve", "", "", "a")
        await next_event(events, "turn.completed", timeout=30)
        await console.send(console.sign(RespondToApproval(session_id=session_id, request_id=requested.request_id,
                                                          decision="approve", args_digest=requested.args_digest)))
        stale = await next_event(events, "message.rejected")
        assert stale.reason_code == "already_decided"
    assert sink.counts["/sink"] == 1
