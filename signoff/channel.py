"""What an AMQP channel adapter needs, in one object: a chat bot, a pager or a web page
that shows Signoff's cards and relays people's answers (docs/asyncapi.yaml).

    async with ChannelAdapter(amqp_url, namespace, key_file, "inbox") as adapter:
        async for card in await adapter.cards():
            show(card.card.label, card.card.arguments)
            await adapter.respond(card, "approve", responder="alice")

A channel is registered in `channels.yaml` (its public key and the principals it may
assert) and has a broker user of its own, `<ns>.channel.<name>`. The adapter

- receives cards from `<ns>.events` through a private queue of its own (the one
  exchange a channel may read), parsed and validated as the contract's messages;
- answers with a `RespondToApproval` that has fresh ids (a response id is used once),
  the card's digest (the ledger refuses an approval of other arguments), and an
  Ed25519 signature over its signed part with the channel's own key (RFC 8785 JSON);
- or redeems the card's one-time response token (`respond_with_token`: a link or button
  clicked by someone the channel did not authenticate; recorded as `token:<channel>`);
- publishes it to `<ns>.channels` with the AMQP `user_id` of its connection, which
  RabbitMQ checks: the ledger knows which channel sent it and whether that channel
  may assert the responder.

It uses the contract's models (shared/messages.py) and signing (shared/signatures.py),
both installed with this package; it imports no service.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import aio_pika
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError
from yarl import URL

from shared.messages import EVENT, ApprovalEscalated, ApprovalRequested, Envelope, RespondToApproval, encode
from shared.signatures import load_private_key, sign

# Who a token response is recorded as: the channel that received the click, never a person
# (services/approval_ledger/domain.py `token_responder`; the contract, not an import of a service).
TOKEN_RESPONDER_PREFIX = "token:"
# A card a person may answer: a new request, or one announced again to its escalation group.
CardEvent = ApprovalRequested | ApprovalEscalated


class ChannelAdapter:
    """A registered channel's connection to Signoff. `key` is the channel's private key
    (a PEM file's path, its bytes, or the key); `channel` its name in `channels.yaml`.
    The broker user in `amqp_url` must be the channel's own (`<ns>.channel.<name>`)."""

    def __init__(
        self, amqp_url: str, namespace: str, key: str | Path | bytes | Ed25519PrivateKey, channel: str
    ) -> None:
        self.amqp_url = amqp_url
        self.namespace = namespace
        self.channel = channel
        self.key = key if isinstance(key, Ed25519PrivateKey) else load_private_key(_pem(key))
        self._user = ""
        self._connection: aio_pika.abc.AbstractRobustConnection | None = None
        self._amqp: aio_pika.abc.AbstractChannel | None = None

    async def __aenter__(self) -> ChannelAdapter:
        await self.connect()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        # Publisher confirms: `publish` returns once RabbitMQ holds the response.
        self._connection = await aio_pika.connect_robust(self.amqp_url)
        self._user = URL(self.amqp_url).user or ""
        self._amqp = await self._connection.channel(publisher_confirms=True)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
        self._connection = self._amqp = None

    @property
    def user_id(self) -> str:
        """The broker user this adapter publishes as (RabbitMQ refuses any other `user_id`)."""
        self._open()
        return self._user

    def _open(self) -> tuple[aio_pika.abc.AbstractRobustConnection, aio_pika.abc.AbstractChannel]:
        if self._connection is None or self._amqp is None:
            raise RuntimeError("the channel adapter is not connected (use `async with` or `await connect()`)")
        return self._connection, self._amqp

    # --- receiving ---

    async def events(self, *bindings: str) -> AsyncIterator[Envelope]:
        """The events whose routing keys match `bindings` (`<event type>.<session id>`,
        e.g. `approval.requested.*`; all when none), parsed. The private queue is bound
        when this returns: events sent from then on are all seen, none before.

            async for event in await adapter.events("turn.completed.*"): ..."""
        _, amqp = self._open()
        queue = await amqp.declare_queue(exclusive=True, auto_delete=True)
        exchange = f"{self.namespace}.events"
        for binding in bindings or ("#",):
            await queue.bind(exchange, binding)
        return _parsed(queue)

    async def cards(self, *, escalations: bool = True) -> AsyncIterator[CardEvent]:
        """Every card announced from now on: new requests, and (`escalations`) requests
        announced again to their escalation group. `async for card in await adapter.cards()`."""
        bindings = ["approval.requested.*"] + (["approval.escalated.*"] if escalations else [])
        return _cards(await self.events(*bindings))

    # --- answering ---

    def response(
        self,
        card: CardEvent,
        decision: Literal["approve", "deny"],
        responder: str,
        *,
        reason: str = "",
        message: str = "",
    ) -> RespondToApproval:
        """A signed response to `card` as `responder` (a person this channel authenticated
        and may assert): fresh message and response ids, the card's digest, now."""
        unsigned = RespondToApproval(
            session_id=card.session_id,
            request_id=card.request_id,
            decision=decision,
            args_digest=card.args_digest,
            responder=responder,
            reason=reason,
            message=message,
            key_id=self.channel,
        )
        return unsigned.model_copy(update={"signature": sign(self.key, unsigned.signed_part())})

    def token_response(
        self,
        card: CardEvent,
        decision: Literal["approve", "deny"],
        *,
        reason: str = "",
        message: str = "",
    ) -> RespondToApproval:
        """A signed response that redeems the card's one-time `response_token` (a link or
        button clicked in this channel, by someone it did not authenticate): it names no
        person, so the responder is `token:<channel>` (the ledger accepts no other), it
        counts for that request only and once, and it cannot approve a tool that needs
        known people (`anonymous_approval`). Only a new request's card carries a token."""
        token = getattr(card, "response_token", None)
        if not token:
            raise ValueError(f"the card of {card.request_id} carries no response token (only approval.requested does)")
        unsigned = RespondToApproval(
            session_id=card.session_id,
            request_id=card.request_id,
            decision=decision,
            args_digest=card.args_digest,
            responder=TOKEN_RESPONDER_PREFIX + self.channel,
            reason=reason,
            message=message,
            key_id=self.channel,
            response_token=token,
        )
        return unsigned.model_copy(update={"signature": sign(self.key, unsigned.signed_part())})

    async def publish(self, message: Envelope) -> None:
        """Publish a message to the channels' exchange, persistently, as this adapter's
        broker user, and wait for RabbitMQ's confirm."""
        _, amqp = self._open()
        exchange = await amqp.get_exchange(f"{self.namespace}.channels", ensure=False)
        await exchange.publish(
            aio_pika.Message(
                encode(message),
                content_type="application/json",
                message_id=message.message_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                user_id=self._user,
            ),
            routing_key=message.type,
        )

    async def respond(
        self,
        card: CardEvent,
        decision: Literal["approve", "deny"],
        responder: str,
        *,
        reason: str = "",
        message: str = "",
    ) -> RespondToApproval:
        """Sign and publish a response; answers what was sent (its `response_id` names it
        in the ledger's `approval.decided` or `message.rejected`)."""
        response = self.response(card, decision, responder, reason=reason, message=message)
        await self.publish(response)
        return response

    async def respond_with_token(
        self,
        card: CardEvent,
        decision: Literal["approve", "deny"],
        *,
        reason: str = "",
        message: str = "",
    ) -> RespondToApproval:
        """Sign and publish a response that redeems the card's one-time token (`token_response`)."""
        response = self.token_response(card, decision, reason=reason, message=message)
        await self.publish(response)
        return response


async def _parsed(queue: aio_pika.abc.AbstractQueue) -> AsyncIterator[Envelope]:
    async with queue.iterator(no_ack=True) as messages:
        async for message in messages:
            try:
                yield EVENT.validate_json(message.body)
            except ValidationError:
                continue  # not an event of this contract's version: nothing to show


async def _cards(events: AsyncIterator[Envelope]) -> AsyncIterator[CardEvent]:
    async for event in events:
        if isinstance(event, CardEvent):
            yield event


def _pem(key: str | Path | bytes) -> bytes:
    if isinstance(key, bytes):
        return key
    return Path(key).read_bytes()


def describe(card: CardEvent) -> str:
    """One line for a person: the card's label and its (redacted) arguments."""
    return f"{card.card.label} {json.dumps(card.card.arguments)}"
