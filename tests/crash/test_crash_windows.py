"""Every crash window of the design (design.md, "Where crashes land"): a real
process is SIGKILLed at a named fault point or while a callback is held, a
replacement starts on the same data, and the invariants still hold."""

import asyncio
import json

from shared.ledger.tables import ApprovalRequest, Closure, ExecutionClaim, InboxRow, ProviderAttemptRow
from shared.messages import StartTurn, mint
from tests.sink import HOOK_SECRET
from tests.harness import (
    drain_events,
    assert_nothing_left_in_any_queue,
    eventually,
    next_event,
    rows,
    start_and_wait_for_approval,
)

pytestmark = __import__("pytest").mark.crash


def wire(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="tok")


async def finish(console, events, requested):
    """Answer the original request id and wait for the turn to end."""
    await console.respond(requested.request_id, "approve", "", "", "tester")
    return await next_event(events, "turn.completed", timeout=30)


async def assert_one_request_and_one_run(deployment, sink, session_id, requested, path="/sink"):
    async with deployment.console() as console:
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    requests = await rows(deployment, ApprovalRequest, session_id=session_id)
    assert [r.id for r in requests] == [requested.request_id], "the request id shown is the only one ever made"
    assert sink.counts[path] == 1, "the tool ran exactly once"
    closures = await rows(deployment, Closure, session_id=session_id)
    assert [c.kind for c in closures] == ["output"]


async def test_a_held_hook_and_a_killed_ledger_and_publisher_keep_the_request_id_answerable(deployment, sink,
                                                                                              tmp_path):
    """The exact scenario of reference 000 (invariants 1, 2): the hook's receiver did its
    work but holds its answer; the services die; the hook is released; replacements
    start; the original request id resumes exactly the original call, once."""
    wire(deployment, sink)
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(json.dumps({"hooks": [{"name": "app", "url": f"{sink.url}/hook", "secret": HOOK_SECRET,
                                            "events": ["approval.requested", "turn.completed"]}]}))
    deployment.extra_env["SIGNOFF_HOOKS_FILE"] = str(hooks)
    sink.hold_next("/hook")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await asyncio.to_thread(sink.wait_held)
        deployment.kill("approval-ledger")
        deployment.kill("publisher")
        sink.release()
        deployment.start("approval-ledger", "publisher")
        completed = await finish(console, events, requested)
    assert completed.text == "Posted."
    await assert_one_request_and_one_run(deployment, sink, session_id, requested)
    # No model step was recomputed: one attempt for the approval step, one to finish.
    attempts = await rows(deployment, ProviderAttemptRow, session_id=session_id)
    assert [a.status for a in attempts] == ["completed", "completed"]
    # The held hook was delivered again after the restart, with the same delivery id and a valid signature.
    first = [r for r in sink.requests if r["path"] == "/hook"]
    assert first[0]["headers"]["Signoff-Event"] == "approval.requested"
    redelivered = [r for r in first if r["headers"]["Signoff-Delivery"] == first[0]["headers"]["Signoff-Delivery"]]
    assert len(redelivered) >= 2
    # The receiver checked each one with signoff.hooks.verify (tests/sink.py).
    assert all(request["verified"] for request in first)


async def test_a_ledger_killed_before_commit_shows_nothing_and_the_redelivery_mints_the_only_request(deployment,
                                                                                                    sink):
    wire(deployment, sink)
    deployment.start_with_fault("approval-ledger", "ledger.before_commit@step.completed")
    session_id = mint("ses")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="go"))
        await asyncio.to_thread(deployment.wait_exit, "approval-ledger")
        assert await rows(deployment, ApprovalRequest, session_id=session_id) == []
        deployment.start("approval-ledger")
        requested = await next_event(events, "approval.requested")
        await finish(console, events, requested)
        seen = [e async for e in drain_events(events) if e.type == "approval.requested"]
        assert seen == [], "no other approval request was ever shown"
    await assert_one_request_and_one_run(deployment, sink, session_id, requested)


