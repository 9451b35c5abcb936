"""What the gateway reads and shows: the ledger's committed record, through a role that may
only read (its reads: shared/ledger/gateway_reads.py, shared/ledger/event_stream.py),
and who may see what of it. Nothing here writes; nothing is kept between requests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.catalogue import ToolCatalogue
from shared.ledger import pages
from shared.ledger.event_stream import Cursor
from shared.ledger.gateway_reads import GatewayReads
from shared.ledger.tables import ApprovalRequest, AuditEntry, Grant, Turn
from shared.messages import now
from shared.redaction import redact_text, redact_value

from .users import User


@dataclass(frozen=True)
class Policy:
    # None: anyone a registered channel may assert.
    approvers: frozenset[str] | None
    approvals_required: int
    starter_may_approve: bool


def policy(catalogue: ToolCatalogue, tool: str, escalated: bool) -> Policy:
    """Who may approve a tool's calls, as the ledger judges it (the catalogue now, its
    groups resolved; an escalated request's escalation group too)."""
    spec = catalogue.get(tool)
    if spec is None:
        return Policy(frozenset(), 1, True)
    approvers = catalogue.approvers_of(spec)
    if escalated and spec.escalation is not None and approvers is not None:
        approvers = approvers | catalogue.principals(spec.escalation.to)
    return Policy(approvers, spec.approvals_required, spec.starter_may_approve)


def may_approve(catalogue: ToolCatalogue, user: User, tool: str, escalated: bool) -> bool:
    approvers = policy(catalogue, tool, escalated).approvers
    return approvers is None or user.name in approvers


