"""What an operator is told about a parked (dead-lettered) message.

A message reaches the dead-letter queue by one of two paths, and both must
name a reason (invariant 9):

- a consumer parked it (bad input, a handler's rejection, or its last delivery
  failed): the `x-signoff-*` headers carry the reason, the detail (the last
  error, for a message that failed on every delivery), the consumer and when;
- RabbitMQ parked it (its delivery limit was reached while no consumer could
  say why, e.g. each delivery killed its consumer): the broker's own `x-death`
  header carries the reason, the queue and the time.

Either path can be imitated: the model-step and the executor may write the
dead-letter exchange (to park bad input), with any headers. So a parked message
is believed only as far as its AMQP `user_id` proves it (RabbitMQ checks that
property against the publishing connection's user, and keeps it when it
dead-letters a message itself): `proven_sender`.

Pure: headers and body in, a description out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.topology import Topology

from shared.on_screen import FIELD_CHARS, TEXT_CHARS, visible

REASON_HEADER = "x-signoff-reason"
DETAIL_HEADER = "x-signoff-detail"
CONSUMER_HEADER = "x-signoff-consumer"
PARKED_AT_HEADER = "x-signoff-parked-at"
# The broker user that sent the message the consumer parked (its AMQP `user_id`):
# the parked copy's own `user_id` is the consumer's.
SENDER_HEADER = "x-signoff-sender"
# What an operator is told of a parked message whose parking nothing proves.
UNPROVEN = "unproven_parking"
# The reason a consumer gives a message whose every delivery failed, the same
# word RabbitMQ uses when it parks one itself.
DELIVERY_LIMIT = "delivery_limit"


@dataclass(frozen=True)
class ParkedMessage:
    message_id: str
    message_type: str
    session_id: str
    reason: str
    detail: str
    consumer: str
    parked_at: str
    # The parked message's own fields, as far as its body is a JSON object (else empty).
    envelope: dict[str, Any] = field(default_factory=dict, compare=False)
    # The parked copy's AMQP `user_id`: who published it to the dead letters (a
    # consumer parking it), or, when RabbitMQ parked it, who sent the original.
    parked_by: str = ""
    # What the `x-signoff-*` headers claim: that a consumer (this one) parked it, and
    # the original sender it recorded.
    consumer_parked: bool = False
    claimed_consumer: str = ""
    recorded_sender: str = ""
    # The queue RabbitMQ says it parked the message from (its `x-death`), if it did.
    death_queue: str = ""

    def line(self, redact: Callable[[str], str] = str) -> str:
        """Two lines for `signoff dead-letters`. Every field is whatever the parking
        message's sender wrote (headers and body alike): each is redacted, then shown
        by `visible`, so an escape in one cannot hide an entry or fake another line."""

        def shown(text: str, limit: int = FIELD_CHARS) -> str:
            return visible(redact(text), limit)

        return (
            f"{shown(self.parked_at)}  {shown(self.message_id)}  type={shown(self.message_type)} "
            f"session={shown(self.session_id)}  consumer={shown(self.consumer)}\n"
            f"    {shown(self.reason)}: {shown(self.detail, TEXT_CHARS)}"
        )


def describe(
    message_id: str | None, body: bytes, headers: dict[str, Any] | None, parked_by: str | None = None
) -> ParkedMessage:
    headers = headers or {}
    envelope = _envelope(body)
    death = _first_death(headers)
    reason = _text(headers.get(REASON_HEADER)) or _text(death.get("reason")) or "unknown"
    detail = _text(headers.get(DETAIL_HEADER))
    consumer = _text(headers.get(CONSUMER_HEADER))
    if not detail and death:
        detail = (
            f"parked by RabbitMQ from {_text(death.get('queue'))} after {death.get('count', 1)} time(s); "
            "no consumer recorded an error (each delivery may have stopped its consumer)"
        )
    parked_at = _text(headers.get(PARKED_AT_HEADER)) or _when(death.get("time"))
    return ParkedMessage(
        message_id=message_id or _text(envelope.get("message_id")) or "?",
        message_type=_text(envelope.get("type")) or "?",
        session_id=_text(envelope.get("session_id")) or "?",
        reason=reason,
        detail=detail or "(none)",
        consumer=consumer or (f"queue {_text(death.get('queue'))}" if death else "?"),
        parked_at=parked_at or "?",
        envelope=envelope,
        parked_by=parked_by or "",
        consumer_parked=REASON_HEADER in headers or CONSUMER_HEADER in headers,
        claimed_consumer=consumer,
        recorded_sender=_text(headers.get(SENDER_HEADER)),
        death_queue=_text(death.get("queue")),
    )


def proven_sender(parked: ParkedMessage, topology: Topology) -> str | None:
    """The broker user that sent the parked message, if its parking is proven; else None.

    - A consumer parked it: the copy's `user_id` is the broker identity of the service
      that consumes the queue of the message's type, its consumer header names that
      service, and the sender it recorded may send that type.
    - RabbitMQ parked it (no consumer header; `x-death` names the queue of the
      message's type): the `user_id` RabbitMQ kept is the original sender's, and it
      may send that type.

    Anything else on the dead path was published there by someone who is neither;
    nothing acts on it, and it is replayed as nobody."""
    kind = parked.message_type
    consumer = topology.consumer(kind)
    if consumer is None:
        return None
    if parked.consumer_parked:
        proven = (
            parked.claimed_consumer == consumer
            and parked.parked_by == topology.identity(consumer)
            and topology.may_send(kind, parked.recorded_sender)
        )
        return parked.recorded_sender if proven else None
    if parked.death_queue == topology.inbound_queue(kind).name and topology.may_send(kind, parked.parked_by):
        return parked.parked_by
    return None


def _envelope(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        # A body nested past what the json module takes was rightly parked as invalid.
        return {}
    return value if isinstance(value, dict) else {}


def _first_death(headers: dict[str, Any]) -> dict[str, Any]:
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        return deaths[0]
    return {}


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return str(value)
    return value


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if isinstance(value, datetime) else _text(value)
