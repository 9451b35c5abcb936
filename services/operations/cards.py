"""What a person sees in the terminal: an approval card, its escalation, a turn's outcome
and an ended call's story, the question before a decision. Pure: text in, lines out;
every string shown through `visible` (shared/on_screen.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from shared import audit
from shared.ledger.tables import ApprovalRequest, Turn
from shared.on_screen import FIELD_CHARS, TARGET_CHARS, TEXT_CHARS, card_face, card_rows, visible
from shared.redaction import redact_text


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
    face = card_face(request_id, card, digest)
    notes = []
    if len(face.arguments) > 8:  # the top of the card may have scrolled away: say again what it is about
        notes.append(("that is", f"{face.tool} on {face.target}"))
    if escalated is not None:
        notes.append(("escalated", escalation_line(*escalated)))
    *body, digest_line = card_rows(face, notes=notes)
    return [
        f"  ┌ approval needed: {face.label}  ({face.tool}, effect: {face.effect})",
        *(f"  │ {line}" for line in body),
        f"  └ {digest_line}",
    ]


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
