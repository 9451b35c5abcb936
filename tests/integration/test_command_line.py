"""The `signoff` command line, as a person at a terminal uses it, against running services."""

import asyncio
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import threading
from unittest import mock

from shared.ledger.tables import DeadLetterAction, Decision, ProviderAttemptRow, Session
from shared.messages import RespondToApproval, StartTurn, mint
from shared.settings import PROJECT_ROOT
from tests.harness import (
    SERVICES,
    assert_nothing_left_in_any_queue,
    drain_events,
    eventually,
    next_event,
    rows,
    start_and_wait_for_approval,
)


def signoff(deployment, *args: str, check: bool = True, answer: str = "") -> str:
    """Run `signoff` as a person at a terminal would, typing `answer` when it asks (the operators'
    dead-letter commands below run through `signoff_here`: what they show and do, not how they start)."""
    result = subprocess.run([sys.executable, "-m", "services.operations.cli", *args], env=deployment.env(), cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=60, input=answer)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


_here = threading.Lock()


def signoff_in_process(deployment, *args: str) -> subprocess.CompletedProcess:
    """`signoff`'s own `main` run in this process, with the deployment's environment: for a test
    of what a command shows or does, not of how it starts (a Python start-up per command is
    most of the cost of a test that runs many). One at a time: the environment is the process's."""
    from services.operations import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    with _here, mock.patch.dict(os.environ, deployment.env(), clear=True), \
            contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = cli.main(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return subprocess.CompletedProcess(["signoff", *args], code or 0, stdout.getvalue(), stderr.getvalue())


def signoff_here(deployment, *args: str, check: bool = True) -> str:
    """`signoff_in_process`'s output (stdout and stderr), as `signoff` gives it."""
    result = signoff_in_process(deployment, *args)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


async def test_a_person_starts_a_session_reads_the_card_approves_and_sees_the_tool_ran_once(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    started = await asyncio.to_thread(signoff, deployment, "session", "start", "post it", "--wait")
    session_id = started.splitlines()[0]
    assert session_id.startswith("ses_") and "approval.requested" in started and "pending_request_ids" in started

    pending = await asyncio.to_thread(signoff, deployment, "pending")
    [request_id] = re.findall(r"request:\s+(apr_\w+)", pending)
    assert "Post a message to the sink" in pending and "***redacted***" in pending and "sk-secret" not in pending

    # Not answering yes sends nothing: the card is shown, and the request stays pending.
    declined = await asyncio.to_thread(signoff, deployment, "approve", request_id, check=False, answer="\n")
    assert f"request:   {request_id}" in declined and "target:    POST ${env:SINK_URL}/sink" in declined
    assert "hidden:    api_token" in declined and "sk-secret" not in declined
    assert "not sent; nothing was decided" in declined and "approve sent" not in declined
    approved = await asyncio.to_thread(signoff, deployment, "approve", request_id, "--message", "ok", answer="y\n")
    assert f"request:   {request_id}" in approved and f"approve {request_id} as " in approved
    assert f"approve sent for {request_id}" in approved
    async def idle():
        [session] = await rows(deployment, Session, id=session_id)
        return session.status == "idle"

    await eventually(idle)
    shown = await asyncio.to_thread(signoff, deployment, "session", "show", session_id)
    assert f"session {session_id}: idle" in shown and "Posted." in shown
    assert sink.counts["/sink"] == 1

    again = await asyncio.to_thread(signoff, deployment, "approve", request_id, "--yes", check=False)
    assert "already approved" in again
    assert "no pending approval requests" in await asyncio.to_thread(signoff, deployment, "pending")


async def test_an_operator_lists_dead_letters_once_each_with_their_reasons_and_they_stay_parked(deployment):
    import aio_pika

    deployment.start("approval-ledger")
    session_id = mint("ses")
    bad_decision = RespondToApproval(session_id=session_id, request_id=mint("apr"), decision="approve",
                                     args_digest="sha256:x").model_dump(mode="json") | {"decision": "maybe"}
    async with deployment.console() as console:
        exchange = await console.channel.get_exchange(f"{deployment.namespace}.channels")
        await exchange.publish(aio_pika.Message(b"{not json", message_id="junk-1"), routing_key="approval.respond")
        await exchange.publish(aio_pika.Message(json.dumps(bad_decision).encode(), message_id="junk-2",
                                                user_id=console.user), routing_key="approval.respond")

    async def both_parked():
        listed = await asyncio.to_thread(signoff_here, deployment, "dead-letters")
        return listed if "junk-2" in listed else None

    listed = await eventually(both_parked)
    again = await asyncio.to_thread(signoff_here, deployment, "dead-letters")
    for listing in (listed, again):  # listing does not consume them, nor repeat one
        lines = listing.splitlines()
        assert lines[0] == f"2 dead-lettered message(s) in {deployment.namespace}.dead-letters"
        assert len(lines) == 5, listing
        junk, bad = lines[1:3], lines[3:5]
        assert re.fullmatch(r"\S+  junk-1  type=\? session=\?  consumer=approval-ledger", junk[0]), junk
        assert junk[1].startswith("    invalid: (message): Invalid JSON"), junk
        assert re.fullmatch(rf"\S+  junk-2  type=approval.respond session={session_id}  consumer=approval-ledger",
                            bad[0]), bad
        assert bad[1].startswith("    invalid: decision: "), bad


async def test_a_message_that_fails_on_every_delivery_is_parked_with_the_reason_and_its_last_error(deployment, sink):
    """The ledger fails every time it applies the response (a fault point armed to raise):
    after the delivery limit it is parked as delivery_limit, naming the error."""
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t", SIGNOFF_DELIVERY_LIMIT="2")
    deployment.start(*(s for s in SERVICES if s != "approval-ledger"))
    deployment.start("approval-ledger", faults="ledger.before_commit@approval.respond:raise")
    session_id = mint("ses")
    async with deployment.console() as console:
        _, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")

    async def parked():
        listed = await asyncio.to_thread(signoff_here, deployment, "dead-letters")
        return listed if "delivery_limit" in listed else None

    lines = (await eventually(parked)).splitlines()
    assert lines[0] == f"1 dead-lettered message(s) in {deployment.namespace}.dead-letters"
    assert re.fullmatch(rf"\S+  \S+  type=approval.respond session={session_id}  consumer=approval-ledger",
                        lines[1]), lines
    assert lines[2] == ("    delivery_limit: failed on all 3 deliveries (the first and the 2 redeliveries "
                        "SIGNOFF_DELIVERY_LIMIT allows); the last error: FaultRaised: "
                        "fault point ledger.before_commit armed to raise"), lines
    assert sink.counts["/sink"] == 0


async def test_an_operator_replays_a_parked_response_after_the_fault_is_lifted_and_it_is_applied_once(
    deployment, sink
):
    """The ledger failed on every delivery of a response (its fault armed to raise): parked.
    The fault lifted (a ledger without it), `signoff dead-letters replay ID` sends it back
    to its queue as its sender: applied once, the tool runs once; replayed again, nothing."""
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t", SIGNOFF_DELIVERY_LIMIT="2")
    deployment.start(*(s for s in SERVICES if s != "approval-ledger"))
    deployment.start("approval-ledger", faults="ledger.before_commit@approval.respond:raise")
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        response_id = await console.respond(requested.request_id, "approve", "", "", "tester")

        async def parked():
            listed = await asyncio.to_thread(signoff_here, deployment, "dead-letters")
            return listed if "delivery_limit" in listed else None

        assert response_id in await eventually(parked)
        deployment.kill("approval-ledger")
        deployment.start("approval-ledger")
        replayed = await asyncio.to_thread(signoff_here, deployment, "dead-letters", "replay", response_id,
                                           "--as", "olga", "--reason", "the ledger is fixed")
        assert replayed.startswith(f"replayed {response_id}  type=approval.respond session={session_id}"), replayed
        decided = await next_event(events, "approval.decided", timeout=30)
        assert (decided.request_id, decided.responder) == (requested.request_id, "tester")
        await next_event(events, "turn.completed", timeout=30)
        again = await asyncio.to_thread(signoff_here, deployment, "dead-letters", "replay", response_id, check=False)
        assert f"no parked message {response_id}" in again
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    assert sink.counts["/sink"] == 1
    [decision] = await rows(deployment, Decision, request_id=requested.request_id)
    assert decision.message_id == response_id
    [action] = await rows(deployment, DeadLetterAction, message_id=response_id)
    assert (action.action, action.message_type, action.session_id, action.operator, action.reason) == (
        "replayed", "approval.respond", session_id, "olga", "the ledger is fixed")
    assert action.parked_reason.startswith("delivery_limit: failed on all 3 deliveries")


async def test_an_operator_drops_parked_messages_with_a_reason_that_the_ledger_keeps(deployment):
    import aio_pika

    deployment.start("approval-ledger")
    async with deployment.console() as console:
        exchange = await console.channel.get_exchange(f"{deployment.namespace}.channels")
        for junk in ("junk-1", "junk-2", "junk-3"):
            await exchange.publish(aio_pika.Message(b"{not json", message_id=junk), routing_key="approval.respond")

    async def all_parked():
        listed = await asyncio.to_thread(signoff_here, deployment, "dead-letters")
        return listed if listed.startswith("3 dead-lettered") else None

    await eventually(all_parked)
    # Nothing to replay it as: it names no message type.
    refused = await asyncio.to_thread(signoff_here, deployment, "dead-letters", "replay", "junk-1", check=False)
    assert "junk-1: not replayed: its body names no message type" in refused
    missing = await asyncio.to_thread(signoff_here, deployment, "dead-letters", "drop", "junk-1", check=False)
    assert "--reason" in missing, "a drop needs a reason"
    dropped = await asyncio.to_thread(signoff_here, deployment, "dead-letters", "drop", "junk-2", "--reason",
                                      "garbage from a load test", "--as", "olga")
    assert dropped.startswith("dropped junk-2  type=? session=?  (parked: invalid)"), dropped
    listed = await asyncio.to_thread(signoff_here, deployment, "dead-letters")
    assert listed.startswith("2 dead-lettered") and "junk-1" in listed and "junk-3" in listed, listed
    rest = await asyncio.to_thread(signoff_here, deployment, "dead-letters", "drop", "--all", "--reason", "all garbage")
    assert rest.splitlines()[-1] == "2 message(s) dropped", rest
    assert (await asyncio.to_thread(signoff_here, deployment, "dead-letters")).startswith("0 dead-lettered")
    actions = {a.message_id: a for a in await rows(deployment, DeadLetterAction, action="dropped")}
    assert set(actions) == {"junk-1", "junk-2", "junk-3"}
    assert (actions["junk-2"].reason, actions["junk-2"].operator) == ("garbage from a load test", "olga")
    assert actions["junk-2"].parked_reason.startswith("invalid: (message): Invalid JSON")
    assert actions["junk-1"].reason == "all garbage"


async def test_a_replayed_model_step_report_reaches_the_ledger_as_the_model_steps_own(sqlite_deployment):
    """A parked `step.completed` counts only from the model-step's broker identity: the
    replay sends it as that identity. Its turn had failed when it was parked, so the
    ledger counts its attempt as discarded, and refuses nothing."""
    deployment = sqlite_deployment
    deployment.extra_env.update(SIGNOFF_DELIVERY_LIMIT="2")
    deployment.start(*(s for s in SERVICES if s != "approval-ledger"))
    deployment.start("approval-ledger", faults="ledger.before_commit@step.completed:raise")
    session_id = "read-" + mint("ses")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="what time is it"))
        failed = await next_event(events, "turn.failed", timeout=60)
        assert failed.reason_code == "message_parked"
        listed = await asyncio.to_thread(signoff_here, deployment, "dead-letters")
        [report_id] = re.findall(r"  (\S+)  type=step.completed ", listed)
        deployment.kill("approval-ledger")
        deployment.start("approval-ledger")
        replayed = await asyncio.to_thread(signoff_here, deployment, "dead-letters", "replay", "--all")
        assert replayed.splitlines()[-1] == "1 message(s) replayed", replayed

        async def discarded():
            return [a for a in await rows(deployment, ProviderAttemptRow, report_message_id=report_id)
                    if a.status == "discarded"]

        await eventually(discarded)
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
        seen = [e async for e in drain_events(events)]
    assert not [e for e in seen if e.type == "message.rejected"], seen


def test_setup_that_cannot_reach_the_management_api_names_it_without_the_administrators_password(sqlite_deployment):
    sqlite_deployment.extra_env["SIGNOFF_RABBITMQ_ADMIN_URL"] = "http://admin:adm1n-s3cret-pw@127.0.0.1:9/"
    said = signoff(sqlite_deployment, "setup", check=False)
    assert "cannot use RabbitMQ's management API at http://admin@127.0.0.1:9/" in said, said
    assert "adm1n-s3cret-pw" not in said and "Traceback" not in said
