"""The channel adapter of docs/gateway.md (deploy/channel_adapter.py), a few lines on the SDK's
`signoff.ChannelAdapter`, approves a card as its own broker user and channel key."""

import asyncio
import subprocess
import sys

from shared import keyring
from shared.messages import StartTurn, mint
from shared.settings import PROJECT_ROOT
from tests.harness import next_event


async def test_the_example_channel_adapter_approves_a_card_and_the_call_runs_once(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    keys = deployment.data_dir / "keys"
    keyring.create(keys, {"inbox": ["alice"]})
    deployment.start()
    url, _ = deployment.settings.amqp_login("channel.inbox")
    adapter = subprocess.Popen(
        [sys.executable, "deploy/channel_adapter.py", url, deployment.namespace, str(keys / "channels" / "inbox.key"),
         "inbox"], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Its queue is bound before the card is shown.
        assert await asyncio.to_thread(adapter.stdout.readline) == "listening\n"
        session_id = mint("ses")
        async with deployment.console() as console:
            events = await console.watch(session_id)
            await console.send(StartTurn(session_id=session_id, text="go"))
            decided = await next_event(events, "approval.decided", timeout=30)
            assert decided.responder == "alice"
            await next_event(events, "turn.completed", timeout=30)
        output, _ = await asyncio.to_thread(adapter.communicate, timeout=30)
    finally:
        adapter.kill()
    assert adapter.returncode == 0, output
    assert output.startswith("card: Approval needed: Post a message to the sink (post_to_sink"), output
    assert sink.counts["/sink"] == 1


async def test_the_sdk_channel_adapter_redeems_a_cards_response_token_once_as_its_channel(deployment, sink):
    """A click on a link in the channel (nobody authenticated): the adapter answers with the
    card's one-time token, recorded as `token:inbox`; the same token again is refused."""
    from signoff.channel import ChannelAdapter
    from shared.ledger.tables import Decision
    from tests.harness import rows

    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    keys = deployment.data_dir / "keys"
    keyring.create(keys, {"inbox": ["alice"]})
    deployment.start()
    url, _ = deployment.settings.amqp_login("channel.inbox")
    session_id = mint("ses")
    async with ChannelAdapter(url, deployment.namespace, keys / "channels" / "inbox.key", "inbox") as adapter:
        cards = await adapter.cards()
        rejections = await adapter.events("message.rejected.*")
        async with deployment.console() as console:
            events = await console.watch(session_id)
            await console.send(StartTurn(session_id=session_id, text="go"))
            card = await asyncio.wait_for(anext(cards), 30)
            assert card.response_token
            sent = await adapter.respond_with_token(card, "approve")
            assert (sent.responder, sent.response_token) == ("token:inbox", card.response_token)
            decided = await next_event(events, "approval.decided", timeout=30)
            assert (decided.responder, decided.request_id) == ("token:inbox", card.request_id)
            await next_event(events, "turn.completed", timeout=30)
            again = await adapter.respond_with_token(card, "approve")
            rejected = await asyncio.wait_for(anext(rejections), 30)
            assert (rejected.reason_code, rejected.rejected_message_id) == ("token_used", again.message_id), rejected
    [decision] = await rows(deployment, Decision, request_id=card.request_id)
    assert (decision.responder, decision.channel, decision.response_id) == ("token:inbox", "inbox", sent.response_id)
    assert sink.counts["/sink"] == 1


async def test_the_channel_adapter_catches_up_the_cards_pending_before_it_started_and_answers_an_http_card(
        deployment, sink):
    """Cards that arrived while the adapter was down come first (the gateway's pending list,
    HTTP cards), then live ones, each once; it answers an HTTP card as it answers an event,
    and its text keeps a multi-line argument's lines, each under its field."""
    import httpx

    from shared.ledger.tables import Decision
    from signoff import AsyncClient
    from signoff.channel import ChannelAdapter, describe
    from signoff.models import Card
    from tests.gateway_client import PASSWORD
    from tests.harness import eventually, rows
    from tests.integration.test_gateway import add_people, url
    from tests.integration.test_intake import ORIGIN, intake_tools, token

    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.tools_file = intake_tools(deployment)
    keys = deployment.data_dir / "keys"
    keyring.create(keys, {"inbox": ["alice"]})
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    async with httpx.AsyncClient(base_url=url(deployment), headers={
            "Authorization": f"Bearer {token(deployment)}"}) as bot:
        filed = await bot.post("/v1/calls", json={"tool": "post_to_sink", "origin": ORIGIN, "call_id": "before",
                                                  "arguments": {"message": "line one\nline two"}})
        assert filed.status_code == 201, filed.text
    amqp, _ = deployment.settings.amqp_login("channel.inbox")
    async with AsyncClient(url(deployment), "alice", PASSWORD) as gateway, \
            ChannelAdapter(amqp, deployment.namespace, keys / "channels" / "inbox.key", "inbox") as adapter:
        cards = await adapter.cards(backlog=await gateway.pending())
        first = await asyncio.wait_for(anext(cards), 30)
        assert isinstance(first, Card) and first.id == filed.json()["request_id"]
        text = describe(first)
        # The card's own lines (shared.on_screen.card_rows), as the console and an email show them.
        assert '  "message": "line one\\nline two"' in text.splitlines(), text
        assert "filed by:  bot:agent for http:agent" in text.splitlines(), text
        await adapter.respond(first, "approve", responder="alice")
    [decision] = await eventually(lambda: rows(deployment, Decision, request_id=first.id))
    assert (decision.responder, decision.channel) == ("alice", "inbox")
