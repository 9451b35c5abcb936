"""The audit log commits with the transition it describes, or not at all: a ledger
SIGKILLed before the commit of an approval leaves no entry of it, and the
redelivered approval is on record once, in an intact chain (docs/design.md,
"The audit log"). On both stores."""

import asyncio
from collections import Counter

from shared.ledger.tables import AuditEntry
from shared.messages import mint
from tests.harness import next_event, rows, start_and_wait_for_approval
from tests.integration.test_audit_log import verified


async def test_a_ledger_killed_before_committing_an_approval_leaves_no_entry_of_it_and_the_redelivery_one(
    deployment, sink
):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start_with_fault("approval-ledger", "ledger.before_commit@approval.respond")
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id, "post hello")
        before = Counter(e.kind for e in await rows(deployment, AuditEntry, session_id=session_id))
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await asyncio.to_thread(deployment.wait_exit, "approval-ledger")
        assert Counter(e.kind for e in await rows(deployment, AuditEntry, session_id=session_id)) == before
        deployment.start("approval-ledger")
        await next_event(events, "turn.completed")
    kinds = Counter(e.kind for e in await rows(deployment, AuditEntry, session_id=session_id))
    assert kinds["response.accepted"] == kinds["approval.decided"] == kinds["execution.finished"] == 1
    assert "intact" in await verified(deployment)
