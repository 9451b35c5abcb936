"""One approval, end to end, on the real services (invariants 1, 2, 6, 9)."""

import pytest
from sqlalchemy import func, select

from shared.ledger.tables import Closure, Decision, ProviderAttemptRow, Session
from shared.redaction import REDACTED
from shared.messages import StartTurn, mint
from tests.harness import next_event


# cold: each service a new interpreter (`signoff run <service>`), as a container
# starts it; warm: forked from a preloaded one, as `signoff up` and the other tests start it.
@pytest.mark.parametrize("start", ["warm", "cold"])
async def test_an_approved_call_runs_once_and_the_turn_completes(deployment, sink, start):
    deployment.cold = start == "cold"
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.extra_env["SINK_TOKEN"] = "tok-123"
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="post hello"))

        requested = await next_event(events, "approval.requested")
        assert requested.request_id.startswith("apr_") and len(requested.request_id) >= 4 + 32
        card = requested.card
        assert card.tool == "post_to_sink" and card.label == "Post a message to the sink"
        assert card.arguments == {"message": "hello from signoff", "api_token": REDACTED}
        # The executor fills in its own SINK_URL: the card names the variable, never the ledger's value.
        assert card.target == "POST ${env:SINK_URL}/sink" and card.hidden == ["api_token"]
        assert requested.pending_request_ids == [requested.request_id]  # the session waits on it (invariant 5)
        assert sink.counts["/sink"] == 0

        await console.respond(requested.request_id, "approve", "", "", "tester")
        completed = await next_event(events, "turn.completed")
        assert completed.text == "Posted."

    assert sink.counts["/sink"] == 1
    sent = sink.requests[0]
    assert sent["headers"]["Authorization"] == "Bearer tok-123"
    assert sent["headers"]["Idempotency-Key"].startswith("idk_")
    async with deployment.ledger() as ledger, ledger() as db:
        assert (await db.get(Session, session_id)).status == "idle"
        closures = (await db.scalars(select(Closure).where(Closure.session_id == session_id))).all()
        assert [c.kind for c in closures] == ["output"]
        assert await db.scalar(select(func.count()).select_from(Decision)) == 1
        attempts = (await db.scalars(select(ProviderAttemptRow).where(ProviderAttemptRow.session_id == session_id))).all()
        assert [a.status for a in attempts] == ["completed", "completed"]
