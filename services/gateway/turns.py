"""Starting a turn through the gateway: the caller may name it (`Idempotency-Key`), and
the answer is the ledger's verdict on the start, once it has judged it: the turn it
started, the turn the same key started before (nothing new starts), or a problem
naming why it refused (a busy session: 409, naming the turn that keeps it busy).

The ledger enforces the key (a turn's key is unique in its session: `turns`), not the
gateway: the gateway only picks the session a new keyed start opens, the same for the
same person and key, so that a repeat reaches the turn it repeats."""

from __future__ import annotations

import hashlib
from typing import Any

from shared.messages import StartTurn, mint

from .problems import Problem

# Refusals of a start that say the person may not do this (403); a reused key is 422
# (the IETF Idempotency-Key draft); any other is a conflict with the session's state (409).
FORBIDDEN = {"wrong_principal", "unauthorized_sender", "starter_unknown"}


def session_of_key(principal: str, key: str) -> str:
    """The session a keyed start of a new session opens: the same for the same person and key."""
    digest = hashlib.sha256(b"signoff-gateway-session\0" + principal.encode() + b"\0" + key.encode()).hexdigest()
    return f"ses_{digest[:32]}"


async def start(gateway: Any, turn: StartTurn) -> tuple[str | None, bool]:
    """Send the start and wait (up to the decision wait) for the ledger's verdict on it:
    (the turn's id, whether a repeat answered it), or (None, False) when the ledger has
    not judged it in time. A refusal raises its Problem."""
    wait = gateway.settings.gateway_decision_wait_seconds
    verdict = await gateway.watch.verdict(turn.session_id, turn.message_id, wait, lambda: gateway.send(turn))
    if verdict is None:
        return None, False
    if verdict.kind in ("turn.started", "turn.repeated"):
        return verdict.subject, verdict.kind == "turn.repeated"
    detail = verdict.detail or {}
    code = str(detail.get("reason_code", "refused"))
    status = 422 if code == "idempotency_key_reused" else 403 if code in FORBIDDEN else 409
    problem = Problem(status, code.replace("_", "-"), "Refused by the ledger", str(detail.get("reason_text", "")))
    problem.extra["reason_code"] = code
    if code == "session_busy":
        busy = await gateway.ledger.record.latest_turn(turn.session_id)
        if busy is not None and busy.status == "running":
            problem.extra["turn_id"] = busy.id
    raise problem


def new_session_id(principal: str, key: str | None) -> str:
    return session_of_key(principal, key) if key is not None else mint("ses")
