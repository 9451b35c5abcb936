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
  may assert the responder;
- with `verdict_within`, waits for the ledger's answer to it and raises `Refused` when
  the ledger refused it (a channel not registered, a person it may not assert, a
  non-approver): a chat bot can tell the person at once, not only the bus.

It uses the contract's models (shared/messages.py), the one builder and signer of a
response (shared/responses.py), the services' own AMQP connection and publish
(shared/bus.py, `shared.consuming.send`) and the one drawing of a card
(`shared.on_screen.card_rows`), all installed with this package; it imports no service.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from pathlib import Path
from typing import Any, Literal, TypedDict, Unpack

import aio_pika
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError
from yarl import URL

from shared import consuming
from shared.amqp_hosts import split_hosts
from shared.bus import Bus
from shared.messages import (
    EVENT,
    ApprovalCounted,
    ApprovalDecided,
    ApprovalEscalated,
    ApprovalRequested,
    Envelope,
    MessageRejected,
    RespondToApproval,
)
from shared.on_screen import card_face, card_headline, card_rows
from shared.responses import ResponseSigner
from shared.signatures import load_private_key
from shared.topology import Topology

from .models import Card

# Who a token response is recorded as: the channel that received the click, never a person
# (services/approval_ledger/domain.py `token_responder`; the contract, not an import of a service).
TOKEN_RESPONDER_PREFIX = "token:"
# A card a person may answer: a new request, or one announced again to its escalation group.
CardEvent = ApprovalRequested | ApprovalEscalated
# Or a card as the gateway's HTTP API shows it (`signoff.Client.pending()`): the backlog.
AnyCard = CardEvent | Card
Decision = Literal["approve", "deny"]


class Said(TypedDict, total=False):
    """What an answer says beyond the decision: why (`reason`, shown to whoever reads the
    decision) and a `message` to the model."""

    reason: str
    message: str


class Answer(Said, total=False):
    """A person's answer: what they said, and a `response_id` derived from their click
    (None or absent: a fresh one)."""

    response_id: str | None


