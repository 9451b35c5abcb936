"""`signoff session start|show` and `signoff cancel`: a session's turns, started and
cancelled as the CLI's channel, and what the ledger holds of one."""

from __future__ import annotations

import asyncio
import sys

from services.operations.cards import escalation_line, print_request, turn_outcome
from services.operations.console import Console, check_may_assert
from shared.ledger.console_reads import ConsoleLedger
from shared.messages import EVENT, CancelTurn, StartTurn, mint
from shared.on_screen import FIELD_CHARS, TEXT_CHARS, json_inline, visible
from shared.redaction import redact_text, redact_value
from shared.settings import Settings


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
