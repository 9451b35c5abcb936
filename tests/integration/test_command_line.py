"""The `signoff` command line, as a person at a terminal uses it, against running services."""

import asyncio
import re
import subprocess
import sys

from services.approval_ledger.models import Session
from shared.settings import PROJECT_ROOT
from tests.harness import eventually, rows


def signoff(deployment, *args: str, check: bool = True) -> str:
    result = subprocess.run([sys.executable, "-m", "services.cli", *args], env=deployment.env(), cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=60)
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

    approved = await asyncio.to_thread(signoff, deployment, "approve", request_id, "--message", "ok")
    assert f"approve sent for {request_id}" in approved
    async def idle():
        [session] = await rows(deployment, Session, id=session_id)
        return session.status == "idle"

    await eventually(idle)
    shown = await asyncio.to_thread(signoff, deployment, "session", "show", session_id)
    assert f"session {session_id}: idle" in shown and "Posted." in shown
    assert sink.counts["/sink"] == 1

    again = await asyncio.to_thread(signoff, deployment, "approve", request_id, check=False)
    assert "already approved" in again
    assert "no pending approval requests" in await asyncio.to_thread(signoff, deployment, "pending")


async def test_an_operator_lists_dead_letters_with_their_reasons_and_they_stay_parked(deployment):
    import aio_pika

    deployment.start("approval-ledger")
    async with deployment.console() as console:
        exchange = await console.channel.get_exchange(f"{deployment.namespace}.commands")
        await exchange.publish(aio_pika.Message(b"{not json", message_id="junk-1"), routing_key="approval.respond")
    for _ in range(100):
        listed = await asyncio.to_thread(signoff, deployment, "dead-letters")
        if "junk-1" in listed:
            break
        await asyncio.sleep(0.1)
    assert "junk-1: invalid:" in listed and "1 dead-lettered message(s)" in listed
    assert "junk-1" in await asyncio.to_thread(signoff, deployment, "dead-letters"), "listing does not consume them"
