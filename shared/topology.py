"""Exchanges, queues, routing and who may use them: one place that names them all.

Every name starts with the namespace, so deployments and parallel tests share a
broker without seeing each other. The inbound queues are durable quorum queues
with an explicit delivery limit (RabbitMQ 3.10 sets none) and a dead-letter
exchange; or, by the setting `queue_type`, durable classic queues (version 2),
which cost the broker less per message but keep one copy and count no
deliveries (docs/benchmarks.md, "Queue types").

Each sender has an exchange of its own, and only its broker identity may write
it (docs/design.md, "Trust boundaries"): channel adapters publish turns and
responses to `<ns>.channels`, the model-step its reports to
`<ns>.model-step.reports`, the executor its reports to
`<ns>.tool-executor.reports`, and the publisher, relaying the ledger's outbox,
commands to `<ns>.commands` and events to `<ns>.events`. So the model-step, or a
tool running inside the executor, cannot even put an approval on the bus.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.messages import Envelope

# Which ledger queue takes which inbound message type.
LEDGER_QUEUES = {
    "turn.start": "ledger.turns",
    "turn.cancel": "ledger.cancels",
    "approval.respond": "ledger.responses",
    "grant.revoke": "ledger.grants",
    "step.completed": "ledger.steps",
    "tool.completed": "ledger.tools",
    "execution.refused": "ledger.refusals",
    # The intake: calls filed by programs, their claims and their results (runs: caller).
    "call.file": "ledger.calls",
    "call.claim": "ledger.call-claims",
    "call.report": "ledger.call-results",
}
SERVICE_QUEUES = {
    "step.requested": "model-step.requests",
    "tool.execute": "tool-executor.requests",
}
COMMAND_TYPES = {**LEDGER_QUEUES, **SERVICE_QUEUES}
# Who sends each command: a service's broker identity, or "channel" for any channel adapter.
SENDERS = {
    "turn.start": "channel",
    "turn.cancel": "channel",
    "approval.respond": "channel",
    "grant.revoke": "channel",
    "step.completed": "model-step",
    "tool.completed": "tool-executor",
    "execution.refused": "tool-executor",
    "call.file": "channel",
    "call.claim": "channel",
    "call.report": "channel",
    "step.requested": "publisher",
    "tool.execute": "publisher",
}
# The exchange each sender publishes its commands to (short names).
SENDER_EXCHANGES = {
    "channel": "channels",
    "model-step": "model-step.reports",
    "tool-executor": "tool-executor.reports",
    "publisher": "commands",
}
SERVICES = ("approval-ledger", "publisher", "model-step", "tool-executor")
# The operator's own broker identity (`signoff dead-letters`): it reads the dead letters, nothing else.
OPERATOR = "console"


@dataclass(frozen=True)
class Permissions:
    """RabbitMQ's three regular expressions over resource names (vhost-wide)."""

    configure: str
    write: str
    read: str


@dataclass(frozen=True)
class Exchange:
    """An exchange as `signoff setup` declares it (durable); the services only name it."""

    name: str
    kind: Literal["direct", "topic", "fanout"] = "direct"


