"""What the command line does beyond running services: it acts as a channel
adapter would, publishing responses to the ledger's queues and reading events,
and reads the ledger to show sessions and pending requests."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import aio_pika
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from faststream.rabbit import RabbitBroker

from services.approval_ledger.domain import speaks_for
from services.gateway import users as gateway_users
from services.gateway.settings import GatewaySettings
from services.supervisor import Supervisor
from shared import audit, faults, keyring, provisioning
from shared.amqp_hosts import connect_robust, failover_broker, split_hosts
from shared.catalogue import load_catalogue
from shared.consuming import publish
from shared.dead_letters import ParkedMessage, proven_sender
from shared.dead_letters import describe as describe_parked
from shared.ledger import dead_letter_actions
from shared.ledger.console_reads import ConsoleLedger, chained_by_txid, read_audit
from shared.ledger.database import create_engine, migrate
from shared.ledger.tables import ApprovalRequest, Grant, Turn
from shared.messages import EVENT, CancelTurn, Envelope, RespondToApproval, RevokeGrant, StartTurn, mint, now
from shared.on_screen import FIELD_CHARS, TARGET_CHARS, TEXT_CHARS, host_warnings, json_inline, json_lines, visible
from shared.provisioning import provision_broker, provision_database, provision_redis
from shared.redaction import redact_text, redact_value
from shared.runtime import Unreachable, address, check_reachable
from shared.settings import Settings
from shared.signatures import sign
from shared.topology import OPERATOR, Topology


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
        self._channel_key: Ed25519PrivateKey | None = None
        # Set on entering: a console is used inside `async with`.
        self.connection: aio_pika.abc.AbstractRobustConnection
        self.channel: aio_pika.abc.AbstractChannel

    async def __aenter__(self) -> Console:
        check_reachable(self.settings)
        url, self.user = self.settings.amqp_login(self.identity)
        try:
            self.connection = await connect_robust(url)
        except Exception as error:
            raise Unreachable("RabbitMQ", address(self.settings.rabbitmq_url), error) from None
        self.channel = await self.connection.channel(publisher_confirms=True)
        self.broker = failover_broker(RabbitBroker(split_hosts(url)[0], log_level=logging.DEBUG), url)
        await self.broker.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        if hasattr(self, "channel"):
            await self.connection.close()
            await self.broker.stop()
        await self.ledger.close()

    async def send(self, message: Envelope) -> None:
        await publish(self.broker, self.topology, message, user_id=self.user)

    async def watch(self, session_id: str = "*") -> aio_pika.abc.AbstractQueue:
        """A private queue of this session's events (bind before acting, so none is missed)."""
        exchange = await self.channel.get_exchange(self.topology.events.name, ensure=False)
        queue = await self.channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(exchange, routing_key=f"#.{session_id}" if session_id != "*" else "#")
        return queue

    async def request(self, request_id: str) -> ApprovalRequest | None:
        return await self.ledger.request(request_id)

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


def print_card(
    request_id: str, card: dict[str, Any], digest: str, escalated: tuple[datetime, Sequence[str] | None] | None = None
) -> None:
    print("\n".join(card_lines(request_id, card, digest, escalated)))


def print_request(request: ApprovalRequest) -> None:
    """A request on record as its card, saying whether (when, to whom) it was escalated."""
    print_card(request.id, request.card, request.args_digest, escalation_of(request))


def escalation_of(request: ApprovalRequest) -> tuple[datetime, Sequence[str] | None] | None:
    """(when, to whom) a request was escalated; None: it was not. Whom is None for one
    escalated before the ledger kept it (migration 0011)."""
    return None if request.escalated_at is None else (request.escalated_at, request.escalated_to)


