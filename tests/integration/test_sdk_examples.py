"""The SDK (signoff.Client, signoff.AsyncClient) and its examples against the real
deployment: the four services and a real gateway process, on both stores. The
examples run as a user runs them (`python examples/…`), as their own logins."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

import httpx
import pytest

from services.gateway import users
from shared.ledger.tables import ApprovalRequest, AuditEntry, Decision, InboxRow
from shared.messages import mint
from shared.settings import PROJECT_ROOT
from signoff import AsyncClient, ProblemError
from tests.gateway_client import PASSWORD
from tests.harness import eventually, rows
from tests.integration.test_gateway import add_people, committed_event_ids, url

BOT = "refund-bot"


@pytest.fixture
def gateway(deployment, sink):
    """The four services and one gateway; its users are the tests' people and the refund bot."""
    deployment.extra_env["SINK_URL"] = sink.url
    add_people(deployment)
    keys = deployment.data_dir / "keys"
    users.add(keys, keys / "gateway" / "users.yaml", BOT, PASSWORD, [], False)
    deployment.start()
    deployment.start("gateway")
    return deployment


async def run_example(name: str, *args: str) -> asyncio.subprocess.Process:
    # The password from the environment, as the examples ask (never on the command line).
    env = {**os.environ, "SIGNOFF_PASSWORD": PASSWORD}
    return await asyncio.create_subprocess_exec(
        sys.executable, f"examples/{name}", *args, cwd=PROJECT_ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


async def finished(process: asyncio.subprocess.Process, timeout: float = 60.0) -> str:
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        output, _ = await process.communicate()
        raise AssertionError(f"still running after {timeout}s:\n{output.decode()}") from None
    assert process.returncode == 0, output.decode()
    return output.decode()


async def test_the_example_app_waits_for_its_answer_while_the_example_bot_approves_only_what_its_rule_allows(
        gateway, sink):
    base = url(gateway)
    async with AsyncClient(base, "alice", PASSWORD) as alice:
        # Over the bot's limit: left for a person.
        large = await alice.start_session("Refund c-2", session_id=f"refund-large-{mint('ses')}")
        [large_card] = await eventually(lambda: alice.pending(session_id=large.session_id), 20)
        assert large_card.arguments == {"amount": 5000, "customer": "c-2"}
        bot = await run_example("approval_bot.py", "--url", base, "--name", BOT, "--tool", "refund",
                                "--max", "amount=100", "--count", "1")
        small_id = f"refund-small-{mint('ses')}"
        app = await run_example("start_and_wait.py", "--url", base, "--name", "alice", "--session-id", small_id,
                                "Refund c-1")
        try:
            app_output = await finished(app)
            bot_output = await finished(bot)
        finally:
            for process in (app, bot):
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        assert app_output.splitlines() == [f"started {small_id}", "Refunded."], app_output
        assert "approved refund {'amount': 20, 'customer': 'c-1'}" in bot_output, bot_output
        assert (await alice.request(large_card.id)).status == "pending"
        shown = await alice.session(small_id)
        assert shown.status == "idle" and shown.started_by == "alice" and shown.pending_requests == []
    [small] = await rows(gateway, ApprovalRequest, session_id=small_id)
    [decision] = await rows(gateway, Decision, request_id=small.id)
    assert (decision.responder, decision.channel, decision.decision) == (BOT, "gateway", "approve")
    audit = await rows(gateway, AuditEntry, session_id=small_id, kind="response.accepted")
    assert [a.actor for a in audit] == [BOT]
    assert await rows(gateway, Decision, request_id=large_card.id) == []
    await asyncio.sleep(0.5)
    assert sink.counts["/refunds"] == 1


async def test_the_sdk_raises_a_hidden_cards_not_found_and_a_retried_approval_with_its_key_decides_once(gateway, sink):
    base = url(gateway)
    async with AsyncClient(base, "sam", PASSWORD) as sam, AsyncClient(base, "mallory", PASSWORD) as mallory, \
            AsyncClient(base, "alice", PASSWORD) as alice:
        started = await sam.start_session("go", session_id=f"reviewed-{mint('ses')}")
        [card] = await eventually(lambda: sam.pending(session_id=started.session_id), 20)
        with pytest.raises(ProblemError) as refused:
            await mallory.approve(card)
        # A card mallory may not approve is one she may not see: answered as a missing one.
        assert refused.value.status == 404 and refused.value.kind == "not-found"
        first = await alice.approve(card, idempotency_key="sdk-once")
        again = await alice.approve(card, idempotency_key="sdk-once")
        assert first == again and first.decided and first.responder == "alice"
        ended = await sam.wait_for_turn(started.session_id, timeout=30)
        assert ended.type == "turn.completed"
    assert len(await rows(gateway, Decision, request_id=card.id)) == 1
    await asyncio.sleep(0.5)
    assert sink.counts["/reviewed"] == 1


class LosesFirstDecisionAnswer(httpx.AsyncHTTPTransport):
    """The real gateway gets every request; the client never hears the first decision's answer."""

    def __init__(self) -> None:
        super().__init__()
        self.decisions: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        answer = await super().handle_async_request(request)
        if request.url.path.endswith("/decision"):
            self.decisions.append(request.headers["idempotency-key"])
            if len(self.decisions) == 1:
                await answer.aread()
                await answer.aclose()
                raise httpx.ReadError("the connection dropped before the answer arrived")
        return answer


async def test_an_approval_whose_answer_was_lost_is_retried_with_its_key_and_decided_and_run_once(gateway, sink):
    base = url(gateway)
    lossy = LosesFirstDecisionAnswer()
    async with AsyncClient(base, "sam", PASSWORD) as sam, AsyncClient(base, "alice", PASSWORD, transport=lossy) as alice:
        started = await sam.start_session("go", session_id=f"reviewed-{mint('ses')}")
        [card] = await eventually(lambda: sam.pending(session_id=started.session_id), 20)
        verdict = await alice.approve(card)
        assert verdict.decided and verdict.responder == "alice"
        assert await sam.wait_for_turn(started.session_id, timeout=30)
    assert len(lossy.decisions) == 2 and len(set(lossy.decisions)) == 1
    [decision] = await rows(gateway, Decision, request_id=card.id)
    assert decision.response_id == verdict.response_id
    assert len(await rows(gateway, InboxRow, session_id=card.session_id, message_type="approval.respond")) == 1
    await asyncio.sleep(0.5)
    assert sink.counts["/reviewed"] == 1


async def test_the_sdk_event_stream_resumes_by_itself_across_a_gateway_sigkill_with_no_gap_and_no_repeat(
        gateway, sink):
    base = url(gateway)
    seen: list = []
    async with AsyncClient(base, "ann", PASSWORD) as ann, AsyncClient(base, "alice", PASSWORD) as alice:

        async def follow(until_completed: int) -> None:
            async for event in ann.events():  # an operator: every event
                seen.append(event)
                if sum(e.type == "turn.completed" for e in seen) == until_completed:
                    return

        reading = asyncio.create_task(follow(3))
        sessions = [(await alice.start_session("go", session_id=f"reviewed-{mint('ses')}")).session_id
                    for _ in range(3)]
        cards = [(await eventually(lambda s=s: alice.pending(session_id=s), 20))[0] for s in sessions]
        await alice.approve(cards[0])
        await eventually(lambda: _async(any(e.type == "approval.decided" for e in seen)), 20)
        # Mid-stream, the gateway dies and comes back at the same address; the client reconnects by itself.
        gateway.kill("gateway")
        before = len(seen)
        gateway.start("gateway")
        for card in cards[1:]:
            await alice.approve(card)
        await asyncio.wait_for(reading, 60)
    ids = [event.id for event in seen]
    assert len(ids) == len(set(ids)), "an event was repeated"
    assert before > 0 and len(ids) > before
    record = await committed_event_ids(gateway)
    assert ids == record[: len(ids)], "the stream skipped or reordered events the ledger committed"
    assert sink.counts["/reviewed"] == 3


async def _async(value):
    return value
