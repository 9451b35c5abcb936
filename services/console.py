"""What the command line does beyond running services: it acts as a channel
adapter would, publishing responses to the ledger's queues and reading events,
and reads the ledger to show sessions and pending requests."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any, Literal

import aio_pika
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from faststream.rabbit import RabbitBroker
from sqlalchemy import select

from services.supervisor import Supervisor
from shared import keyring
from shared.consuming import publish
from shared.dead_letters import describe as describe_parked
from shared.ledger.database import create_engine, migrate, sessionmaker
from shared.ledger.tables import ApprovalRequest, Closure, ProviderAttemptRow, Session, TranscriptRow, Turn
from shared.messages import EVENT, CancelTurn, Envelope, RespondToApproval, StartTurn, mint
from shared.provisioning import provision_broker, provision_database
from shared.runtime import Unreachable, address, check_reachable
from shared.settings import Settings
from shared.signatures import sign
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
        self.engine = create_engine(settings, identity="console", pool_size=2)
        self.sessions = sessionmaker(self.engine)
        self._channel_key: Ed25519PrivateKey | None = None
        # Set on entering: a console is used inside `async with`.
        self.connection: aio_pika.abc.AbstractRobustConnection
        self.channel: aio_pika.abc.AbstractChannel

    async def __aenter__(self) -> Console:
        check_reachable(self.settings)
        url, self.user = self.settings.amqp_login(self.identity)
        try:
            self.connection = await aio_pika.connect_robust(url)
        except Exception as error:
            raise Unreachable("RabbitMQ", address(self.settings.rabbitmq_url), error) from None
        self.channel = await self.connection.channel(publisher_confirms=True)
        self.broker = RabbitBroker(url, log_level=logging.DEBUG)
        await self.broker.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        if hasattr(self, "channel"):
            await self.connection.close()
            await self.broker.stop()
        await self.engine.dispose()

    async def send(self, message: Envelope) -> None:
        await publish(self.broker, self.topology, message, user_id=self.user)

    async def watch(self, session_id: str = "*") -> aio_pika.abc.AbstractQueue:
        """A private queue of this session's events (bind before acting, so none is missed)."""
        exchange = await self.channel.get_exchange(self.topology.events.name, ensure=False)
        queue = await self.channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(exchange, routing_key=f"#.{session_id}" if session_id != "*" else "#")
        return queue

    async def request(self, request_id: str) -> ApprovalRequest | None:
        async with self.sessions() as db:
            return await db.get(ApprovalRequest, request_id)

    async def respond(
        self, request_id: str, decision: Literal["approve", "deny"], reason: str, message: str, responder: str
    ) -> str:
        request = await self.request(request_id)
        if request is None:
            raise SystemExit(f"signoff: no approval request {request_id}")
        response = RespondToApproval(
            session_id=request.session_id,
            request_id=request.id,
            decision=decision,
            args_digest=request.args_digest,
            reason=reason,
            message=message,
            responder=responder,
        )
        await self.send(self.sign(response))
        return response.message_id

    def sign(self, response: RespondToApproval) -> RespondToApproval:
        """The response signed with this console's channel key (`signoff setup` makes the CLI's)."""
        if self._channel_key is None:
            self._channel_key = keyring.channel_private_key(self.settings.keys_path, self.settings.channel)
        unsigned = response.model_copy(update={"key_id": self.settings.channel})
        return unsigned.model_copy(update={"signature": sign(self._channel_key, unsigned.signed_part())})


def print_card(request_id: str, card: dict[str, Any], digest: str) -> None:
    print(f"  ┌ approval needed: {card['label']}  ({card['tool']}, effect: {card['effect']})")
    print(f"  │ request:   {request_id}")
    print(f"  │ target:    {card['target']}")
    for line in json.dumps(card["arguments"], indent=2, ensure_ascii=False).splitlines():
        print(f"  │ {line}")
    print(f"  └ digest:    {digest}")


def setup(settings: Settings) -> int:
    """Everything a deployment needs before its services start, made if missing
    (idempotent): its keys, (with broker identities) a RabbitMQ user per service
    and channel with its permissions, the namespace's topology, and on PostgreSQL
    a role per service with its grants and the migrated schema.
    Says what it did."""
    done = keyring.create(settings.keys_path, {settings.channel: ["*"]})
    done += asyncio.run(provision_broker(settings, sorted(keyring.channels(settings.keys_path))))
    done += asyncio.run(provision_database(settings))
    for line in done:
        print(f"signoff setup: {line}")
    return 0


