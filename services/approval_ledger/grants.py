"""Approve and remember, as the ledger records it: the grant a
deciding approval asked for, a later call it covers, and its revocation. The rules
are pure (`decision_rules.may_remember`, `grant_covering`; `domain.judge_remember`,
`judge_revoker`); this module hands their outcome to the store, like `records`.

A grant is a row (`grants`) sealed by the ledger (`authorization.seal_grant`) over
its terms. A call a grant covers runs with no card: its row names the grant, and the
authorization the executor checks has the basis `grant` and the grant's id; the
executor runs it only if the grant's row is sealed, matches the call, and had neither
expired nor been revoked when the call was decided (services/tool_executor/claims.py
`grant_allows`). Every step is in the audit log: `grant.created`, `grant.used`,
`grant.revoked`.
"""

from __future__ import annotations

from shared.authorization import GrantTerms
from shared.catalogue import ToolCatalogue, ToolSpec
from shared.messages import RespondToApproval, RevokeGrant, mint

from . import decision_rules, domain, records
from .authority import Authority
from .store import LedgerStore, SessionState


def remembered(
    store: LedgerStore,
    session: SessionState,
    authority: Authority,
    spec: ToolSpec,
    request: domain.RequestOnRecord,
    response: RespondToApproval,
    *,
    approvals_required: int,
) -> str:
    """Record the grant the approval deciding `request` asked for (judged before by
    `domain.judge_remember`): from now, until it expires or is revoked, for this
    session, tool and version, the card's target or any, and calls needing no more
    than `approvals_required` approvers. Its id."""
    asked = response.remember
    assert asked is not None
    terms = GrantTerms(
        grant_id=mint("grt"),
        session_id=session.id,
        tool=request.tool,
        tool_version=spec.version,
        target=asked.target,
        approvals_required=approvals_required,
        expires_at=decision_rules.grant_expiry(store.now, asked.hours),
    )
    store.add(
        "grants",
        {
            "id": terms.grant_id,
            "session_id": terms.session_id,
            "request_id": request.id,
            "granted_by": response.responder,
            "tool": terms.tool,
            "tool_version": terms.tool_version,
            "target": terms.target,
            "approvals_required": terms.approvals_required,
            "granted_at": store.now,
            "expires_at": terms.expires_at,
            "revoked_at": None,
            "revoked_by": None,
            "grant_seal": authority.seal_grant(terms),
        },
    )
    store.audit(
        session,
        session.id,
        "grant.created",
        subject=terms.grant_id,
        actor=response.responder,
        message_id=response.message_id,
        request_id=request.id,
        tool=terms.tool,
        tool_version=terms.tool_version,
        target=terms.target,
        expires_at=None if terms.expires_at is None else terms.expires_at.isoformat(),
        approvals_required=terms.approvals_required,
    )
    return terms.grant_id


def used(
    store: LedgerStore, session: SessionState, call: domain.Call, grant: decision_rules.Grant, cause_id: str | None
) -> None:
    """A call the grant covers runs with no card: its row names the grant, and the audit log says whose it was."""
    call.grant_id = grant.grant_id
    store.audit(
        session,
        session.id,
        "grant.used",
        subject=grant.grant_id,
        actor=grant.granted_by,
        message_id=cause_id,
        call_id=call.id,
        tool=call.tool,
        target=grant.target,
    )


async def revoke(
    store: LedgerStore, session: SessionState | None, command: RevokeGrant, catalogue: ToolCatalogue
) -> None:
    """Revoke a grant if the revoker may (`domain.judge_revoker`): every call decided
    after this transition asks a person again (`grant_covering` compares with
    `revoked_at`, and so does the executor)."""
    grant = await store.grant(command.grant_id) if session is not None else None
    if session is None:
        records.refusal(store, session, command, domain.NO_SUCH_SESSION)
        return
    policy = domain.approval_policy(catalogue, grant.tool) if grant is not None else domain.NOBODY
    starters = frozenset(s for s in (session.started_by,) if s)
    refused = domain.judge_revoker(command.revoked_by, grant, session.id, policy, starters, domain.operators(catalogue))
    if refused:
        records.refusal(store, session, command, refused)
        return
    assert grant is not None
    store.update("grants", grant.grant_id, revoked_at=store.now, revoked_by=command.revoked_by)
    store.audit(
        session,
        session.id,
        "grant.revoked",
        subject=grant.grant_id,
        actor=command.revoked_by,
        message_id=command.message_id,
        tool=grant.tool,
        target=grant.target,
        reason=command.reason,
    )
    session.updated_at = store.now
