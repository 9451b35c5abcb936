"""An operator's action on a parked message is recorded before the message leaves the
dead-letter queue: `signoff dead-letters drop|replay` is SIGKILLed
at the fault point between the two (`console.after_record`, shared/faults.py). The
action is on record and the message is still parked; run again, the command finishes
the action on record (for that very parking) instead of recording or doing it twice."""

import asyncio
import subprocess
import sys

import aio_pika
import pytest

from shared.ledger.tables import DeadLetterAction, Decision
from shared.messages import mint
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

pytestmark = pytest.mark.crash


def signoff(deployment, *args: str, faults: str = "") -> subprocess.CompletedProcess:
    env = deployment.env() | ({"SIGNOFF_FAULTS": faults} if faults else {})
    return subprocess.run([sys.executable, "-m", "services.operations.cli", *args], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=60)


async def parked_ids(deployment) -> list[str]:
    """The ids `signoff dead-letters` lists, in order (it leaves them parked)."""
    listed = await asyncio.to_thread(signoff, deployment, "dead-letters")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    return [line.split()[1] for line in listed.stdout.splitlines()[1:] if not line.startswith(" ")]


async def still_parked(check, message_id: str) -> None:
    try:
        await eventually(check, timeout=10)
    except AssertionError:
        raise AssertionError(f"{message_id} left the dead-letter queue although the command died before acting on "
                             "it: it was acknowledged before its action was recorded") from None


@pytest.mark.slow(reason="three `signoff` processes, each a Python start-up, one killed mid-action and waited out")
async def test_a_drop_killed_after_its_record_leaves_the_message_parked_and_a_rerun_drops_it_recorded_once(
    deployment,
):
    deployment.start("approval-ledger")
    async with deployment.console() as console:
        exchange = await console.channel.get_exchange(f"{deployment.namespace}.channels")
        for junk in ("junk-1", "junk-2"):
            await exchange.publish(aio_pika.Message(b"{not json", message_id=junk), routing_key="approval.respond")

    async def both_parked():
        ids = await parked_ids(deployment)
        return ids if len(ids) == 2 else None

    assert await eventually(both_parked) == ["junk-1", "junk-2"]
    killed = await asyncio.to_thread(signoff, deployment, "dead-letters", "drop", "junk-2", "--reason", "garbage",
                                     "--as", "olga", faults="console.after_record@dropped")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert deployment.fault_reached("console.after_record")
    [action] = await rows(deployment, DeadLetterAction, message_id="junk-2")
    assert (action.action, action.operator, action.reason) == ("dropped", "olga", "garbage"), "recorded first"
    assert action.parked_at not in (None, "?")
    # Its channel died with it: the broker returns the copy it had taken, unacknowledged.
    await still_parked(both_parked, "junk-2")

    again = await asyncio.to_thread(signoff, deployment, "dead-letters", "drop", "junk-2", "--reason", "garbage",
                                    "--as", "olga")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.startswith("dropped junk-2  type=? session=?  (parked: invalid)  (finishing the action "
                                   "olga recorded at "), again.stdout
    assert await parked_ids(deployment) == ["junk-1"]
    assert [a.id for a in await rows(deployment, DeadLetterAction, message_id="junk-2")] == [action.id], (
        "the rerun recorded no second action")
    # Another operator's drop of another message is its own action, recorded as usual.
    other = await asyncio.to_thread(signoff, deployment, "dead-letters", "drop", "junk-1", "--reason", "also")
    assert other.returncode == 0 and "finishing" not in other.stdout, other.stdout
    assert len(await rows(deployment, DeadLetterAction)) == 2


async def test_a_replay_killed_after_its_record_sends_nothing_and_a_rerun_replays_it_once(deployment, sink):
    """A response parked at its delivery limit (the ledger failed on every delivery); the
    ledger fixed, the replay is killed after recording it: nothing was sent, the request
    still waits and the response is still parked. Run again: sent once, decided once,
    the tool runs once, one action on record."""
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t", SIGNOFF_DELIVERY_LIMIT="2")
    deployment.start(*(s for s in SERVICES if s != "approval-ledger"))
    deployment.start("approval-ledger", faults="ledger.before_commit@approval.respond:raise")
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        response_id = await console.respond(requested.request_id, "approve", "", "", "tester")

        async def parked():
            return response_id in await parked_ids(deployment)

        await eventually(parked)
        deployment.kill("approval-ledger")
        deployment.start("approval-ledger")
        killed = await asyncio.to_thread(signoff, deployment, "dead-letters", "replay", response_id, "--as", "olga",
                                         faults="console.after_record")
        assert killed.returncode == -9, killed.stdout + killed.stderr
        [action] = await rows(deployment, DeadLetterAction, message_id=response_id)
        assert (action.action, action.operator) == ("replayed", "olga")
        await still_parked(parked, response_id)
        seen = [e.type async for e in drain_events(events, settle=1.0)]
        assert "approval.decided" not in seen, "nothing was sent before the kill"
        assert await rows(deployment, Decision, request_id=requested.request_id) == []

        again = await asyncio.to_thread(signoff, deployment, "dead-letters", "replay", response_id, "--as", "olga")
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.startswith(f"replayed {response_id}  type=approval.respond") and "finishing" in again.stdout
        decided = await next_event(events, "approval.decided", timeout=30)
        assert (decided.request_id, decided.responder) == (requested.request_id, "tester")
        await next_event(events, "turn.completed", timeout=30)
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    assert sink.counts["/sink"] == 1
    assert [a.id for a in await rows(deployment, DeadLetterAction, message_id=response_id)] == [action.id]
    assert len(await rows(deployment, Decision, request_id=requested.request_id)) == 1
    assert action.parked_reason.startswith("delivery_limit: failed on all 3 deliveries")