class Ledger:
    """The ledger as the gateway shows it: the reads (`GatewayReads`), and who may see what."""

    def __init__(self, record: GatewayReads, catalogue: ToolCatalogue) -> None:
        self.record = record
        self.catalogue = catalogue

    async def reachable(self) -> bool:
        return await self.record.reachable()

    # --- who may see what -------------------------------------------------------

    async def starters(self, session_id: str) -> set[str]:
        """Who started the session or any of its turns."""
        return await self.record.starters(session_id)

    async def may_see_session(self, user: User, session_id: str) -> bool:
        return user.operator or user.name in await self.starters(session_id)

    async def may_see_request(self, user: User, request: ApprovalRequest) -> bool:
        """Operators see every request; others those they may approve and those of sessions they started."""
        if user.operator or may_approve(self.catalogue, user, request.card.get("tool", ""), _escalated(request)):
            return True
        return user.name in await self.starters(request.session_id)

    # --- requests ---------------------------------------------------------------

    async def request(self, request_id: str) -> ApprovalRequest | None:
        return await self.record.request(request_id)

    async def requests(
        self,
        user: User,
        status: str | None,
        tool: str | None,
        session_id: str | None,
        limit: int,
        after: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of the cards `user` may see, in (created_at, id) order, and the cursor of
        the next page (None: the last). Who may see what is a WHERE clause of the read
        (`GatewayReads.requests_page`: the same rule as `may_see_request`, which still
        checks each card), so a page reads `limit` + 1 rows, never the whole backlog.
        `after`: a cursor given with an earlier page (`pages.BadCursor` if it
        is not one)."""
        viewer = None if user.operator else user.name
        found = await self.record.requests_page(self.catalogue, viewer, status, tool, session_id, limit, after)
        shown = []
        for request in found[:limit]:
            if await self.may_see_request(user, request):
                shown.append(await self.card(request))
        last = found[limit - 1] if len(found) > limit else None
        return shown, None if last is None else pages.cursor(last.created_at, last.id)

    async def card(self, request: ApprovalRequest) -> dict[str, Any]:
        """A request as the card shows it: redacted arguments with the hidden fields named,
        the digest to approve, who may approve and how many of them have."""
        card = request.card
        rule = policy(self.catalogue, card.get("tool", ""), _escalated(request))
        approvals = await self.record.approvals(request.id)
        return {
            "id": request.id,
            "session_id": request.session_id,
            "status": request.status,
            "tool": card.get("tool", ""),
            "label": card.get("label", ""),
            "description": card.get("description", ""),
            "effect": card.get("effect", ""),
            "target": redact_text(str(card.get("target", ""))),
            "arguments": redact_value(card.get("arguments", {})),
            "hidden": list(card.get("hidden", [])),
            "args_digest": request.args_digest,
            "created_at": request.created_at,
            "expires_at": request.expires_at,
            "approvers": None if rule.approvers is None else sorted(rule.approvers),
            "approvals": approvals,
            # What the tool's rule decided for these arguments when the request was made
            # (requests made before rules: the tool's count), and why.
            "approvals_required": rule.approvals_required
            if request.approvals_required is None
            else request.approvals_required,
            "reason": request.reason,
            # Set once a person changed the arguments before approving: who, and how.
            "edited_by": card.get("edited_by"),
            "edit": card.get("edit"),
            # A call a program filed (the intake): who filed it, for which origin, and what it said.
            "filed": card.get("filed"),
            "starter_may_approve": rule.starter_may_approve,
            # Whether "approve and remember" may be offered (the ledger still judges it).
            "rememberable": self._rememberable(card.get("tool", "")),
        }

    def _rememberable(self, tool: str) -> bool:
        spec = self.catalogue.get(tool)
        return spec is not None and spec.may_be_remembered

    # --- grants (approve and remember) ---------------------------------------------

    async def grants(self, session_id: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
        """Grants as listed: a session's (or every session's, newest last), live or not."""
        return [shown_grant(grant) for grant in await self.record.grants(session_id, limit)]

    async def grant(self, grant_id: str) -> Grant | None:
        return await self.record.grant(grant_id)

    # --- sessions ---------------------------------------------------------------

    async def session(self, session_id: str) -> dict[str, Any] | None:
        found = await self.record.session(session_id)
        if found is None:
            return None
        session = found.session
        last = shown_turn(found.last_turn)
        return {
            "id": session.id,
            "status": session.status,
            # An idle session whose last turn failed or was cancelled says so, and why.
            "status_reason": session.status_reason or turn_reason(last),
            "last_turn": last,
            "started_by": session.started_by,
            "created_at": session.created_at,
            "updated_at": session.updated_at,
            "transcript": [_shown_entry(entry) for entry in found.transcript],
            "pending_requests": [await self.card(r) for r in found.pending],
            "grants": await self.grants(session_id),
            "usage": {
                "input_tokens": found.input_tokens,
                "output_tokens": found.output_tokens,
                "provider_attempts": found.provider_attempts,
            },
        }

    # --- verdicts -----------------------------------------------------------------

    async def verdict(self, session_id: str, message_id: str) -> AuditEntry | None:
        """The ledger's verdict on the response a message carried: its audit entry
        (`response.accepted` or `response.rejected`), once committed."""
        return await self.record.verdict(session_id, message_id)

    async def verdicts(self, waiting: Sequence[tuple[str, str]]) -> Sequence[AuditEntry]:
        """The verdicts committed so far on any of these (session id, message id): one
        query for every decision a gateway process is waiting on (watch.py)."""
        return await self.record.verdicts(waiting)

    # --- events -------------------------------------------------------------------

    async def newest_event(self) -> Cursor:
        """The cursor of "now": the newest event every transaction before it has ended
        (shared/ledger/event_stream.py, the horizon)."""
        return await self.record.newest_event()

    async def events_after(self, cursor: Cursor, limit: int = 200) -> Sequence[Any]:
        """The next committed events after `cursor` = (txid, id), in that order
        (shared/ledger/event_stream.py: why this order, and the horizon)."""
        return await self.record.events_after(cursor, limit)


def shown_turn(turn: Turn | None) -> dict[str, Any] | None:
    """A session's last turn as read: how it ended, when, by whom and why (the reason's
    text as its `turn.failed` or `turn.cancelled` said it, redacted)."""
    if turn is None:
        return None
    return {
        "id": turn.id,
        "status": turn.status,
        "started_by": turn.started_by,
        "started_at": turn.created_at,
        "ended_at": turn.completed_at,
        "reason_code": turn.reason_code,
        "reason": None if turn.reason_text is None else redact_text(turn.reason_text),
        "ended_by": turn.ended_by,
    }


def turn_reason(turn: dict[str, Any] | None) -> str | None:
    """One line of why the last turn did not complete (None: it runs, or it completed)."""
    if turn is None or turn["status"] not in ("failed", "cancelled"):
        return None
    by = f" by {turn['ended_by']}" if turn["ended_by"] else ""
    code = f" ({turn['reason_code']})" if turn["reason_code"] else ""
    why = f": {turn['reason']}" if turn["reason"] else ""
    return f"last turn {turn['status']}{by}{code}{why}"


def shown_grant(grant: Grant) -> dict[str, Any]:
    """A grant as listed: its terms, who gave it and when, and whether it still covers calls."""
    at = now()
    live = grant.revoked_at is None and (grant.expires_at is None or at < grant.expires_at)
    return {
        "id": grant.id,
        "session_id": grant.session_id,
        "request_id": grant.request_id,
        "granted_by": grant.granted_by,
        "tool": grant.tool,
        "tool_version": grant.tool_version,
        "target": None if grant.target is None else redact_text(grant.target),
        "approvals_required": grant.approvals_required,
        "granted_at": grant.granted_at,
        "expires_at": grant.expires_at,
        "revoked_at": grant.revoked_at,
        "revoked_by": grant.revoked_by,
        "live": live,
    }


def _escalated(request: ApprovalRequest) -> bool:
    return request.escalated_at is not None


def _shown_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A transcript entry as the card shows it: credentials redacted."""
    return {
        "role": entry.get("role", ""),
        "text": redact_text(str(entry.get("text", ""))),
        "tool_calls": [
            {"call_id": c.get("call_id"), "name": c.get("name"), "arguments": redact_value(c.get("arguments", {}))}
            for c in entry.get("tool_calls", [])
        ],
        "call_id": entry.get("call_id"),
        "closure": entry.get("closure"),
    }