def card_lines(
    request_id: str, card: dict[str, Any], digest: str, escalated: tuple[datetime, Sequence[str] | None] | None = None
) -> list[str]:
    """The approval card as a person reads it. Everything on it but the frame comes
    from outside (the model wrote the arguments, and so the target), so every value
    is shown by `visible` (shared/on_screen.py): nothing on it can move the cursor,
    clear a line, hide or reorder text, or push the target off the screen. `escalated`:
    (when, to whom) it was announced again to its tool's escalation group."""
    tool, target = shown_tool(card), shown_target(card)
    lines = [
        f"  ┌ approval needed: {visible(card.get('label', ''), FIELD_CHARS)}  "
        f"({tool}, effect: {visible(card.get('effect', ''), FIELD_CHARS)})",
        f"  │ request:   {visible(request_id, FIELD_CHARS)}",
        f"  │ target:    {target}",
    ]
    if card.get("reason"):
        # Why it needs approval, and from how many: the tool's rule over these arguments.
        lines.append(f"  │ why:       {visible(str(card['reason']), TEXT_CHARS)}")
    arguments = redact_value(card.get("arguments", {}))
    warnings = host_warnings(redact_text(str(card.get("target", "")))) + [
        w for text in _strings(arguments) for w in host_warnings(text)
    ]
    lines += [f"  │ WARNING:   {w}" for w in dict.fromkeys(warnings)]
    shown = json_lines(arguments)
    lines += [f"  │ {line}" for line in shown]
    if card.get("hidden"):
        hidden = ", ".join(visible(h, FIELD_CHARS) for h in card["hidden"])
        lines.append(f"  │ hidden:    {hidden} (secret: withheld from everyone but the executor)")
    if len(shown) > 8:  # the top of the card may have scrolled away: say again what it is about
        lines.append(f"  │ that is:   {tool} on {target}")
    if escalated is not None:
        lines.append(f"  │ escalated: {escalation_line(*escalated)}")
    lines.append(f"  └ digest:    {visible(digest, FIELD_CHARS)}")
    return lines


def escalation_line(at: datetime, to: Sequence[str] | None) -> str:
    """When a request was escalated and to whom (the tools file's names, shown by
    `visible` as every name on screen is); they may approve it from then on."""
    whom = ", ".join(visible(name, FIELD_CHARS) for name in to) if to else "(not recorded)"
    return f"{shown_time(at)} to {whom or 'nobody'}, who may approve it as well"


def shown_time(at: datetime | None) -> str:
    return "?" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def turn_outcome(turn: Turn | None) -> str:
    """How a session's last turn ended and why, in one line: its outcome, when, and
    the reason's code and text as its `turn.failed` or `turn.cancelled` said (a
    provider's error, the bound it reached, who cancelled it and why). The text is the
    provider's, the model's or a person's: redacted, then shown by `visible`."""
    if turn is None:
        return "no turn yet"
    head = f"last turn {visible(turn.id, FIELD_CHARS)}: {visible(turn.status, FIELD_CHARS)}"
    if turn.status == "running":
        return f"{head} since {shown_time(turn.created_at)}"
    head += f" at {shown_time(turn.completed_at)}"
    if turn.status == "completed":
        return head
    if turn.status == "cancelled":
        by = f" by {visible(turn.ended_by, FIELD_CHARS)}" if turn.ended_by else ""
        why = f": {reason_shown(turn.reason_text)}" if turn.reason_text else ""
        return head + by + why
    if turn.reason_code is None and turn.reason_text is None:
        return f"{head} (its reason was not recorded: the turn ended before the ledger kept reasons)"
    return f"{head}: {visible(turn.reason_code or '?', FIELD_CHARS)}: {reason_shown(turn.reason_text or '')}"


def reason_shown(text: str) -> str:
    return visible(redact_text(text), TEXT_CHARS)


def ended_story(entry: dict[str, Any], turn: Turn | None) -> str:
    """A `turn.ended` audit entry as `signoff audit show` tells it, with its reason's
    text from the turn's row when that text is the one the entry's digest names (the
    entry keeps only the digest); else says that the text on record differs."""
    told = redact_text(audit.story(entry))
    detail = entry.get("detail") or {}
    digest = detail.get("reason_digest")
    if digest is None or turn is None or turn.reason_text is None:
        return visible(told)
    if audit.digest_of(turn.reason_text) != digest:
        return visible(told) + " (the turn's reason text on record does not match this entry's digest)"
    return f"{visible(told)}: {reason_shown(turn.reason_text)}"


def question(decision: str, request_id: str, responder: str, card: dict[str, Any]) -> str:
    """What `signoff approve` asks: it names the tool and the target again, since a long
    card may have scrolled them away, and the person answers about what runs."""
    return (
        f"{decision} {visible(request_id, FIELD_CHARS)} as {visible(responder, FIELD_CHARS)}: "
        f"{shown_tool(card)} on {shown_target(card)}? [y/N] "
    )


def shown_tool(card: dict[str, Any]) -> str:
    return visible(card.get("tool", ""), FIELD_CHARS)


