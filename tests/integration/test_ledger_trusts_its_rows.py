"""The ledger believes its rows, not the messenger (docs/design.md, "Trust boundaries"): a tool's result is read from the executor's finished claim, never
from a report that anyone holding the executor's broker identity (every python tool
in it) can send; and arguments rewritten in the database (the ledger's role, or the
SQLite file) after the person was asked never run."""

import asyncio

from sqlalchemy import insert, update

from shared.ledger.tables import Closure, Decision, ExecutionClaim, ToolCall
from shared.messages import ToolExecuted, mint, now
from shared.signatures import arguments_fingerprint
from tests.harness import eventually, next_event, rows, start_and_wait_for_approval

WITHOUT_EXECUTOR = ("approval-ledger", "publisher", "model-step")


async def swap_arguments(deployment, call_id: str, arguments: dict) -> None:
    """As an attacker with the ledger's database role would (on SQLite: whoever can
    write the file): the call's arguments and the fingerprint stored beside them."""
    async with deployment.engine("approval-ledger") as engine, engine.begin() as conn:
        changed = await conn.execute(
            update(ToolCall.__table__).where(ToolCall.id == call_id)
            .values(arguments=arguments, args_digest=arguments_fingerprint(arguments)))
        assert changed.rowcount == 1


async def test_a_forged_tool_result_for_an_approved_call_not_yet_run_closes_nothing_and_the_real_run_closes_it_once(
        deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start(*WITHOUT_EXECUTOR)
    session_id = mint("ses")
    async with deployment.console() as console:
        alerts = await console.watch("*")
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "approval.decided")

        async def forge() -> None:
            # A python tool in the executor holds the executor's broker identity.
            forged = ToolExecuted(session_id=session_id, call_id=requested.call_id, outcome="output",
                                  output={"status": 200, "body": {"ok": True, "n": "invented"}})
            async with deployment.console(identity="tool-executor") as tool:
                await tool.send(forged)
            rejected = await next_event(events, "message.rejected")
            assert (rejected.rejected_message_id, rejected.reason_code) == (forged.message_id, "not_claimed")
            alert = await next_event(alerts, "operator.alerted")
            assert (alert.call_id, alert.reason_code) == (requested.call_id, "not_claimed")
            assert await rows(deployment, Closure, call_id=requested.call_id) == [], "nothing closed"

        # Not claimed at all: the executor is not running.
        await forge()
        # Claimed but not finished: the executor holds right after its claim.
        deployment.start("tool-executor", faults="executor.after_claim:hold")
        await eventually(lambda: asyncio.sleep(0, deployment.fault_reached("executor.after_claim")))
        await forge()
        assert sink.counts["/sink"] == 0
        deployment.release("executor.after_claim")

        closed = await next_event(events, "tool.closed", timeout=30)
        await next_event(events, "turn.completed", timeout=30)
        [closure] = await rows(deployment, Closure, call_id=requested.call_id)
        [claim] = await rows(deployment, ExecutionClaim, call_id=requested.call_id)
    assert (closed.call_id, closed.kind) == (requested.call_id, "output")
    real = {"status": 200, "body": {"ok": True, "n": 1}}
    assert closure.output == {"value": claim.result["output"]} == {"value": real}, "the real result, once"
    assert sink.counts["/sink"] == 1


