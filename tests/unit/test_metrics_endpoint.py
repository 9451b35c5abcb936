"""Every service's metrics port: /healthz while the process lives, /readyz only when each
readiness check passes (the body names the failing one), /metrics in Prometheus's text
format with `signoff_ready` as /readyz says; ledger counts move only after a commit."""

import asyncio

import httpx

from shared.observability import (
    MESSAGES_REJECTED,
    Health,
    bounded,
    counting_on_commit,
    tool_label,
    when_committed,
)
from tests.harness import free_port


async def test_the_port_answers_health_readiness_and_metrics():
    broker_up = True

    async def broker() -> bool:
        return broker_up

    async def database() -> bool:
        raise ConnectionError("away")

    health = Health("test-service")
    health.add("broker", broker)
    port = free_port()
    await health.start("127.0.0.1", port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/readyz")).status_code == 200
            health.add("database", database)
            answer = await http.get("/readyz")
            assert answer.status_code == 503
            assert "database: not ready" in answer.text and "broker: ok" in answer.text
            metrics = await http.get("/metrics")
            assert metrics.status_code == 200
            assert "signoff_ready 0.0" in metrics.text
            assert "process_cpu_seconds_total" in metrics.text
            del health.checks["database"]
            assert "signoff_ready 1.0" in (await http.get("/metrics")).text
            assert (await http.get("/nothing")).status_code == 404
    finally:
        await health.stop()


async def test_a_slow_check_counts_as_not_ready_instead_of_hanging_the_probe():
    async def hangs() -> bool:
        await asyncio.sleep(60)
        return True

    health = Health("slow")
    health.CHECK_TIMEOUT = 0.1
    health.add("database", hangs)
    assert await health.readiness() == {"database": False}


def _rejected(reason: str) -> float:
    return MESSAGES_REJECTED.labels("approval.respond", reason)._value.get()


def test_ledger_counts_move_only_once_their_transaction_committed():
    before = _rejected("test_reason")
    with counting_on_commit() as committed:
        when_committed(MESSAGES_REJECTED.labels("approval.respond", "test_reason").inc)
        assert _rejected("test_reason") == before
        committed()
    assert _rejected("test_reason") == before + 1
    with counting_on_commit():  # rolled back: never committed
        when_committed(MESSAGES_REJECTED.labels("approval.respond", "test_reason").inc)
    assert _rejected("test_reason") == before + 1


def test_labels_from_input_stay_bounded():
    assert tool_label("a tool the model made up") == "unknown"
    assert bounded("turn.start", {"turn.start"}) == "turn.start"
    assert bounded("ses_123 anything", {"turn.start"}) == "other"
    assert bounded("x" * 200) == "other"
    assert bounded("delivery_limit") == "delivery_limit"