async def test_a_ledger_killed_after_commit_before_ack_treats_the_redelivery_as_a_no_op(deployment, sink):
    wire(deployment, sink)
    deployment.start_with_fault("approval-ledger", "ledger.after_commit@step.completed")
    session_id = mint("ses")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="go"))
        requested = await next_event(events, "approval.requested")
        await deployment.replace_after_fault("approval-ledger")
        await finish(console, events, requested)
    await assert_one_request_and_one_run(deployment, sink, session_id, requested)
    reports = [r for r in await rows(deployment, InboxRow, session_id=session_id) if r.message_type == "step.completed"]
    assert len(reports) == 2, "two steps, each report applied once"
    attempts = await rows(deployment, ProviderAttemptRow, session_id=session_id)
    assert [a.status for a in attempts] == ["completed", "completed"], "the redelivery never reached the handler"


async def test_a_publisher_killed_after_send_before_marking_resends_with_the_same_id_and_consumers_drop_it(
        deployment, sink):
    wire(deployment, sink)
    deployment.start_with_fault("publisher", "publisher.after_send")
    session_id = mint("ses")
    async with deployment.console() as console, deployment.observer() as observer:
        events = await console.watch(session_id)
        # A copy of every step request, to see the resend itself.
        copies = await observer.declare_queue(exclusive=True)
        await copies.bind(f"{deployment.namespace}.commands", routing_key="step.requested")
        await console.send(StartTurn(session_id=session_id, text="go"))
        await deployment.replace_after_fault("publisher")
        requested = await next_event(events, "approval.requested")
        await finish(console, events, requested)
        ids = []
        while (raw := await copies.get(no_ack=True, fail=False)) is not None:
            ids.append(raw.message_id)
    assert len(ids) == 3 and ids[0] == ids[1] != ids[2], "the first batch was sent again with the same message id"
    await assert_one_request_and_one_run(deployment, sink, session_id, requested)
    attempts = await rows(deployment, ProviderAttemptRow, session_id=session_id)
    assert sorted(a.status for a in attempts if a.status != "discarded") == ["completed", "completed"]


async def test_a_response_sent_while_the_ledger_is_down_waits_and_is_applied_once(deployment, sink):
    wire(deployment, sink)
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        deployment.kill("approval-ledger")
        await console.respond(requested.request_id, "approve", "", "", "tester")
        queue = await console.channel.declare_queue(f"{deployment.namespace}.ledger.responses", passive=True)
        assert queue.declaration_result.message_count == 1, "the response waits in its queue"
        assert sink.counts["/sink"] == 0
        deployment.start("approval-ledger")
        await next_event(events, "turn.completed", timeout=30)
    await assert_one_request_and_one_run(deployment, sink, session_id, requested)


async def test_an_outward_call_whose_executor_died_mid_call_is_closed_as_outcome_unknown_and_never_rerun(
        deployment, sink):
    wire(deployment, sink)
    deployment.start()
    session_id = mint("ses")
    sink.hold_next("/sink")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await asyncio.to_thread(sink.wait_held)
        deployment.kill("tool-executor")
        sink.release()
        deployment.start("tool-executor")
        closed = await next_event(events, "tool.closed", timeout=30)
        alert = await next_event(events, "operator.alerted")
        await next_event(events, "turn.completed")
    assert closed.kind == "outcome_unknown" and closed.reason_code == "outcome_unknown"
    assert alert.call_id == closed.call_id
    assert sink.counts["/sink"] == 1, "an outward call is never repeated"


async def test_an_outward_call_killed_after_its_effect_before_recording_is_outcome_unknown(deployment, sink):
    wire(deployment, sink)
    deployment.start_with_fault("tool-executor", "executor.after_effect")
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await deployment.replace_after_fault("tool-executor")
        closed = await next_event(events, "tool.closed", timeout=30)
    assert closed.kind == "outcome_unknown"
    assert sink.counts["/sink"] == 1


async def test_an_idempotent_call_whose_executor_died_mid_call_is_retried_with_the_same_idempotency_key(
        deployment, sink):
    wire(deployment, sink)
    deployment.start()
    session_id = "put-" + mint("ses")
    sink.hold_next("/records")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await asyncio.to_thread(sink.wait_held)
        deployment.kill("tool-executor")
        sink.release()
        deployment.start("tool-executor")
        closed = await next_event(events, "tool.closed", timeout=30)
    assert closed.kind == "output"
    keys = sink.headers_of("/records/k1", "Idempotency-Key")
    assert len(keys) == 2 and keys[0] == keys[1], keys
    [claim] = await rows(deployment, ExecutionClaim, call_id=closed.call_id)
    assert (claim.status, claim.attempts) == ("finished", 2)


