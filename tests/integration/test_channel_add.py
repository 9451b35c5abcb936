"""`signoff channel add`: a channel registered while the services run counts from the next
response on, no restart; before that, the adapter that waits for the verdict is told."""

import asyncio

import pytest

from services.operations import channels
from shared import keyring, provisioning
from shared.messages import StartTurn, mint
from shared.signatures import new_private_key, private_key_bytes
from signoff.channel import ChannelAdapter, Refused
from tests.harness import next_event


async def test_a_channel_added_while_the_ledger_runs_counts_at_once_and_before_that_its_adapter_is_refused(
    sqlite_deployment, sink
):
    deployment = sqlite_deployment
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    settings = deployment.settings
    keys = settings.keys_path
    # An adapter with its key and broker user, not yet in channels.yaml.
    key = new_private_key()
    keyring.replace_private(keys / "channels" / "pager.key", private_key_bytes(key))
    await provisioning.provision_broker(settings, [*sorted(keyring.channels(keys)), "pager"])
    url, _ = settings.amqp_login("channel.pager")
    session_id = mint("ses")
    async with ChannelAdapter(url, deployment.namespace, key, "pager") as adapter:
        cards = await adapter.cards()
        async with deployment.console() as console:
            events = await console.watch(session_id)
            await console.send(StartTurn(session_id=session_id, text="go"))
            card = await asyncio.wait_for(anext(cards), 30)
            with pytest.raises(Refused) as refused:
                await adapter.respond(card, "approve", "alice", verdict_within=20)
            assert refused.value.reason_code == "unknown_key"
            done = await asyncio.to_thread(channels.add, settings, "pager", ["alice"])
            assert any("registered channel pager" in line for line in done)
            # The ledger, never restarted, takes the channel's next response.
            await adapter.respond(card, "approve", "alice", verdict_within=20)
            decided = await next_event(events, "approval.decided", timeout=30)
            assert decided.responder == "alice"
            await next_event(events, "turn.completed", timeout=30)
    assert keyring.registered_principals(keys, "pager") == ["alice"]
    assert sink.counts["/sink"] == 1


def test_channel_add_refuses_a_pattern_the_built_in_channels_and_nobody(tmp_path):
    from shared.settings import Settings

    settings = Settings(data_dir=tmp_path, broker_identities=False)
    for name, principals in [("pager", ["*"]), ("gateway", ["alice"]), ("Bad Name", ["alice"]), ("pager", [])]:
        with pytest.raises(SystemExit):
            channels.add(settings, name, principals)
