"""The `signoff` command line, as a person at a terminal uses it, against running services."""

import asyncio
import json
import re
import subprocess
import sys

from shared.ledger.tables import Session
from shared.messages import RespondToApproval, mint
from shared.settings import PROJECT_ROOT
from tests.harness import SERVICES, eventually, rows, start_and_wait_for_approval


def signoff(deployment, *args: str, check: bool = True, answer: str = "") -> str:
    """Run `signoff` as a person at a terminal would, typing `answer` when it asks."""
    result = subprocess.run([sys.executable, "-m", "services.cli", *args], env=deployment.env(), cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=60, input=answer)
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
        await exchange.publish(aio_pika.Message(json.dumps(bad_decision).encode(), message_id="junk-2"),
                               routing_key="approval.respond")

    async def both_parked():
        listed = await asyncio.to_thread(signoff, deployment, "dead-letters")
        return listed if "junk-2" in listed else None

    listed = await eventually(both_parked)
    again = await asyncio.to_thread(signoff, deployment, "dead-letters")
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
        listed = await asyncio.to_thread(signoff, deployment, "dead-letters")
        return listed if "delivery_limit" in listed else None

    lines = (await eventually(parked)).splitlines()
    assert lines[0] == f"1 dead-lettered message(s) in {deployment.namespace}.dead-letters"
    assert re.fullmatch(rf"\S+  \S+  type=approval.respond session={session_id}  consumer=approval-ledger",
                        lines[1]), lines
    assert lines[2] == ("    delivery_limit: failed on all 3 deliveries; the last error: FaultRaised: "
                        "fault point ledger.before_commit armed to raise"), lines
    assert sink.counts["/sink"] == 0