@dataclass(frozen=True)
class Queue:
    """A queue as `signoff setup` declares it: durable, with these arguments, bound to its
    exchange by `routing_key` (the dead-letter queues: by none, their exchange is a fanout).
    Plain data: what declares it is aio-pika (`shared.consuming.declare`), and only the
    AsyncAPI document (shared/contract.py) turns it into FastStream's description."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict, hash=False)
    routing_key: str = ""


@dataclass(frozen=True)
class Topology:
    namespace: str
    delivery_limit: int = 20
    # "quorum" (replicated, deliveries counted: the default) or "classic" (version 2).
    queue_type: str = "quorum"

    def _name(self, short: str) -> str:
        return f"{self.namespace}.{short}"

    def exchange(self, short: str, kind: Literal["direct", "topic", "fanout"] = "direct") -> Exchange:
        # Not declared by the services (they may not): `signoff setup` declares the topology.
        return Exchange(self._name(short), kind)

    @property
    def commands(self) -> Exchange:
        return self.exchange("commands")

    @property
    def events(self) -> Exchange:
        """Channel adapters bind here by `<event type>.<session id>`, e.g. `approval.requested.*`."""
        return self.exchange("events", "topic")

    @property
    def dead(self) -> Exchange:
        return self.exchange("dead", "fanout")

    @property
    def dead_letter_queue(self) -> Queue:
        """No delivery limit: listing parked messages returns them unacked, and that
        must never count against them (`signoff dead-letters`)."""
        return Queue(self._name("dead-letters"), {"x-queue-type": "quorum"})

    @property
    def parked_queue(self) -> Queue:
        """A copy of every parked message, for the ledger: one that a session was
        waiting on fails its turn with the reason, so no session is stuck. No
        dead-letter exchange of its own (that would loop); a copy it cannot handle
        is dropped after the delivery limit, the original stays parked."""
        return Queue(self._name("ledger.parked"), {"x-queue-type": "quorum", "x-delivery-limit": self.delivery_limit})

    def queue_name(self, short: str) -> str:
        return self._name(short)

    def queue(self, short: str, routing_key: str) -> Queue:
        if self.queue_type == "classic":
            # No delivery limit on a classic queue: Inbound counts failed deliveries itself.
            arguments: dict[str, Any] = {"x-queue-type": "classic", "x-queue-version": 2}
        else:
            arguments = {"x-queue-type": "quorum", "x-delivery-limit": self.delivery_limit}
        arguments["x-dead-letter-exchange"] = self.dead.name
        return Queue(self.queue_name(short), arguments, routing_key)

    def inbound_queue(self, message_type: str) -> Queue:
        return self.queue(COMMAND_TYPES[message_type], message_type)

    def inbound_exchange(self, message_type: str) -> Exchange:
        """The exchange a command arrives through: its sender's own."""
        return self.exchange(SENDER_EXCHANGES[SENDERS[message_type]])

    def route(self, message: Envelope) -> tuple[str, str]:
        """(exchange name, routing key) for a message."""
        kind = message.type
        if kind in COMMAND_TYPES:
            return self.inbound_exchange(kind).name, kind
        return self.events.name, f"{kind}.{message.session_id}"

    def all_queue_names(self) -> list[str]:
        return [self.queue_name(q) for q in COMMAND_TYPES.values()] + [
            self.dead_letter_queue.name,
            self.parked_queue.name,
        ]

    def all_exchange_names(self) -> list[str]:
        return [self._name(short) for short in (*SENDER_EXCHANGES.values(), "events", "dead")]

    # --- identities --------------------------------------------------------------

    def identity(self, name: str) -> str:
        """The broker user of a service (`approval-ledger`, …) or of a channel (`channel.<name>`)."""
        return self._name(name)

    def sender_kind(self, user_id: str | None) -> str | None:
        """Which sender a broker user is, as `SENDERS` names them; None for any other."""
        prefix = self.namespace + "."
        if not user_id or not user_id.startswith(prefix):
            return None
        name = user_id[len(prefix) :]
        if name.startswith("channel."):
            return "channel"
        return name if name in SERVICES else None

    def channel_of(self, user_id: str | None) -> str | None:
        """The channel a broker user `<ns>.channel.<name>` is (its name in `keys/channels.yaml`); None for any other."""
        prefix = self._name("channel.")
        if not user_id or not user_id.startswith(prefix) or len(user_id) == len(prefix):
            return None
        return user_id[len(prefix) :]

    def may_send(self, message_type: str, user_id: str | None) -> bool:
        return self.sender_kind(user_id) == SENDERS.get(message_type)

    def consumer(self, message_type: str) -> str | None:
        """The service that consumes the queue of a command type (None: not a command)."""
        queue = COMMAND_TYPES.get(message_type)
        if queue is None:
            return None
        return "approval-ledger" if queue.startswith("ledger.") else queue.split(".")[0]

    def permissions(self, name: str) -> Permissions:
        """Least privilege: each identity may use exactly its own queues and exchanges.
        A service reads (consumes) only its own queues and writes only its own exchange
        and, to park bad input, the dead-letter exchange. It reads no exchange and
        configures nothing: `signoff setup` declares and binds every queue, and binding
        needs read on the exchange (queue.bind: write on the queue, read on the
        exchange), which would let it bind a queue of its own to `<ns>.commands` and
        receive every `tool.execute`. A channel may make private server-named queues
        and bind them only to `<ns>.events` (the one exchange it reads); the operator's
        console reads only the dead letters."""
        ns = re.escape(self.namespace)

        def any_of(*names: str) -> str:
            return "^(" + "|".join(names) + ")$" if names else "^$"

        dead = rf"{ns}\.dead"
        if name == "publisher":
            return Permissions(any_of(), any_of(rf"{ns}\.commands", rf"{ns}\.events"), any_of())
        if name == OPERATOR:
            return Permissions(any_of(), any_of(), any_of(rf"{ns}\.dead-letters"))
        if name.startswith("channel."):
            # Exclusive queues of its own, named by the server (`amq.gen-…`) or by
            # aio-pika (`amq_…`), bound to the events it watches.
            private = r"amq(\.gen-|_).+"
            return Permissions(any_of(private), any_of(rf"{ns}\.channels", private), any_of(rf"{ns}\.events", private))
        queues = {
            "approval-ledger": rf"{ns}\.ledger\..+",  # its inbound queues and the parked copies
            "model-step": rf"{ns}\.model-step\.requests",
            "tool-executor": rf"{ns}\.tool-executor\.requests",
        }[name]
        writes = [dead] + ([rf"{ns}\.{re.escape(SENDER_EXCHANGES[name])}"] if name in SENDER_EXCHANGES else [])
        return Permissions(any_of(), any_of(*writes), any_of(queues))
