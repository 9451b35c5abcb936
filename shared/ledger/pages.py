"""Pages of approval requests, for every list a person or a program reads
(`signoff pending`, the gateway's `GET /v1/requests` and its inbox): a backlog of
thousands is read a page at a time, never whole.

- `may_approve_condition`: who may approve, as a WHERE clause on the request's tool
  (migration 0015), resolved from the catalogue as the ledger judges it (its
  approvers, its groups; an escalated request's escalation group too; a tool a caller
  declared, its origin's `unknown_tools` approvers).
- `cursor`/`after`: keyset paging by (created_at, id), opaque to the client: a page
  starts after the last request of the one before, so requests decided meanwhile
  shift nothing and nothing is shown twice.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from sqlalchemy import and_, false, or_, tuple_

from shared.catalogue import DECLARED_SEPARATOR, ToolCatalogue
from shared.ledger.tables import ApprovalRequest


def may_approve_condition(catalogue: ToolCatalogue, principal: str) -> Any:
    """The requests `principal` may approve (a tool's `starter_may_approve` aside: that is
    judged per session, when they answer)."""
    always, escalated = [], []
    for spec in catalogue.tools:
        approvers = catalogue.approvers_of(spec)
        if approvers is None or principal in approvers:
            always.append(spec.name)
        elif spec.escalation is not None and principal in catalogue.principals(spec.escalation.to):
            escalated.append(spec.name)
    conditions: list[Any] = []
    if always:
        conditions.append(ApprovalRequest.tool.in_(always))
    # A tool a caller declared (`<origin>/<tool>`) has its origin's `unknown_tools` approvers.
    for origin in catalogue.origins:
        declared = catalogue.declared_by_caller(origin, "tool")
        if declared is not None:
            approvers = catalogue.approvers_of(declared)
            if approvers is None or principal in approvers:
                conditions.append(ApprovalRequest.tool.startswith(f"{origin}{DECLARED_SEPARATOR}", autoescape=True))
    if escalated:
        conditions.append(and_(ApprovalRequest.escalated_at.is_not(None), ApprovalRequest.tool.in_(escalated)))
    return or_(*conditions) if conditions else false()


def cursor(created_at: datetime, request_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), request_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class BadCursor(ValueError):
    pass


def after(token: str) -> Any:
    """The requests after the one `token` names, in (created_at, id) order."""
    try:
        created_at, request_id = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        moment = datetime.fromisoformat(created_at)
        if not isinstance(request_id, str) or moment.tzinfo is None:
            raise ValueError(token)
    except (ValueError, TypeError) as error:
        raise BadCursor("not a cursor this gateway gave") from error
    return tuple_(ApprovalRequest.created_at, ApprovalRequest.id) > tuple_(moment, request_id)