def shown_target(card: dict[str, Any]) -> str:
    return visible(redact_text(str(card.get("target", ""))), TARGET_CHARS)


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (str(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def setup(settings: Settings, cli_principals: Sequence[str] = (), hand_out: Path | None = None) -> int:
    """Everything a deployment needs before its services start, made if missing
    (idempotent): its keys, the CLI's channel (`SIGNOFF_CHANNEL`) registered for
    the OS user running setup plus `cli_principals` (and whomever it was registered
    for before), (with broker identities) a RabbitMQ user per service and channel
    with its permissions, the namespace's topology, a Redis user for each service
    that uses Redis (its own keys only), and on PostgreSQL a role per service with
    its grants and the migrated schema; with `hand_out`, each service's own key files
    in a folder of its own. Says what it did."""
    for principal in cli_principals:
        if not principal or any(c in principal for c in "*?[]") or principal.startswith("token:"):
            raise SystemExit(f"signoff setup: --cli-principal {principal!r}: name one person (no patterns, no token:)")
    # Each service it needs answers before anything is made; one that fails later is named
    # (SetupFailed: its URL without a password) and the broker and Redis users this run made go.
    provisioning.check_reachable(settings)
    before = keyring.registered_principals(settings.keys_path, settings.channel)
    principals = keyring.cli_principals(before, keyring.os_user(), list(cli_principals))
    done = []
    if before and "*" in before:
        done.append(f"channel {settings.channel} may no longer assert anyone: '*' dropped from its principals")
    done += keyring.create(settings.keys_path, {settings.channel: principals})
    # The HTTP gateway's channel, registered for exactly its users (`signoff user add`), and its session key.
    done += gateway_users.register_channel(settings.keys_path, GatewaySettings(**settings.model_dump()).users_path)
    done += gateway_users.make_session_key(settings.keys_path)
    made = provisioning.Made()
    try:
        done += asyncio.run(provision_broker(settings, sorted(keyring.channels(settings.keys_path)), made))
        done += asyncio.run(provision_redis(settings, made))
        done += asyncio.run(provision_database(settings))
    except BaseException as failure:
        undone = asyncio.run(provisioning.undo(settings, made))
        if not isinstance(failure, provisioning.SetupFailed):
            raise
        raise SystemExit("\nsignoff setup: ".join([str(failure), *undone])) from None
    if hand_out is not None:
        # Each container mounts only its own folder (docker-compose.yml): no service reads another's keys.
        for service in keyring.HELD_BY:
            files = keyring.hand_out(settings.keys_path, service, hand_out / service)
            done.append(f"{service}'s own keys in {hand_out / service}: {', '.join(f.name for f in files)}")
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


async def start_session(
    settings: Settings,
    text: str,
    session_id: str | None,
    wait: bool,
    provider: str | None = None,
    started_by: str | None = None,
) -> int:
    if started_by is not None:
        check_may_assert(settings, started_by)
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
                        said = event.model_dump_json(exclude={"session_id", "occurred_at"})
                        print(f"{event.type}: {visible(said, json_text=True)}")
                        if event.type in ("turn.completed", "turn.failed", "message.rejected"):
                            break
                        if event.type == "approval.requested" and event.request_id == event.pending_request_ids[-1]:
                            break  # the session waits on a person: every card of the step is out
    return 0


async def show_session(settings: Settings, session_id: str) -> int:
    async with ConsoleLedger(settings) as ledger:
        found = await ledger.session_on_record(session_id)
    if found is None:
        print(f"signoff: no session {session_id}", file=sys.stderr)
        return 1
    print(f"session {visible(found.session.id, FIELD_CHARS)}: {found.session.status}")
    print(f"  {turn_outcome(found.last_turn)}")
    for row in found.transcript:
        entry = row.entry
        # The transcript's text is the model's, a tool's and a person's: shown, never obeyed.
        calls = "".join(
            f"\n      → {visible(c['name'], FIELD_CHARS)}({json_inline(redact_value(c['arguments']))})"
            f" [{visible(c['call_id'], FIELD_CHARS)}]"
            for c in entry.get("tool_calls", [])
        )
        closure = (
            f" [{visible(entry['closure'], FIELD_CHARS)} for {visible(entry['call_id'], FIELD_CHARS)}]"
            if entry.get("closure")
            else ""
        )
        text = visible(redact_text(str(entry.get("text", ""))), TEXT_CHARS)
        role = visible(entry.get("role", ""), FIELD_CHARS)
        print(f"  {row.position:3d} {role:9s}{closure} {text}{calls}")
    for request in found.pending:
        print_request(request)
    # Escalations of requests no longer waiting: who was asked, and when.
    for request in found.escalated_before:
        assert request.escalated_at is not None
        print(
            f"  request {visible(request.id, FIELD_CHARS)} ({visible(request.status, FIELD_CHARS)}) was "
            f"escalated {escalation_line(request.escalated_at, request.escalated_to)}"
        )
    tokens = sum(a.input_tokens + a.output_tokens for a in found.attempts)
    print(f"  provider attempts: {len(found.attempts)}, tokens: {tokens}")
    return 0


# `signoff pending` shows this many cards unless told otherwise (`--page-size`, `--all`):
# with thousands waiting, a terminal full of cards helps nobody (issue 25).
PENDING_PAGE = 20


async def list_pending(
    settings: Settings,
    session_id: str | None,
    *,
    tool: str | None = None,
    approver: str | None = None,
    page: int = 1,
    page_size: int = PENDING_PAGE,
    every: bool = False,
) -> int:
    """The pending requests, the first to expire first, a page at a time; then how many
    more there are. Read along `ix_approval_requests_due` (status, expires_at): a page
    costs its cards and the count, not a card per request waiting."""
    if page < 1 or page_size < 1:
        print("signoff: --page and --page-size count from 1", file=sys.stderr)
        return 2
    approvable_by = (load_catalogue(settings.tools_file), approver) if approver else None
    skipped = 0 if every else (page - 1) * page_size
    async with ConsoleLedger(settings) as ledger:
        total, requests = await ledger.pending(
            session_id=session_id,
            tool=tool,
            approver=approvable_by,
            skip=skipped,
            limit=None if every else page_size,
        )
    if not total:
        print("no pending approval requests")
    elif not requests:
        print(f"no page {page}: {total} pending, {page_size} a page")
    for request in requests:
        print(f"session {visible(request.session_id, FIELD_CHARS)}")
        print_request(request)
    more = total - skipped - len(requests)
    if requests and more > 0:
        print(f"{more} more; --all or --page {page + 1}")
    return 0


async def respond(
    settings: Settings,
    request_id: str,
    decision: Literal["approve", "deny"],
    reason: str,
    message: str,
    responder: str,
    *,
    confirm: bool = False,
) -> int:
    """Send a decision; with `confirm`, first show the card and ask (a person approves
    what they saw, not an id)."""
    check_may_assert(settings, responder)
    async with Console(settings) as console:
        request = await console.request(request_id)
        if request is not None and request.status != "pending":
            print(f"signoff: request {request_id} is already {request.status}", file=sys.stderr)
            return 1
        if confirm and request is not None:
            print_request(request)
            if not _confirmed(question(decision, request.id, responder, request.card)):
                print(f"signoff: not sent; nothing was decided for {request_id}", file=sys.stderr)
                return 1
        message_id = await console.respond(request_id, decision, reason, message, responder)
        print(f"{decision} sent for {request_id} (message {message_id})")
    return 0


def _confirmed(question: str) -> bool:
    """A person's yes at the terminal; no terminal, or anything but yes, is a no."""
    print(question, end="", flush=True)
    answer = sys.stdin.readline() if sys.stdin is not None else ""
    return answer.strip().lower() in ("y", "yes")


async def cancel(settings: Settings, target: str, reason: str, by: str) -> int:
    check_may_assert(settings, by)
    async with Console(settings) as console:
        turn_id = target if target.startswith("trn_") else None
        session_id = target
        if turn_id is not None:
            turn = await console.ledger.turn(turn_id)
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
                        said = f"{event.reason_code}: {visible(event.reason_text, TEXT_CHARS)}"
                        print(f"signoff: not cancelled: {said}", file=sys.stderr)
                        return 1
        except TimeoutError:
            print(f"signoff: cancel sent for {session_id}; no answer from the ledger within 30 s", file=sys.stderr)
            return 1


def grant_line(grant: Grant, at: datetime) -> str:
    """One grant as `signoff grants` lists it (texts through `visible`)."""
    if grant.revoked_at is not None:
        by = visible(grant.revoked_by or "", FIELD_CHARS)
        state = f"revoked by {by} at {grant.revoked_at.isoformat(timespec='seconds')}"
    elif grant.expires_at is not None and grant.expires_at <= at:
        state = "expired"
    else:
        state = "live"
    target = "any target" if grant.target is None else visible(grant.target, TARGET_CHARS)
    until = "the rest of the session" if grant.expires_at is None else grant.expires_at.isoformat(timespec="seconds")
    return (
        f"{grant.id}  {state}  session {visible(grant.session_id, FIELD_CHARS)}  "
        f"{visible(grant.tool, FIELD_CHARS)} v{visible(grant.tool_version, FIELD_CHARS)} on {target}, "
        f"until {until}; given by {visible(grant.granted_by, FIELD_CHARS)} "
        f"at {grant.granted_at.isoformat(timespec='seconds')}"
    )


async def list_grants(settings: Settings, session_id: str | None) -> int:
    """Every remembered approval (of one session, or all), live, expired or revoked."""
    async with ConsoleLedger(settings) as ledger:
        grants = await ledger.grants(session_id)
    if not grants:
        print("no grants")
    at = now()
    for grant in grants:
        print(grant_line(grant, at))
    return 0


async def revoke_grant(settings: Settings, grant_id: str, reason: str, by: str) -> int:
    """Revoke a grant as `by` (the ledger judges whether they may) and wait for its
    verdict: the audit log's entry for this very command (revoked, or refused and why)."""
    check_may_assert(settings, by)
    async with Console(settings) as console:
        grant = await console.ledger.grant(grant_id)
        if grant is None:
            print(f"signoff: no grant {grant_id}", file=sys.stderr)
            return 1
        command = RevokeGrant(session_id=grant.session_id, grant_id=grant_id, reason=reason, revoked_by=by)
        await console.send(command)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            entry = await console.ledger.audit_entry_of(grant.session_id, command.message_id)
            if entry is not None and entry.kind == "grant.revoked":
                print(f"revoked grant {grant_id}: calls decided from now on ask a person again")
                return 0
            if entry is not None:
                detail = entry.detail or {}
                said = f"{detail.get('reason_code')}: {visible(str(detail.get('reason_text', '')), TEXT_CHARS)}"
                print(f"signoff: not revoked: {said}", file=sys.stderr)
                return 1
            await asyncio.sleep(0.2)
        print(f"signoff: revocation sent for {grant_id}; no answer from the ledger within 30 s", file=sys.stderr)
        return 1


async def dead_letters(settings: Settings, limit: int = 100) -> int:
    """List parked messages without consuming them: count first, then take that
    many unacknowledged, each once, and close the channel, which returns them all
    to the queue in their order. The dead-letter queue has no delivery limit, so
    a listing never counts against them. Read as the operator's own broker identity:
    no channel may read the dead letters."""
    async with Console(settings, OPERATOR) as console:
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
                # Headers and body are whoever parked it's: `line` shows each field by `visible`.
                parked = describe_parked(raw.message_id, raw.body, raw.headers, raw.user_id)
                print(_as_proven(settings, console.topology, parked).line(redact_text))
            if total > limit:
                print(f"(the first {limit} shown; --limit shows more)")
        finally:
            await channel.close()
    return 0


async def audit_verify(settings: Settings) -> int:
    """Check both chains; name the first broken entry and fail if there is one."""
    entries, chain, head = await read_audit(settings)
    verdict = audit.verify(entries, chain, head, by_txid=chained_by_txid(settings))
    if verdict.broken is not None:
        print(f"signoff audit: BROKEN at {visible(verdict.broken.line())}", file=sys.stderr)
        return 1
    head_hash = head["hash"] if head else None
    print(
        f"signoff audit: intact: {verdict.entries} entries, {verdict.linked} in the global chain "
        f"(head #{head['seq'] if head else 0} {head_hash}), {verdict.pending} written since its last link"
    )
    return 0


async def audit_show(settings: Settings, session_id: str) -> int:
    """A session's story from its audit entries, as a person reads it."""
    entries, _, _ = await read_audit(settings, session_id)
    if not entries:
        print(f"signoff: no audit entries for session {session_id}", file=sys.stderr)
        return 1
    broken = audit.first(audit.session_problems(entries))
    state = "chain intact" if broken is None else f"chain BROKEN at {visible(broken.line())}"
    turns = await read_turns(settings, session_id)
    print(f"session {visible(session_id, FIELD_CHARS)}: {len(entries)} audit entries, {state}")
    by_id = {turn.id: turn for turn in turns}
    for entry in entries:
        seq = f"#{entry['session_seq']}" if entry["session_seq"] is not None else "--"
        told = (
            ended_story(entry, by_id.get(entry["subject"]))
            if entry["kind"] == "turn.ended"
            else visible(audit.story(entry))
        )
        print(f"  {entry['recorded_at']:%Y-%m-%d %H:%M:%S.%f}"[:-3] + f"  {seq:>4}  {told}")
    # Where the story ends: how its last turn ended and why, as `session show` says it.
    print(f"  {turn_outcome(turns[-1] if turns else None)}")
    return 0 if broken is None else 1


async def read_turns(settings: Settings, session_id: str) -> list[Turn]:
    """A session's turns, oldest first: what `audit show` tells each one's end with."""
    async with ConsoleLedger(settings) as ledger:
        return await ledger.turns(session_id)


async def audit_export(settings: Settings, output: str | None, session_id: str | None = None) -> int:
    """Every entry (or one session's) as a JSON line, with its place in the global chain
    (null while not yet linked): a copy to keep elsewhere, whose last link anchors it."""
    entries, chain, _ = await read_audit(settings, session_id)
    link_of = {link["entry_id"]: link for link in chain}
    handle = open(output, "w", encoding="utf-8") if output else sys.stdout
    try:
        for entry in entries:
            link = link_of.get(entry["id"])
            line = {
                **{k: v for k, v in entry.items() if k != "txid"},
                "recorded_at": entry["recorded_at"].isoformat(),
                "link": None if link is None else {"seq": link["seq"], "hash": link["hash"]},
            }
            handle.write(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n")
    finally:
        if output:
            handle.close()
    if output:
        print(f"signoff audit: {len(entries)} entries written to {output}", file=sys.stderr)
    return 0


async def replay_dead_letters(settings: Settings, message_id: str | None, operator: str, reason: str = "") -> int:
    """Send parked messages back where they came from (after the fault that parked them
    is fixed): `message_id`, or every parked message (None). Each goes to the queue of
    its type, as the sender that may send it (the ledger trusts a `step.completed` only
    from the model-step's identity, whose password `signoff setup` keeps in the keys
    folder), with its own message id, so consumers that already applied it drop it.
    The action is recorded in the ledger before the parked copy is acked."""
    return await _act_on_dead_letters(settings, message_id, "replayed", operator, reason)


async def drop_dead_letters(settings: Settings, message_id: str | None, operator: str, reason: str) -> int:
    """Remove parked messages for good (`message_id`, or all), the reason recorded in the
    ledger (`dead_letter_actions`) before each leaves the queue."""
    return await _act_on_dead_letters(settings, message_id, "dropped", operator, reason)


async def _act_on_dead_letters(
    settings: Settings, message_id: str | None, action: Literal["replayed", "dropped"], operator: str, reason: str
) -> int:
    """Take the parked messages unacknowledged, one by one; act on those asked for (record,
    then replay or not, then ack); close the channel, which returns the others in order."""
    acted = refused = 0
    async with AsyncExitStack() as stack:
        console = await stack.enter_async_context(Console(settings, OPERATOR))
        senders: dict[str, Console] = {}
        name = console.topology.dead_letter_queue.name
        channel = await console.connection.channel()
        stack.push_async_callback(channel.close)
        queue = await channel.declare_queue(name, passive=True)
        for _ in range(queue.declaration_result.message_count or 0):
            raw = await queue.get(no_ack=False, fail=False)
            if raw is None:
                break
            parked = describe_parked(raw.message_id, raw.body, raw.headers, raw.user_id)
            if message_id is not None and parked.message_id != message_id:
                continue
            identity = None
            if action == "replayed":
                identity, refusal = _original_sender(settings, console.topology, parked)
                if identity is None:
                    print(
                        f"{visible(parked.message_id, FIELD_CHARS)}: not replayed: {visible(refusal, FIELD_CHARS * 4)};"
                        " `signoff dead-letters drop` removes it",
                        file=sys.stderr,
                    )
                    refused += 1
                    continue
            # A console killed after recording and before the copy left the queue: its next
            # run finishes the action on record for this very parking, and records no second.
            recorded = await dead_letter_actions.action_on_record(console.ledger, parked, action)
            if recorded is None:
                await dead_letter_actions.record_action(console.ledger, parked, action, operator, reason)
            await faults.reached("console.after_record", action)
            if identity is not None:
                await _send_back(settings, stack, senders, identity, raw, parked, operator)
            await raw.ack()
            acted += 1
            print(
                f"{action} {visible(parked.message_id, FIELD_CHARS)}  type={visible(parked.message_type, FIELD_CHARS)}"
                f" session={visible(parked.session_id, FIELD_CHARS)}  (parked: {visible(parked.reason, FIELD_CHARS)})"
                + (
                    ""
                    if recorded is None
                    else f"  (finishing the action {visible(recorded.operator, FIELD_CHARS)} recorded at "
                    f"{shown_time(recorded.acted_at)}: recorded once)"
                )
            )
    if message_id is not None and acted == 0 and refused == 0:
        print(f"signoff: no parked message {message_id}", file=sys.stderr)
        return 1
    if message_id is None:
        print(f"{acted} message(s) {action}" + (f", {refused} could not be" if refused else ""))
    return 1 if refused else 0


async def _send_back(
    settings: Settings,
    stack: AsyncExitStack,
    senders: dict[str, Console],
    identity: str,
    raw: aio_pika.abc.AbstractIncomingMessage,
    parked: ParkedMessage,
    operator: str,
) -> None:
    """Publish a parked message to the queue of its type, as `identity`, with its own id."""
    if identity not in senders:
        senders[identity] = await stack.enter_async_context(Console(settings, identity))
    by = senders[identity]
    await by.broker.publish(
        raw.body,
        exchange=by.topology.inbound_exchange(parked.message_type).name,
        routing_key=parked.message_type,
        persist=True,
        message_id=parked.message_id,
        content_type="application/json",
        user_id=by.user,
        headers={"x-signoff-replayed-by": operator},
    )


def _original_sender(settings: Settings, topology: Topology, parked: ParkedMessage) -> tuple[str | None, str]:
    """The broker identity a parked message is replayed as: the one that sent it, as its
    parking proves (shared/dead_letters.py `proven_sender`), never the one its type
    names: anybody who may write the dead letters could otherwise have a message of
    any type re-sent as its rightful sender. (None, why not) when nothing proves it."""
    from shared.topology import SENDERS

    sender = SENDERS.get(parked.message_type)
    if sender is None:
        return None, f"its body names no message type Signoff takes ({parked.reason})"
    if not settings.broker_identities:
        # One broker user for everyone: there is nobody else to send it as.
        return (f"channel.{settings.channel}" if sender == "channel" else sender), ""
    user = proven_sender(parked, topology)
    if user is None:
        return None, _unproven(parked)
    identity = user[len(topology.namespace) + 1 :]
    if not settings.broker_password_file(identity).exists():
        return None, f"its sender {user} has no broker password in {settings.broker_password_file(identity).parent}"
    return identity, ""


def _as_proven(settings: Settings, topology: Topology, parked: ParkedMessage) -> ParkedMessage:
    """A parked command as an operator should read it: one whose parking nothing proves
    is listed as that, with what it claims, so a forged reason is not taken for the
    broker's or a consumer's."""
    from dataclasses import replace

    from shared.dead_letters import UNPROVEN

    if not settings.broker_identities or topology.consumer(parked.message_type) is None:
        return parked
    if proven_sender(parked, topology) is not None:
        return parked
    return replace(parked, reason=UNPROVEN, detail=f"{_unproven(parked)}; it claims {parked.reason}: {parked.detail}")


def _unproven(parked: ParkedMessage) -> str:
    """Why nothing proves who sent a parked message, in an operator's words."""
    return (
        f"nothing proves who sent this {parked.message_type}: it was put on the dead letters by "
        f"{parked.parked_by or 'an unnamed user'}, naming {parked.recorded_sender or 'no'} sender; only RabbitMQ "
        "(keeping the sender's own user_id) or the consumer of its queue (naming a sender that may send it) prove it"
    )


def demo_login(settings: Settings) -> tuple[str, str]:
    """A login that works on the gateway: the user `demo` (an operator) with a password made
    once and kept beside the gateway's keys (0600), so each `make run` prints the same one.
    Made before the services start: under `signoff up` as root the ledger holds a copy of
    the channel registry that lists the gateway's users."""
    gateway = GatewaySettings(**settings.model_dump())
    saved = settings.keys_path / "gateway" / "demo.password"
    known = gateway_users.Users.load(gateway.users_path).users
    if "demo" in known and saved.exists():
        return "demo", saved.read_text().strip()
    password = secrets.token_urlsafe(15)
    gateway_users.add(settings.keys_path, gateway.users_path, "demo", password, [], True)
    saved.unlink(missing_ok=True)
    saved.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(password + "\n")
    return "demo", password


def gateway_lines(settings: Settings, name: str, password: str) -> list[str]:
    gateway = GatewaySettings(**settings.model_dump())
    host = "127.0.0.1" if gateway.gateway_host in ("0.0.0.0", "") else gateway.gateway_host
    url = f"http://{host}:{gateway.gateway_port}"
    jar = settings.data_dir.resolve() / "gateway.cookies"
    login = json.dumps({"name": name, "password": password})
    return [
        f"The inbox: {url}/inbox  (log in as {name} / {password}; ask the agent, approve its card, watch it run)",
        f"The HTTP gateway: {url}  (login: {name} / {password}; API: {url}/v1/openapi.json)",
        f"  curl -s -c {jar} -H 'Content-Type: application/json' -d '{login}' {url}/v1/login"
        "   # answers the csrf_token",
        f"  curl -s -b {jar} '{url}/v1/requests?status=pending'",
        f"  curl -s -b {jar} -H 'X-CSRF-Token: <csrf_token>' -H 'Idempotency-Key: 1' -H 'Content-Type: "
        f'application/json\' -d \'{{"decision": "approve"}}\' {url}/v1/requests/apr_…/decision',
        f"  curl -sN -b {jar} {url}/v1/events   # the event stream",
    ]


def wait_for_gateway(settings: Settings, timeout: float = 120.0) -> bool:
    """Until the gateway answers (it imports more than the others, so it may start last)."""
    import httpx

    gateway = GatewaySettings(**settings.model_dump())
    host = "127.0.0.1" if gateway.gateway_host in ("0.0.0.0", "") else gateway.gateway_host
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://{host}:{gateway.gateway_port}/healthz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    print(f"signoff: the gateway did not answer within {timeout:.0f}s; see {settings.data_dir / 'logs'}")
    return False


def demo(settings: Settings) -> int:
    supervisor = Supervisor(settings)
    name, password = demo_login(settings)
    print(f"signoff: starting the four services and the gateway (logs in {supervisor.log_dir})…", flush=True)
    supervisor.start()
    try:
        code = asyncio.run(_drive_demo(settings))
        if code != 0:
            return code
        print()
        wait_for_gateway(settings)
        for line in gateway_lines(settings, name, password):
            print(line)
        print("\nThe services keep running. In another terminal, with the same environment:")
        print("  .venv/bin/signoff session start 'Publish the notes for 1.3' --wait   # prints the session id")
        print("  .venv/bin/signoff pending                                           # shows the approval card")
        print("  .venv/bin/signoff approve apr_…   (shows the card, asks y/N; or: signoff deny apr_… --reason '…')")
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
        person = keyring.os_user()  # whom `signoff setup` registered the CLI's channel for
        text = "Please publish the release notes for version 1.2."
        await console.send(StartTurn(session_id=session_id, text=text, started_by=person))
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
                            # What `signoff approve` does once a person has read this card and said yes.
                            say(f"approving {event.request_id}")
                            await console.respond(event.request_id, "approve", "", "", person)
                        elif event.type == "approval.decided":
                            say(f"decision committed: {event.decision} by {visible(event.responder, FIELD_CHARS)}")
                        elif event.type == "tool.closed":
                            closure = await console.ledger.closure(event.call_id)
                            # Published from the same transaction that wrote the closure: it is there.
                            assert closure is not None
                            if event.kind == "output":
                                said = json_inline((closure.output or {}).get("value"))
                                say(f"tool ran once and closed as output: {said}")
                            else:  # what went wrong, not a bare null
                                said = visible(closure.reason_text or closure.reason_code or "", TEXT_CHARS)
                                say(f"tool closed as {event.kind}: {said}")
                        elif event.type == "turn.completed":
                            say(f"final answer: {visible(event.text, TEXT_CHARS)}")
                            return 0
                        elif event.type in ("turn.failed", "message.rejected"):
                            say(f"{event.type}: {visible(event.reason_text, TEXT_CHARS)}")
                            return 1
        except TimeoutError:
            print(
                f"signoff: no answer within {timeout:.0f}s; see the logs in {settings.data_dir / 'logs'}",
                file=sys.stderr,
            )
            return 1
    return 1