async def migrate_only(settings: Settings) -> int:
    # The schema is the ledger's: its own role owns the tables and migrates them.
    engine = create_engine(settings, identity="approval-ledger", pool_size=2)
    try:
        await migrate(engine, settings)
    finally:
        await engine.dispose()
    return 0


async def start_session(
    settings: Settings,
    text: str,
    session_id: str | None,
    wait: bool,
    provider: str | None = None,
    started_by: str | None = None,
) -> int:
    session_id = session_id or mint("ses")
    async with Console(settings) as console:
        queue = await console.watch(session_id) if wait else None
        await console.send(StartTurn(session_id=session_id, text=text, provider=provider, started_by=started_by))
        print(session_id)
        if queue is not None:
            async with queue.iterator() as messages:
                async for raw in messages:
                    async with raw.process():
                        event = EVENT.validate_json(raw.body)
                        print(f"{event.type}: {event.model_dump_json(exclude={'session_id', 'occurred_at'})}")
                        if event.type in ("turn.completed", "turn.failed", "message.rejected"):
                            break
                        if event.type == "approval.requested" and event.request_id == event.pending_request_ids[-1]:
                            break  # the session waits on a person: every card of the step is out
    return 0


async def show_session(settings: Settings, session_id: str) -> int:
    engine = create_engine(settings, identity="console", pool_size=2)
    try:
        async with sessionmaker(engine)() as db:
            session = await db.get(Session, session_id)
            if session is None:
                print(f"signoff: no session {session_id}", file=sys.stderr)
                return 1
            print(f"session {session.id}: {session.status}")
            for row in await db.scalars(
                select(TranscriptRow).where(TranscriptRow.session_id == session_id).order_by(TranscriptRow.position)
            ):
                entry = row.entry
                calls = "".join(
                    f"\n      → {c['name']}({json.dumps(c['arguments'])}) [{c['call_id']}]"
                    for c in entry.get("tool_calls", [])
                )
                closure = f" [{entry['closure']} for {entry['call_id']}]" if entry.get("closure") else ""
                print(f"  {row.position:3d} {entry['role']:9s}{closure} {entry.get('text', '')}{calls}")
            pending = (
                await db.scalars(
                    select(ApprovalRequest).where(
                        ApprovalRequest.session_id == session_id, ApprovalRequest.status == "pending"
                    )
                )
            ).all()
            for request in pending:
                print_card(request.id, request.card, request.args_digest)
            attempts = (
                await db.scalars(select(ProviderAttemptRow).where(ProviderAttemptRow.session_id == session_id))
            ).all()
            tokens = sum(a.input_tokens + a.output_tokens for a in attempts)
            print(f"  provider attempts: {len(attempts)}, tokens: {tokens}")
    finally:
        await engine.dispose()
    return 0


async def list_pending(settings: Settings, session_id: str | None) -> int:
    engine = create_engine(settings, identity="console", pool_size=2)
    try:
        async with sessionmaker(engine)() as db:
            query = (
                select(ApprovalRequest).where(ApprovalRequest.status == "pending").order_by(ApprovalRequest.created_at)
            )
            if session_id:
                query = query.where(ApprovalRequest.session_id == session_id)
            requests = (await db.scalars(query)).all()
            if not requests:
                print("no pending approval requests")
            for request in requests:
                print(f"session {request.session_id}")
                print_card(request.id, request.card, request.args_digest)
    finally:
        await engine.dispose()
    return 0


async def respond(
    settings: Settings, request_id: str, decision: Literal["approve", "deny"], reason: str, message: str, responder: str
) -> int:
    async with Console(settings) as console:
        request = await console.request(request_id)
        if request is not None and request.status != "pending":
            print(f"signoff: request {request_id} is already {request.status}", file=sys.stderr)
            return 1
        message_id = await console.respond(request_id, decision, reason, message, responder)
        print(f"{decision} sent for {request_id} (message {message_id})")
    return 0


