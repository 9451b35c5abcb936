"""The cards an adapter catches up on when it starts: every request still pending in the
ledger, as the event that announced it, read with the console's role (what `signoff
pending` reads); and how a card it showed was closed while it was down."""

from __future__ import annotations

from dataclasses import dataclass

from shared.ledger.console_reads import ConsoleLedger
from shared.ledger.tables import ApprovalRequest
from shared.messages import ApprovalCard, ApprovalRequested


@dataclass(frozen=True)
class PendingCard:
    event: ApprovalRequested
    approvers: list[str]
    escalated_to: list[str] | None


def announced(request: ApprovalRequest) -> ApprovalRequested:
    """The request as its `approval.requested` said it (without the one-time token, which
    only the event carried: these adapters answer as the person, never with the token)."""
    return ApprovalRequested(
        session_id=request.session_id,
        request_id=request.id,
        call_id=request.call_id,
        step_id=request.step_id or "unknown",
        card=ApprovalCard.model_validate(request.card),
        args_digest=request.args_digest,
        pending_request_ids=[request.id],
        approvals_required=request.approvals_required or 1,
        expires_at=request.expires_at,
        turn_id=request.turn_id,
    )


async def pending_cards(ledger: ConsoleLedger, page: int = 200) -> list[PendingCard]:
    """Every pending request, the first to expire first."""
    found: list[ApprovalRequest] = []
    while True:
        total, rows = await ledger.pending(skip=len(found), limit=page)
        found += rows
        if not rows or len(found) >= total:
            break
    approvers = await ledger.approvers([r.id for r in found])
    return [
        PendingCard(announced(r), approvers.get(r.id, []), r.escalated_to if r.escalated_at else None) for r in found
    ]


async def outcome(ledger: ConsoleLedger, request_id: str) -> str | None:
    """How a request was closed, in a few words ("approved by alice"); None: still pending."""
    request = await ledger.request(request_id)
    if request is None or request.status == "pending":
        return None
    decision = await ledger.decision(request_id)
    if decision is not None:
        said = f"{'Approved' if decision.decision == 'approve' else 'Denied'} by {decision.responder}"
        return said + (f": {decision.reason}" if decision.reason else "")
    return {"expired": "Expired: nobody decided in time", "cancelled": "Cancelled"}.get(
        request.status, f"Closed: {request.status}"
    )
