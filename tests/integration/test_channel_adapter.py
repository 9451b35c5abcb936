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