async def cancel(settings: Settings, target: str, reason: str, by: str) -> int:
    async with Console(settings) as console:
        turn_id = target if target.startswith("trn_") else None
        session_id = target
        if turn_id is not None:
            async with console.sessions() as db:
                turn = await db.get(Turn, turn_id)
            if turn is None:
                print(f"signoff: no turn {turn_id}", file=sys.stderr)
                return 1
            session_id = turn.session_id
        command = CancelTurn(session_id=session_id, turn_id=turn_id, reason=reason, cancelled_by=by)
        events = await console.watch(session_id)
        await console.send(command)
        try:
            async with asyncio.timeout(30):
                while True:
                    raw = await events.get(no_ack=True, fail=False)
                    if raw is None:
                        await asyncio.sleep(0.05)
                        continue
                    event = EVENT.validate_json(raw.body)
                    if event.type == "turn.cancelled" and event.causation_id == command.message_id:
                        print(f"cancelled turn {event.turn_id} of session {session_id}")
                        return 0
                    if event.type == "message.rejected" and event.rejected_message_id == command.message_id:
                        print(f"signoff: not cancelled: {event.reason_code}: {event.reason_text}", file=sys.stderr)
                        return 1
        except TimeoutError:
            print(f"signoff: cancel sent for {session_id}; no answer from the ledger within 30 s", file=sys.stderr)
            return 1


async def dead_letters(settings: Settings, limit: int = 100) -> int:
    """List parked messages without consuming them: count first, then take that
    many unacknowledged, each once, and close the channel, which returns them all
    to the queue in their order. The dead-letter queue has no delivery limit, so
    a listing never counts against them."""
    async with Console(settings) as console:
        name = console.topology.dead_letter_queue.name
        channel = await console.connection.channel()
        try:
            queue = await channel.declare_queue(name, passive=True)
            total = queue.declaration_result.message_count or 0
            print(f"{total} dead-lettered message(s) in {name}")
            for _ in range(min(total, limit)):
                raw = await queue.get(no_ack=False, fail=False)
                if raw is None:  # parked messages were taken meanwhile
                    break
                print(describe_parked(raw.message_id, raw.body, raw.headers).line())
            if total > limit:
                print(f"(the first {limit} shown; --limit shows more)")
        finally:
            await channel.close()
    return 0


def demo(settings: Settings) -> int:
    supervisor = Supervisor(settings)
    print(f"signoff: starting the four services (logs in {supervisor.log_dir})…", flush=True)
    supervisor.start()
    try:
        code = asyncio.run(_drive_demo(settings))
        if code != 0:
            return code
        print("\nThe services keep running. In another terminal, with the same environment:")
        print("  .venv/bin/signoff session start 'Publish the notes for 1.3' --wait   # prints the session id")
        print("  .venv/bin/signoff pending                                           # shows the approval card")
        print("  .venv/bin/signoff approve apr_…   (or: signoff deny apr_… --reason '…')")
        print("  .venv/bin/signoff session show ses_…")
        print("Ctrl-C stops the services.", flush=True)
        while True:
            time.sleep(supervisor.WATCH_SECONDS)
            supervisor.watch()
    except KeyboardInterrupt:
        print("\nsignoff: stopping", flush=True)
        return 0
    finally:
        supervisor.stop()


async def _drive_demo(settings: Settings, timeout: float = 60.0) -> int:
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.2f}s] {text}", flush=True)

    session_id = mint("ses")
    async with Console(settings) as console:
        queue = await console.watch(session_id)
        say(f"session {session_id}: asking the agent to publish the release notes")
        await console.send(StartTurn(session_id=session_id, text="Please publish the release notes for version 1.2."))
        try:
            async with asyncio.timeout(timeout):
                async with queue.iterator() as messages:
                    async for raw in messages:
                        async with raw.process():
                            event = EVENT.validate_json(raw.body)
                        if event.type == "approval.requested":
                            say("the model asked for a tool that needs approval; the card a person sees:")
                            print_card(event.request_id, event.card.model_dump(), event.args_digest)
                            say(f"session is waiting on {', '.join(event.pending_request_ids)}")
                            say(f"approving {event.request_id}")
                            await console.respond(event.request_id, "approve", "", "", "demo")
                        elif event.type == "approval.decided":
                            say(f"decision committed: {event.decision} by {event.responder}")
                        elif event.type == "tool.closed":
                            async with console.sessions() as db:
                                closure = await db.get(Closure, event.call_id)
                            output = json.dumps((closure.output or {}).get("value"))
                            say(f"tool ran once and closed as {event.kind}: {output}")
                        elif event.type == "turn.completed":
                            say(f"final answer: {event.text}")
                            return 0
                        elif event.type in ("turn.failed", "message.rejected"):
                            say(f"{event.type}: {event.reason_text}")
                            return 1
        except TimeoutError:
            print(
                f"signoff: no answer within {timeout:.0f}s; see the logs in {settings.data_dir / 'logs'}",
                file=sys.stderr,
            )
            return 1
    return 1
