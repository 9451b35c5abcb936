"""`signoff dead-letters [replay|drop]`: the messages parked on the dead-letter queue,
sent back as the identity their type names or dropped, each action recorded in the ledger."""

from __future__ import annotations

import sys
from contextlib import AsyncExitStack
from typing import Literal

import aio_pika

from services.operations.cards import shown_time
from services.operations.console import Console
from shared import faults
from shared.dead_letters import ParkedMessage, proven_sender
from shared.dead_letters import describe as describe_parked
from shared.ledger import dead_letter_actions
from shared.on_screen import FIELD_CHARS, visible
from shared.redaction import redact_text
from shared.settings import Settings
from shared.topology import OPERATOR, Topology


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
    await by.bus.publish(
        raw.body,
        exchange=by.topology.inbound_exchange(parked.message_type).name,
        routing_key=parked.message_type,
        message_id=parked.message_id,
        content_type="application/json",
        user_id=by.user,
        headers={"x-signoff-replayed-by": operator},
        # A replay that no queue would take is an error the operator sees, not a silent drop.
        mandatory=True,
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
