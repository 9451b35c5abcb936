"""Exchanges, queues and routing: one place that names them all.

Every name starts with the namespace, so deployments and parallel tests share a
broker without seeing each other. Queues are durable quorum queues with an
explicit delivery limit (RabbitMQ 3.10 sets none) and a dead-letter exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

from faststream.rabbit import ExchangeType, QueueType, RabbitExchange, RabbitQueue

from shared.messages import Envelope

# Which ledger queue takes which inbound message type.
LEDGER_QUEUES = {
    "turn.start": "ledger.turns",
    "approval.respond": "ledger.responses",
    "step.completed": "ledger.steps",
    "tool.completed": "ledger.tools",
    "execution.refused": "ledger.refusals",
}
SERVICE_QUEUES = {
    "step.requested": "model-step.requests",
    "tool.execute": "tool-executor.requests",
}
COMMAND_TYPES = {**LEDGER_QUEUES, **SERVICE_QUEUES}


@dataclass(frozen=True)
class Topology:
    namespace: str
    delivery_limit: int = 20

    @property
    def commands(self) -> RabbitExchange:
        return RabbitExchange(f"{self.namespace}.commands", type=ExchangeType.DIRECT, durable=True)

    @property
    def events(self) -> RabbitExchange:
        """Channel adapters bind here by `<event type>.<session id>`, e.g. `approval.requested.*`."""
        return RabbitExchange(f"{self.namespace}.events", type=ExchangeType.TOPIC, durable=True)

    @property
    def dead(self) -> RabbitExchange:
        return RabbitExchange(f"{self.namespace}.dead", type=ExchangeType.FANOUT, durable=True)

    @property
    def dead_letter_queue(self) -> RabbitQueue:
        """No delivery limit: listing parked messages returns them unacked, and that
        must never count against them (`signoff dead-letters`)."""
        return RabbitQueue(
            f"{self.namespace}.dead-letters",
            queue_type=QueueType.QUORUM,
            durable=True,
        )

    def queue_name(self, short: str) -> str:
        return f"{self.namespace}.{short}"

    def queue(self, short: str, routing_key: str) -> RabbitQueue:
        return RabbitQueue(
            self.queue_name(short),
            queue_type=QueueType.QUORUM,
            durable=True,
            routing_key=routing_key,
            arguments={
                "x-delivery-limit": self.delivery_limit,
                "x-dead-letter-exchange": self.dead.name,
            },
        )

    def inbound_queue(self, message_type: str) -> RabbitQueue:
        return self.queue(COMMAND_TYPES[message_type], message_type)

    def route(self, message: Envelope) -> tuple[str, str]:
        """(exchange name, routing key) for a message."""
        kind = message.type
        if kind in COMMAND_TYPES:
            return self.commands.name, kind
        return self.events.name, f"{kind}.{message.session_id}"

    def all_queue_names(self) -> list[str]:
        return [self.queue_name(q) for q in COMMAND_TYPES.values()] + [self.dead_letter_queue.name]

    def all_exchange_names(self) -> list[str]:
        return [self.commands.name, self.events.name, self.dead.name]