async def test_an_executor_killed_after_recording_reports_the_recorded_result_without_running_again(deployment,
                                                                                                   sink):
    wire(deployment, sink)
    deployment.start_with_fault("tool-executor", "executor.after_record")
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await deployment.replace_after_fault("tool-executor")
        await next_event(events, "turn.completed", timeout=30)
    await assert_one_request_and_one_run(deployment, sink, session_id, requested)


async def test_a_model_step_killed_after_reporting_has_its_second_report_discarded_and_counted(deployment, sink):
    wire(deployment, sink)
    deployment.start_with_fault("model-step", "model_step.after_report")
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await asyncio.to_thread(deployment.wait_exit, "model-step")
        # Redis's fast path would hide the redelivery from the model-step; forget it.
        await deployment.forget_redis()
        deployment.start("model-step")
        async def both_reports_recorded():
            found = await rows(deployment, ProviderAttemptRow, session_id=session_id)
            return found if len(found) >= 2 else None

        attempts = await eventually(both_reports_recorded)
        await finish(console, events, requested)
    assert sorted(a.status for a in attempts) == ["completed", "discarded"]
    await assert_one_request_and_one_run(deployment, sink, session_id, requested)


async def test_a_model_step_killed_mid_call_is_redelivered_and_the_lost_attempt_is_counted_as_abandoned(
        deployment, sink):
    wire(deployment, sink)
    deployment.start_with_fault("model-step", "model_step.mid_call")
    session_id = mint("ses")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="go"))
        await deployment.replace_after_fault("model-step")
        requested = await next_event(events, "approval.requested")
        await finish(console, events, requested)
    attempts = await rows(deployment, ProviderAttemptRow, session_id=session_id)
    assert sorted(a.status for a in attempts) == ["abandoned", "completed", "completed"]
    await assert_one_request_and_one_run(deployment, sink, session_id, requested)


async def test_redis_flushed_at_every_step_changes_nothing_but_speed(deployment, sink):
    """Invariant 8, with a redelivered response: the ledger dies after committing the
    decision, Redis is flushed, and the redelivery must still be a no-op."""
    wire(deployment, sink)
    deployment.start_with_fault("approval-ledger", "ledger.after_commit@approval.respond")
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await deployment.forget_redis()
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await asyncio.to_thread(deployment.wait_exit, "approval-ledger")
        await deployment.forget_redis()
        deployment.start("approval-ledger")
        await next_event(events, "turn.completed", timeout=30)
        await deployment.forget_redis()
        stray = [e async for e in drain_events(events) if e.type in ("message.rejected", "approval.decided")]
        assert stray == [], "the redelivered response was a silent no-op (inbox), not applied or judged again"
    await assert_one_request_and_one_run(deployment, sink, session_id, requested)


async def test_an_expiry_sweep_killed_half_way_closes_each_request_once_after_the_restart(deployment, sink):
    """Two requests past their deadline; the ledger is SIGKILLed right after the sweep
    closed the first; the replacement closes the other, and neither twice."""
    wire(deployment, sink)
    deployment.extra_env.update(SIGNOFF_APPROVAL_TIMEOUT_SECONDS="2", SIGNOFF_EXPIRY_SWEEP_SECONDS="0.2")
    deployment.start_with_fault("approval-ledger", "ledger.after_expiry")
    sessions = [mint("ses"), mint("ses")]
    async with deployment.console() as console:
        watched = [await start_and_wait_for_approval(console, s) for s in sessions]
        await deployment.replace_after_fault("approval-ledger")
        seen = []
        for events, _ in watched:
            while (event := await next_event(events, timeout=30)).type != "turn.completed":
                seen.append(event.type)
            seen += [e.type async for e in drain_events(events)]
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    for session_id, (_, requested) in zip(sessions, watched, strict=True):
        [closure] = await rows(deployment, Closure, call_id=requested.call_id)
        assert closure.kind == "expired"
        [request] = await rows(deployment, ApprovalRequest, session_id=session_id)
        assert request.status == "expired"
    assert (seen.count("approval.expired"), seen.count("tool.closed")) == (2, 2), "each closed, and said so, once"
    assert sink.counts["/sink"] == 0
