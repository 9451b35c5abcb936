"""The one row the ledger writes in the executor's `execution_claims` (docs/design.md,
"Services and who owns what"): when a turn is cancelled or fails with a call the
executor has not taken yet, the ledger takes the call's claim itself, finished as
cancelled, so an executor that comes later finds it done and never runs it
(services/approval_ledger/store.py, `hold_back`). The claim's primary key decides who
was first. Everything else in that table is the executor's (services/tool_executor/claims.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

CANCELLED_BEFORE_RUNNING = "cancelled before it ran"
# The holder the executor sees on a claim the ledger took.
LEDGER_HOLDER = "ledger"


def held_back_claim(call_id: str, idempotency_key: str, at: datetime) -> dict[str, Any]:
    """The claim row: finished, with an error result, taken and finished now, never attempted."""
    return {
        "call_id": call_id,
        "idempotency_key": idempotency_key,
        "status": "finished",
        "holder": LEDGER_HOLDER,
        "lease_expires_at": at,
        "attempts": 0,
        "outcome": "error",
        "result": {"error": CANCELLED_BEFORE_RUNNING},
        "claimed_at": at,
        "finished_at": at,
    }