class Refused(Exception):
    """The ledger refused a response (its `message.rejected`): `reason_code` for a program,
    `reason_text` for the person who answered."""

    def __init__(self, rejection: MessageRejected) -> None:
        super().__init__(f"{rejection.reason_code}: {rejection.reason_text}")
        self.reason_code = rejection.reason_code
        self.reason_text = rejection.reason_text


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
        self.signer = ResponseSigner(channel, self.key)
        self.topology = Topology(namespace)
        self._user = ""
        self._bus: Bus | None = None
        self._amqp: aio_pika.abc.AbstractChannel | None = None

    async def __aenter__(self) -> ChannelAdapter:
        await self.connect()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        # The services' own connection (every node of a cluster): `publish` goes through
        # its confirming channel, the event queues through a channel of the adapter's.
        bus = Bus(self.amqp_url, prefetch=1)
        await bus.connect()
        self._bus = bus
        self._user = URL(split_hosts(self.amqp_url)[0]).user or ""
        self._amqp = await bus.connection.channel()

    async def close(self) -> None:
        if self._bus is not None:
            await self._bus.stop()
        self._bus = self._amqp = None

    @property
    def user_id(self) -> str:
        """The broker user this adapter publishes as (RabbitMQ refuses any other `user_id`)."""
        self._open()
        return self._user

    def _open(self) -> tuple[Bus, aio_pika.abc.AbstractChannel]:
        if self._bus is None or self._amqp is None:
            raise RuntimeError("the channel adapter is not connected (use `async with` or `await connect()`)")
        return self._bus, self._amqp

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

    async def cards(
        self, *, escalations: bool = True, backlog: Iterable[Card] | AsyncIterable[Card] | None = None
    ) -> AsyncIterator[AnyCard]:
        """Every card announced from now on: new requests, and (`escalations`) requests
        announced again to their escalation group. `async for card in await adapter.cards()`.

        `backlog`: the cards already pending when the adapter starts (those announced while
        it was down), e.g. `signoff.Client(...).pending()` from the gateway: the queue is
        bound first, then these come, then the live ones, each request once (an escalation
        of one seen is still shown: it names new approvers)."""
        bindings = ["approval.requested.*"] + (["approval.escalated.*"] if escalations else [])
        live = _cards(await self.events(*bindings))
        return live if backlog is None else _caught_up(backlog, live)

    # --- answering ---

    def response(
        self, card: AnyCard, decision: Decision, responder: str, **answer: Unpack[Answer]
    ) -> RespondToApproval:
        """A signed response to `card` as `responder` (a person this channel authenticated
        and may assert): fresh message and response ids, the card's digest, now.
        `answer`: the person's `reason` and `message`, and a `response_id` derived from
        their click, so that the same click delivered twice is the ledger's replay,
        counted once."""
        response_id = answer.get("response_id")
        more = {"response_id": response_id} if response_id else {}
        return self._answer(card, decision, responder, answer.get("reason", ""), answer.get("message", ""), **more)

    def token_response(self, card: CardEvent, decision: Decision, **said: Unpack[Said]) -> RespondToApproval:
        """A signed response that redeems the card's one-time `response_token` (a link or
        button clicked in this channel, by someone it did not authenticate): it names no
        person, so the responder is `token:<channel>` (the ledger accepts no other), it
        counts for that request only and once, and it cannot approve a tool that needs
        known people (`anonymous_approval`). Only a new request's card carries a token."""
        token = getattr(card, "response_token", None)
        if not token:
            raise ValueError(f"the card of {card.request_id} carries no response token (only approval.requested does)")
        responder = TOKEN_RESPONDER_PREFIX + self.channel
        reason, message = said.get("reason", ""), said.get("message", "")
        return self._answer(card, decision, responder, reason, message, response_token=token)

    def _answer(
        self, card: AnyCard, decision: Decision, responder: str, reason: str, message: str, **more: Any
    ) -> RespondToApproval:
        return self.signer.respond(
            session_id=card.session_id,
            request_id=request_id_of(card),
            decision=decision,
            args_digest=card.args_digest,
            responder=responder,
            reason=reason,
            message=message,
            **more,
        )

    async def publish(self, message: Envelope) -> None:
        """Publish a message (`turn.start`, `approval.respond`) to the channels' exchange,
        persistently, as this adapter's broker user, and wait for RabbitMQ's confirm: the
        services' own publish (`shared.consuming.send`)."""
        bus, _ = self._open()
        await consuming.send(bus, self.topology, message, user_id=self._user)

    async def respond(
        self,
        card: AnyCard,
        decision: Decision,
        responder: str,
        *,
        verdict_within: float | None = None,
        **answer: Unpack[Answer],
    ) -> RespondToApproval:
        """Sign and publish a response (`response`, with the same `answer`); answers what
        was sent (its `response_id` names it in the ledger's `approval.decided` or
        `message.rejected`). With `verdict_within` (seconds), first waits for the ledger's
        answer to it: raises `Refused` when it was refused, `TimeoutError` when no answer
        came in time (it may still count)."""
        response = self.response(card, decision, responder, **answer)
        if verdict_within is None:
            await self.publish(response)
            return response
        _, amqp = self._open()
        # Bound before publishing: the answer cannot come before the queue hears it.
        queue = await amqp.declare_queue(exclusive=True, auto_delete=True)
        for kind in ("message.rejected", "approval.counted", "approval.decided"):
            await queue.bind(f"{self.namespace}.events", f"{kind}.{card.session_id}")
        try:
            await self.publish(response)
            async with asyncio.timeout(verdict_within):
                async for event in _parsed(queue):
                    if isinstance(event, MessageRejected) and event.rejected_message_id == response.message_id:
                        raise Refused(event)
                    if (
                        isinstance(event, ApprovalCounted | ApprovalDecided)
                        and event.causation_id == response.message_id
                    ):
                        return response
        finally:
            await queue.delete(if_unused=False, if_empty=False)
        raise TimeoutError("the event queue closed before the ledger answered")

    async def respond_with_token(self, card: CardEvent, decision: Decision, **said: Unpack[Said]) -> RespondToApproval:
        """Sign and publish a response that redeems the card's one-time token (`token_response`)."""
        response = self.token_response(card, decision, **said)
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


def request_id_of(card: AnyCard) -> str:
    return card.id if isinstance(card, Card) else card.request_id


async def _caught_up(backlog: Iterable[Card] | AsyncIterable[Card], live: AsyncIterator[CardEvent]):
    seen: set[str] = set()
    if isinstance(backlog, AsyncIterable):
        async for card in backlog:
            seen.add(card.id)
            yield card
    else:
        for card in backlog:
            seen.add(card.id)
            yield card
    async for event in live:
        if isinstance(event, ApprovalEscalated) or event.request_id not in seen:
            yield event


def describe(card: AnyCard) -> str:
    """The card as text for a person (a chat message, a terminal): the same lines the
    console and an email show (`shared.on_screen.card_rows`), from its label, tool and
    effect down to its digest, each value redacted and shown by `visible`, so a value
    cannot fake a line of the card or hide a look-alike host."""
    shown: Any = card if isinstance(card, Card) else card.card
    face = card_face(request_id_of(card), shown.model_dump(mode="json"), card.args_digest)
    return "\n".join([card_headline(face), *card_rows(face)])
