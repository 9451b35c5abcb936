"""A turn cannot call the model provider forever: it ends at its bound of model
steps (SIGNOFF_TURN_MAX_STEPS) or provider tokens (SIGNOFF_TURN_MAX_TOKENS) as
`step_limit`, with an operator alert and a metric (docs/design.md, invariant 7)."""

import httpx
from sqlalchemy import func, select

from shared.ledger.tables import ProviderAttemptRow, Step, Turn
from shared.messages import StartTurn, mint
from tests.harness import free_port, next_event, rows


async def test_a_model_that_always_asks_for_an_unknown_tool_ends_its_turn_at_the_bound_with_that_many_provider_calls(
    deployment,
):
    deployment.extra_env.update(SIGNOFF_TURN_MAX_STEPS="5")
    deployment.metrics_ports = {"approval-ledger": free_port()}
    deployment.start()
    session_id = "loop-" + mint("ses")[4:]
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="do the impossible"))
        failed = await next_event(events, "turn.failed", timeout=60)
        alert = await next_event(events, "operator.alerted")
    assert failed.reason_code == "step_limit"
    assert failed.reason_text.startswith("The turn reached its bound of 5 model steps (5 model steps, 5 provider calls")
    assert "Trying again (5)." in failed.reason_text, "the model's last words are kept"
    assert (alert.reason_code, alert.turn_id, alert.call_id) == ("step_limit", failed.turn_id, None)
    async with deployment.ledger() as ledger, ledger() as db:
        steps = await db.scalar(select(func.count()).select_from(Step).where(Step.session_id == session_id))
        calls = await db.scalar(
            select(func.count()).select_from(ProviderAttemptRow).where(ProviderAttemptRow.session_id == session_id)
        )
    assert (steps, calls) == (5, 5), "exactly the bound's provider calls, and no step asked for after it"
    [turn] = await rows(deployment, Turn, session_id=session_id)
    assert turn.status == "failed"
    port = deployment.metrics_ports["approval-ledger"]
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert 'signoff_turns_bounded_total{bound="steps"} 1.0' in metrics
