"""The Python SDK (`signoff.Client`, `signoff.AsyncClient`) against a real gateway and the
real services, on both stores: a program starts a session, reads its card, approves
it and follows the event stream, which resumes by itself when the gateway dies."""

from __future__ import annotations

import asyncio

import pytest

import signoff
from shared.ledger.tables import Decision
from shared.messages import mint
from tests.gateway_client import PASSWORD
from tests.harness import eventually, rows
from tests.integration.test_gateway import add_people, committed_event_ids, url


@pytest.fixture
def gateway(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    return deployment


async def test_a_program_starts_a_session_approves_its_card_and_follows_the_stream_across_a_restart(gateway, sink):
    client = await signoff.AsyncClient.login(url(gateway), "alice", PASSWORD)
    async with client:
        started = await client.start_session("go", session_id=f"reviewed-{mint('ses')}")

        async def card():
            return await client.pending(session_id=started.session_id)

        [pending] = await eventually(card)
        assert isinstance(pending, signoff.Card) and pending.tool == "post_reviewed"
        verdict = await client.approve(pending.id, idempotency_key="sdk-1")
        assert isinstance(verdict, signoff.Verdict) and (verdict.responder, verdict.decided) == ("alice", True)
        with pytest.raises(signoff.Problem) as refused:
            await client.deny(pending.id, "too late")
        assert refused.value.reason_code == "already_decided" and refused.value.status == 409

        seen: list[signoff.Event] = []

        async def follow():
            async for event in client.events(retry_seconds=0.2):
                seen.append(event)
                if event.type == "turn.completed" and event.data["session_id"] == started.session_id:
                    return

        following = asyncio.create_task(follow())
        await eventually(lambda: _async(len(seen) >= 1))
        gateway.kill("gateway")  # the stream breaks; the iterator reconnects once it is back
        gateway.start("gateway")
        await asyncio.wait_for(following, 60)
        view = await client.session(started.session_id)
        assert isinstance(view, signoff.SessionView) and view.started_by == "alice"
    ids = [event.id for event in seen]
    assert ids == (await committed_event_ids(gateway))[: len(ids)]
    [decision] = await rows(gateway, Decision, request_id=pending.id)
    assert decision.responder == "alice" and sink.counts["/reviewed"] == 1


def test_the_blocking_client_denies_with_a_reason(gateway, sink):
    with signoff.Client(url(gateway), "sam", PASSWORD) as sam:
        session_id = sam.start_session("go", session_id=f"reviewed-{mint('ses')}").session_id
        cards = []
        for _ in range(200):
            cards = sam.pending(session_id=session_id)
            if cards:
                break
            __import__("time").sleep(0.1)
        [card] = cards
        with pytest.raises(signoff.Problem) as refused:
            sam.approve(card.id)
        assert refused.value.kind == "not-an-approver"
        verdict = sam.deny(card.id, "not today")
        assert isinstance(verdict, signoff.Verdict) and verdict.decision == "deny"
        first = next(iter(sam.events()))
        assert first.type == "approval.requested" and first.data["request_id"] == card.id
    assert sink.counts["/reviewed"] == 0


async def _async(value):
    return value


def test_the_examples_an_app_that_waits_for_its_answer_and_a_bot_that_approves_from_a_rule(gateway, sink):
    import subprocess
    import sys

    from shared.settings import PROJECT_ROOT

    address = url(gateway)
    bot = subprocess.Popen([sys.executable, "examples/approval_bot.py", address, "bob", PASSWORD, "post_reviewed", "1"],
                           cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        app = subprocess.run([sys.executable, "examples/start_and_wait.py", address, "alice", PASSWORD, "go",
                              f"reviewed-{mint('ses')}"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                             timeout=90)
        assert app.returncode == 0, app.stdout + app.stderr
        assert "waiting on apr_" in app.stdout and "answer: Done." in app.stdout
        assert bot.wait(30) == 0
        assert ": approve" in bot.stdout.read()
    finally:
        if bot.poll() is None:
            bot.kill()
    assert sink.counts["/reviewed"] == 1
