"""Replicas: a standby publisher and a second ledger take over from SIGKILLed
ones without a restart (design.md, "Scale"; invariants 1, 4, 9). This is how a
container deployment recovers in well under a second: nothing has to start."""

import asyncio

from shared.ledger.tables import ApprovalRequest, Closure
from shared.messages import mint
from tests.crash.test_crash_windows import finish, wire
from tests.harness import assert_nothing_left_in_any_queue, eventually, next_event, rows, start_and_wait_for_approval

pytestmark = __import__("pytest").mark.crash


async def test_a_standby_publisher_relays_nothing_while_the_leader_lives_and_takes_over_when_it_is_killed(
        pg_deployment, sink):
    deployment = pg_deployment
    wire(deployment, sink)
    deployment.start()
    # The standby holds at its first relayed batch: if it relayed while the
    # leader lived, per-session order would rest on luck.
    deployment.start("publisher#2", faults="publisher.after_send:hold")
    async with deployment.console() as console:
        first = mint("ses")
        events, requested = await start_and_wait_for_approval(console, first)
        completed = await finish(console, events, requested)
        assert completed.text == "Posted."
        assert not deployment.fault_reached("publisher.after_send"), "the standby relayed while the leader lived"

        second = mint("ses")
        events, requested = await start_and_wait_for_approval(console, second)
        deployment.kill("publisher")
        await console.respond(requested.request_id, "approve", "", "", "tester")
        async def standby_relayed():
            return deployment.fault_reached("publisher.after_send")

        await eventually(standby_relayed)
        assert "publisher taking over" in deployment.log_path("publisher#2").read_text()
        deployment.release("publisher.after_send")
        completed = await next_event(events, "turn.completed", timeout=30)
        assert completed.text == "Posted."
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    assert sink.counts["/sink"] == 2, "each approved call ran once"
    for session_id in (first, second):
        assert [c.kind for c in await rows(deployment, Closure, session_id=session_id)] == ["output"]


async def test_a_second_ledger_applies_the_responses_waiting_for_a_killed_one(pg_deployment, sink):
    deployment = pg_deployment
    wire(deployment, sink)
    deployment.start()
    deployment.start("approval-ledger#2")
    async with deployment.console() as console:
        waiting = [(session_id, *await start_and_wait_for_approval(console, session_id))
                   for session_id in (mint("ses") for _ in range(4))]
        deployment.kill("approval-ledger")
        # Nothing restarts: the responses go to the ledger that is still running.
        completed = await asyncio.gather(*(finish(console, events, requested)
                                           for _, events, requested in waiting))
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    assert [c.text for c in completed] == ["Posted."] * 4
    assert sink.counts["/sink"] == 4, "each approved call ran once"
    for session_id, _, requested in waiting:
        assert [r.id for r in await rows(deployment, ApprovalRequest, session_id=session_id)] == [requested.request_id]
        assert [c.kind for c in await rows(deployment, Closure, session_id=session_id)] == ["output"]
