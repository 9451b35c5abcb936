"""Classic queues (the setting `queue_type`, docs/benchmarks.md "Queue types"):
the broker counts no deliveries there, so the consumer counts a message's failed
deliveries itself and parks it at the delivery limit, as a quorum queue would."""

from shared.messages import StartTurn, mint
from shared.provisioning import management_api
from tests.harness import SERVICES, next_event, start_and_wait_for_approval


async def test_on_classic_queues_a_round_trip_completes(pg_deployment):
    pg_deployment.extra_env.update(SIGNOFF_QUEUE_TYPE="classic")
    pg_deployment.start()
    session_id = mint("ses")
    async with pg_deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "turn.completed", timeout=30)
    async with management_api(pg_deployment.settings) as api:
        queue = (await api.get(f"/queues/%2F/{pg_deployment.namespace}.ledger.steps")).raise_for_status().json()
    assert queue["type"] == "classic"


async def test_on_classic_queues_a_message_that_fails_on_every_delivery_is_parked_at_the_delivery_limit(
    pg_deployment, sink
):
    pg_deployment.extra_env.update(
        SINK_URL=sink.url, SINK_TOKEN="t", SIGNOFF_DELIVERY_LIMIT="2", SIGNOFF_QUEUE_TYPE="classic"
    )
    pg_deployment.start(*(s for s in SERVICES if s != "approval-ledger"))
    pg_deployment.start("approval-ledger", faults="ledger.before_commit@step.completed:raise")
    session_id = mint("ses")
    async with pg_deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="go"))
        failed = await next_event(events, "turn.failed", timeout=30)
    assert failed.reason_code == "message_parked"
    assert failed.reason_text.startswith("step.completed msg_") and "(delivery_limit)" in failed.reason_text