async def test_a_finished_claim_written_straight_into_the_database_without_the_ledgers_authorization_is_not_believed(
        deployment, sink):
    """With the executor's broker identity and its database role (a python tool in the
    executor can read both passwords): a claim row with an invented result, not taken
    under the ledger's authorization of this call, closes nothing, even when the
    executor itself later reports it."""
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start(*WITHOUT_EXECUTOR)
    session_id = mint("ses")
    async with deployment.console() as console:
        alerts = await console.watch("*")
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "approval.decided")
        async with deployment.engine("tool-executor") as engine, engine.begin() as conn:
            await conn.execute(insert(ExecutionClaim.__table__).values(
                call_id=requested.call_id, idempotency_key=mint("idk"), status="finished", holder="a-tool",
                lease_expires_at=now(), attempts=1, outcome="output", result={"output": "invented", "error": None},
                claimed_at=now(), finished_at=now(), authorization="not.the-ledgers"))
        forged = ToolExecuted(session_id=session_id, call_id=requested.call_id, outcome="output", output="invented")
        async with deployment.console(identity="tool-executor") as tool:
            await tool.send(forged)
        rejected = await next_event(events, "message.rejected")
        assert (rejected.rejected_message_id, rejected.reason_code) == (forged.message_id, "not_claimed")
        alert = await next_event(alerts, "operator.alerted")
        assert (alert.call_id, alert.reason_code) == (requested.call_id, "not_claimed")
        # The executor finds the call finished and reports the row: still not the ledger's authorization.
        deployment.start("tool-executor")
        rejected = await next_event(events, "message.rejected", timeout=30)
        assert rejected.reason_code == "not_claimed"
        assert await rows(deployment, Closure, call_id=requested.call_id) == [], "nothing closed"
    assert sink.counts["/sink"] == 0


async def test_arguments_swapped_in_the_database_before_the_approval_never_run_and_the_call_closes_as_altered(
        deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        alerts = await console.watch("*")
        events, requested = await start_and_wait_for_approval(console, session_id)
        await swap_arguments(deployment, requested.call_id, {"message": "swapped by the database's owner"})
        # The person approves the card they were shown, unchanged, with its digest.
        approval = console.sign(requested_response(requested, session_id))
        await console.send(approval)

        rejected = await next_event(events, "message.rejected")
        assert (rejected.rejected_message_id, rejected.reason_code) == (approval.message_id, "altered")
        closed = await next_event(events, "tool.closed")
        assert (closed.call_id, closed.kind, closed.reason_code) == (requested.call_id, "error", "altered")
        alert = await next_event(alerts, "operator.alerted")
        assert (alert.call_id, alert.reason_code) == (requested.call_id, "altered")
        await next_event(events, "turn.completed", timeout=30)
        assert await rows(deployment, Decision, request_id=requested.request_id) == [], "nothing was decided"
        assert await rows(deployment, ExecutionClaim, call_id=requested.call_id) == [], "nothing was claimed"
    assert sink.counts["/sink"] == 0, "nothing ran"


async def test_arguments_swapped_in_the_database_after_the_decision_are_refused_by_the_executor_and_never_run(
        deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start(*WITHOUT_EXECUTOR)
    session_id = mint("ses")
    async with deployment.console() as console:
        alerts = await console.watch("*")
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.send(console.sign(requested_response(requested, session_id)))
        await next_event(events, "approval.decided")
        # The approved command waits for the executor; the row it will be checked against changes.
        async with deployment.engine("approval-ledger") as engine, engine.begin() as conn:
            await conn.execute(update(ToolCall.__table__).where(ToolCall.id == requested.call_id)
                               .values(arguments={"message": "swapped after the decision"}))
        deployment.start("tool-executor")
        alert = await next_event(alerts, "operator.alerted", timeout=30)
        assert (alert.call_id, alert.reason_code) == (requested.call_id, "not_on_record")
        # The refused command is parked, so the turn it stalls fails, its call closed unrun.
        failed = await next_event(events, "turn.failed", timeout=30)
        assert failed.reason_code == "message_parked"
        [claim] = await rows(deployment, ExecutionClaim, call_id=requested.call_id)
        assert (claim.holder, claim.result) == ("ledger", {"error": "cancelled before it ran"}), "no executor took it"
    assert sink.counts["/sink"] == 0, "nothing ran"


def requested_response(requested, session_id: str):
    from shared.messages import RespondToApproval

    return RespondToApproval(session_id=session_id, request_id=requested.request_id, decision="approve",
                             args_digest=requested.args_digest, responder="tester")
