"""The operator's connection to a deployment: the command line acts as a channel adapter
would (`Console`), publishing to the ledger's queues as its channel, signing its
responses, watching events and reading the ledger. Each command is a module of its own
beside this one (sessions, decisions, parked, audit_log, deployment, demo); what a person
sees of a request is cards.py."""

from __future__ import annotations

from typing import Literal

import aio_pika

from shared import consuming, keyring
from shared.bus import Bus
from shared.keyring import speaks_for
from shared.ledger.console_reads import ConsoleLedger
from shared.ledger.tables import ApprovalRequest
from shared.messages import Envelope, RespondToApproval
from shared.responses import ResponseSigner
from shared.runtime import Unreachable, address, check_reachable
from shared.settings import Settings
from shared.topology import Topology


class Console:
    """A channel adapter's side of the bus and the ledger: it starts turns, signs and
    sends responses, watches events and reads the ledger. It connects as its
    channel's broker identity (`channel.<SIGNOFF_CHANNEL>`) unless told another
    (tests use a service's to show what that service may and may not do)."""

    def __init__(self, settings: Settings, identity: str | None = None) -> None:
        self.settings = settings
        self.identity = identity or f"channel.{settings.channel}"
        self.topology = Topology(settings.namespace, settings.delivery_limit, settings.queue_type)
        # What it reads of the ledger, and the dead-letter actions it records, as the console's role.
        self.ledger = ConsoleLedger(settings)
        self._signer: ResponseSigner | None = None
        # Set on entering: a console is used inside `async with`.
        self.bus: Bus
        self.channel: aio_pika.abc.AbstractChannel

    async def __aenter__(self) -> Console:
        check_reachable(self.settings)
        url, self.user = self.settings.amqp_login(self.identity)
        # One connection, the services' own kind (`Bus`): it publishes on its confirming
        # channel; `channel` is the console's for its event queues (and the tests' raw publishes).
        self.bus = Bus(url, prefetch=1)
        try:
            await self.bus.connect()
        except Exception as error:
            raise Unreachable("RabbitMQ", address(self.settings.rabbitmq_url), error) from None
        self.channel = await self.bus.connection.channel(publisher_confirms=True)
        return self

    async def __aexit__(self, *exc) -> None:
        if hasattr(self, "bus"):
            await self.bus.stop()
        await self.ledger.close()

    @property
    def connection(self) -> aio_pika.abc.AbstractRobustConnection:
        """The console's one connection, for a channel of a command's own (`signoff dead-letters`)."""
        return self.bus.connection

    async def send(self, message: Envelope) -> None:
        await consuming.send(self.bus, self.topology, message, user_id=self.user)

    async def watch(self, session_id: str = "*") -> aio_pika.abc.AbstractQueue:
        """A private queue of this session's events (bind before acting, so none is missed)."""
        exchange = await self.channel.get_exchange(self.topology.events.name, ensure=False)
        queue = await self.channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(exchange, routing_key=f"#.{session_id}" if session_id != "*" else "#")
        return queue

    async def request(self, request_id: str) -> ApprovalRequest | None:
        return await self.ledger.request(request_id)

    async def respond(
        self,
        request_id: str,
        decision: Literal["approve", "deny", "respond"],
        reason: str,
        message: str,
        responder: str,
    ) -> str:
        request = await self.request(request_id)
        if request is None:
            raise SystemExit(f"signoff: no approval request {request_id}")
        response = self.signer().respond(
            session_id=request.session_id,
            request_id=request.id,
            decision=decision,
            args_digest=request.args_digest,
            reason=reason,
            message=message,
            responder=responder,
        )
        await self.send(response)
        return response.message_id

    def signer(self) -> ResponseSigner:
        """This console's channel key (`signoff setup` makes the CLI's), read when first needed."""
        if self._signer is None:
            key = keyring.channel_private_key(self.settings.keys_path, self.settings.channel)
            self._signer = ResponseSigner(self.settings.channel, key)
        return self._signer

    def sign(self, response: RespondToApproval) -> RespondToApproval:
        """The response signed with this console's channel key."""
        return self.signer().sign(response)


def check_may_assert(settings: Settings, principal: str) -> None:
    """Refuse, before sending anything, to name someone the CLI's channel is not
    registered for (the ledger would refuse it as `wrong_principal`): `--as` names
    only the principals an operator listed for it."""
    try:
        channel = keyring.channels(settings.keys_path).get(settings.channel)
    except PermissionError:
        return  # the registry is the ledger's to read here; the ledger judges
    if channel is None:
        raise SystemExit(
            f"signoff: channel {settings.channel!r} is not registered in {settings.keys_path / keyring.CHANNELS}; "
            "run `signoff setup`"
        )
    if not speaks_for(channel, principal):  # the ledger's own rule
        raise SystemExit(
            f"signoff: channel {channel.name!r} may not act as {principal!r}; it may act as "
            f"{', '.join(channel.principals) or 'nobody'}. Nothing was sent. An operator adds a person with "
            f"`signoff setup --cli-principal {principal}`."
        )
