"""The one read the executor makes of the ledger's rows (docs/design.md, "Services and
who owns what"): a call's tool and arguments as stored, its approval request, that
request's decision and the ledger's seal over the call, or the grant that authorized
it with no card (its row, as the ledger sealed it). The ledger owns and writes
`tool_calls`, `approval_requests` and `decisions`; the executor reads them only here,
to check a `tool.execute` against the record before it runs anything
(services/tool_executor/claims.py)."""

from __future__ import annotations

from sqlalchemy import bindparam, select

from shared.ledger.tables import TABLES

TOOL_CALLS, APPROVAL_REQUESTS, DECISIONS = TABLES["tool_calls"], TABLES["approval_requests"], TABLES["decisions"]
GRANTS = TABLES["grants"]
CALL_ON_RECORD = (
    select(
        TOOL_CALLS.c.tool,
        TOOL_CALLS.c.arguments,
        APPROVAL_REQUESTS.c.id,
        DECISIONS.c.decision,
        APPROVAL_REQUESTS.c.call_seal,
        TOOL_CALLS.c.session_id,
        TOOL_CALLS.c.created_at,
        TOOL_CALLS.c.grant_id,
        GRANTS.c.id.label("grant_row_id"),
        GRANTS.c.session_id.label("grant_session_id"),
        GRANTS.c.tool.label("grant_tool"),
        GRANTS.c.tool_version,
        GRANTS.c.target,
        GRANTS.c.approvals_required,
        GRANTS.c.expires_at,
        GRANTS.c.revoked_at,
        GRANTS.c.grant_seal,
    )
    .select_from(
        TOOL_CALLS.outerjoin(APPROVAL_REQUESTS, APPROVAL_REQUESTS.c.call_id == TOOL_CALLS.c.id)
        .outerjoin(DECISIONS, DECISIONS.c.request_id == APPROVAL_REQUESTS.c.id)
        .outerjoin(GRANTS, GRANTS.c.id == TOOL_CALLS.c.grant_id)
    )
    .where(TOOL_CALLS.c.id == bindparam("call_id"))
)
