"""The contract a channel adapter is written from, as an AsyncAPI document generated
from the code: every message, the exchange and queue it travels through, who may
send it, and how a response is signed. `docs/asyncapi.yaml` is this document,
committed; `tests/unit/test_contract.py` fails when the two disagree
(`python -m shared.contract > docs/asyncapi.yaml` writes it again).
"""

# No `from __future__ import annotations`: FastStream reads each handler's message
# type from its annotation, which must be a class, not a string.

import sys
from typing import Any

import yaml
from faststream.rabbit import ExchangeType, RabbitBroker, RabbitExchange, RabbitQueue
from faststream.specification import AsyncAPI

from shared.messages import EVENTS, LEDGER_INPUTS, SERVICE_COMMANDS, Envelope
from shared.topology import SENDERS, Exchange, Queue, Topology

SIGNING = """\
Every message is JSON with an envelope (`message_id`, `session_id`, `causation_id`,
`schema_version`, `occurred_at`, `type`) and carries the AMQP `user_id` of its
publisher, which RabbitMQ checks against the connection's user. Each sender has its
own broker user (`<namespace>.<service>`, `<namespace>.channel.<name>`), made by
`signoff setup`, and may write only its own exchange.

A channel adapter publishes `turn.start` and `approval.respond` to
`<namespace>.channels`, and reads events from `<namespace>.events` (topic, routing
key `<event type>.<session id>`).

An `approval.respond` counts only if signed with the channel's Ed25519 key (its
public half registered in the ledger's `channels.yaml`): `key_id` names the channel
and `signature` is the unpadded base64url Ed25519 signature over the RFC 8785
canonical JSON of `{response_id, session_id, request_id, decision, args_digest,
responder, reason, message, issued_at, key_id}`, plus `response_token` when one is
redeemed (`issued_at` in UTC as `YYYY-MM-DDTHH:MM:SS[.ffffff]+00:00`, as sent).
`args_digest` is the one on the card; `response_id` is fresh for each response;
`issued_at` must be within five minutes of the ledger's clock. Refusals arrive as
`message.rejected` events with a `reason_code`.
"""


def _describe(broker: RabbitBroker, topology: Topology) -> None:
    for model in (*LEDGER_INPUTS, *SERVICE_COMMANDS):
        kind = model.model_fields["type"].default
        sender = SENDERS[kind]
        who = "any registered channel adapter" if sender == "channel" else f"the {sender} only"
        _subscribe(broker, topology, kind, model, f"{model.__doc__ or kind}\n\nSent by {who}.")
    for event in EVENTS:
        kind = event.model_fields["type"].default
        broker.publisher(
            exchange=_exchange(topology.events),
            routing_key=f"{kind}.*",
            schema=event,
            title=kind,
            description=f"{event.__doc__ or kind}\n\nPublished by the publisher, from the ledger's outbox.",
        )


def _subscribe(broker: RabbitBroker, topology: Topology, kind: str, model: type[Envelope], description: str) -> None:
    async def handler(message: model) -> None:  # type: ignore[valid-type]
        """Declared for the document only: nothing consumes through it."""

    broker.subscriber(
        _queue(topology.inbound_queue(kind)),
        _exchange(topology.inbound_exchange(kind)),
        title=kind,
        description=description,
    )(handler)


# FastStream describes the topology here only: the running code declares, publishes and
# consumes with aio-pika (shared/bus.py, `shared.consuming.declare`), and FastStream's
# AsyncAPI generator is what writes this document from the message models.
def _exchange(exchange: Exchange) -> RabbitExchange:
    return RabbitExchange(exchange.name, type=ExchangeType(exchange.kind), durable=True, declare=False)


def _queue(queue: Queue) -> RabbitQueue:
    # The document names a queue and says it is durable; its arguments are not in it.
    arguments: Any = dict(queue.arguments)
    return RabbitQueue(queue.name, durable=True, routing_key=queue.routing_key, arguments=arguments)


def document(namespace: str = "signoff") -> str:
    broker = RabbitBroker()
    _describe(broker, Topology(namespace))
    spec = AsyncAPI(
        broker, title="Signoff", version="1", description=SIGNING, schema_version="2.6.0"
    ).to_specification()
    # Keys sorted: FastStream's order of channels varies from process to process.
    return yaml.safe_dump(yaml.safe_load(spec.to_yaml()), sort_keys=True, allow_unicode=True, width=100)


if __name__ == "__main__":
    sys.stdout.write(document())
