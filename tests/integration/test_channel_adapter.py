"""The README's channel adapter (deploy/channel_adapter.py), a few lines on the SDK's
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
    assert output.startswith("card: Post a message to the sink"), output
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
