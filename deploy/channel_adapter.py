"""A channel adapter on the SDK (signoff.ChannelAdapter): it shows the first card and
approves it as alice, signed with the channel's own key, sent as its own broker user.
    python deploy/channel_adapter.py AMQP_URL NAMESPACE KEY_FILE CHANNEL"""

import asyncio
import sys

from signoff.channel import ChannelAdapter, describe


async def main(url: str, namespace: str, key_file: str, channel: str) -> None:
    async with ChannelAdapter(url, namespace, key_file, channel) as adapter:
        cards = await adapter.cards()
        print("listening", flush=True)
        async for card in cards:
            print(f"card: {describe(card)}", flush=True)
            await adapter.respond(card, "approve", responder="alice")
            return


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
