"""A channel adapter in twenty lines, written from docs/asyncapi.yaml alone: it shows
the first card, approves it as alice, signed with the channel's own key.
    python deploy/channel_adapter.py AMQP_URL NAMESPACE KEY_FILE CHANNEL"""
import asyncio, base64, json, secrets, sys  # noqa: E401
from datetime import UTC, datetime

import aio_pika, rfc8785  # noqa: E401
from cryptography.hazmat.primitives.serialization import load_pem_private_key


async def main(url: str, namespace: str, key_file: str, channel: str) -> None:
    key = load_pem_private_key(open(key_file, "rb").read(), None)
    async with await aio_pika.connect(url) as connection:
        amqp = await connection.channel()
        cards = await amqp.declare_queue(exclusive=True)
        await cards.bind(f"{namespace}.events", "approval.requested.*")
        event = json.loads((await anext(aiter(cards.iterator(no_ack=True)))).body)
        print(f"card: {event['card']['label']} {json.dumps(event['card']['arguments'])}")
        response = {"response_id": "rsp_" + secrets.token_hex(16), "session_id": event["session_id"],
                    "request_id": event["request_id"], "decision": "approve", "args_digest": event["args_digest"],
                    "responder": "alice", "reason": "", "message": "", "key_id": channel,
                    "issued_at": datetime.now(UTC).isoformat()}
        response["signature"] = base64.urlsafe_b64encode(key.sign(rfc8785.dumps(response))).rstrip(b"=").decode()
        body = json.dumps({"type": "approval.respond", "message_id": "msg_" + secrets.token_hex(16), **response})
        channels = await amqp.get_exchange(f"{namespace}.channels", ensure=False)
        await channels.publish(aio_pika.Message(body.encode(), user_id=connection.url.user), "approval.respond")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
