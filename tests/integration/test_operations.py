"""What an operator watches, against a real Prometheus: it scrapes the four
services and RabbitMQ's per-queue metrics while a session goes through an approval,
another through a denial and a bad message is dead-lettered; the counters moved by
exactly what happened, the pending gauge rose and fell, every queue has its depth
series, and every expression of the alert rules and the dashboard evaluates."""

import asyncio
import json
import time
from urllib.parse import quote

import aio_pika
import httpx
import pytest
from sqlalchemy import func, select

from shared.ledger.tables import ProviderAttemptRow
from shared.messages import mint
from shared.topology import Topology
from tests.harness import SERVICES, free_port, next_event, start_and_wait_for_approval
from tests.prometheus import Prometheus, alert_expressions, as_prometheus_sees_it, dashboard_expressions
from tests.sink import HOOK_SECRET

JOBS = '{job=~"approval-ledger|publisher|model-step|tool-executor"}'


async def until(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await asyncio.sleep(0.3)
    raise AssertionError(f"{what} not seen within {timeout}s (last: {last!r})")


@pytest.fixture
def prometheus(pg_deployment, tmp_path):
    pg_deployment.metrics_ports = {service: free_port() for service in SERVICES}
    server = Prometheus(
        tmp_path / "prometheus",
        pg_deployment.namespace,
        {service: [port] for service, port in pg_deployment.metrics_ports.items()},
    )
    yield server
    server.stop()


async def test_prometheus_sees_an_approval_a_denial_and_a_dead_letter(pg_deployment, prometheus, sink, tmp_path):
    deployment = pg_deployment
    deployment.extra_env["SINK_URL"] = sink.url
    # One hook that answers, one that nobody answers (a closed port).
    hooks = [
        {"name": "audit", "url": f"{sink.url}/hook", "events": ["turn.completed"], "secret": HOOK_SECRET},
        {"name": "broken", "url": "http://127.0.0.1:9/hook", "events": ["turn.completed"], "secret": HOOK_SECRET},
    ]
    (tmp_path / "hooks.yaml").write_text(json.dumps({"hooks": hooks}))
    deployment.extra_env["SIGNOFF_HOOKS_FILE"] = str(tmp_path / "hooks.yaml")
    deployment.start()
    ns = deployment.namespace
    await until(
        lambda: prometheus.value(f"count(signoff_ready{JOBS} == 1)") == 4, "all four services scraped and ready"
    )
    async with deployment.console() as console:
        # An approval: the pending gauge shows it waiting, then the person approves.
        approved_session = mint("ses")
        events, requested = await start_and_wait_for_approval(console, approved_session)
        await until(lambda: prometheus.value("max(signoff_approval_requests_pending)") == 1, "one approval waiting")
        waiting = prometheus.by("max by (tool) (signoff_approval_requests_pending)", "tool")
        assert {tool: n for tool, n in waiting.items() if n} == {"post_to_sink": 1}
        assert prometheus.value("max(signoff_approval_requests_oldest_pending_age_seconds)") >= 0
        assert prometheus.value("min(signoff_approval_requests_next_expiry_seconds)") > 3600
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "turn.completed")

        # A denial.
        denied_session = mint("ses")
        events, requested = await start_and_wait_for_approval(console, denied_session)
        await console.respond(requested.request_id, "deny", "not today", "", "tester")
        await next_event(events, "turn.completed")

        # A dead letter: a response that is not even JSON.
        exchange = await console.channel.get_exchange(f"{ns}.channels")
        await exchange.publish(aio_pika.Message(b"{not json", message_id="garbage-1"), routing_key="approval.respond")

    async with deployment.ledger() as ledger, ledger() as db:
        attempts = await db.scalar(select(func.count()).select_from(ProviderAttemptRow))

    def settled():
        seen = {
            "dead letters": prometheus.value('sum(signoff_dead_letters_total{reason="invalid"})'),
            "pending": prometheus.value("max(signoff_approval_requests_pending)"),
            "denied": prometheus.value('sum(signoff_tool_calls_closed_total{outcome="denied"})'),
        }
        return seen if seen == {"dead letters": 1, "pending": 0, "denied": 1} else (False, seen)

    async def settle():
        while isinstance(result := await asyncio.to_thread(settled), tuple):
            if time.monotonic() > deadline:
                raise AssertionError(f"not settled: {result[1]}")
            await asyncio.sleep(0.3)

    deadline = time.monotonic() + 30
    await settle()

    # Counters moved by exactly what happened.
    assert prometheus.value("sum(signoff_approval_requests_total)") == 2
    assert prometheus.by("sum by (outcome) (signoff_approval_decisions_total)", "outcome") == {
        "approved": 1,
        "denied": 1,
    }
    assert prometheus.value("sum(signoff_approval_decision_seconds_count)") == 2
    assert prometheus.by("sum by (outcome) (signoff_tool_calls_closed_total)", "outcome") == {"output": 1, "denied": 1}
    assert prometheus.by("sum by (outcome) (signoff_tool_executions_total)", "outcome") == {"output": 1}
    assert prometheus.value('sum(signoff_messages_dead_lettered_total{type="approval.respond",reason="invalid"})') == 1
    consumed = prometheus.by('sum by (type) (signoff_messages_consumed_total{outcome="handled"})', "type")
    assert consumed["approval.respond"] == 2 and consumed["turn.start"] == 2
    assert consumed["step.requested"] == consumed["step.completed"] == 4
    assert consumed["tool.execute"] == consumed["tool.completed"] == 1
    assert prometheus.value('sum(signoff_provider_attempts_total{status="completed"})') == attempts == 4
    assert prometheus.value('sum(signoff_messages_published_total{job="model-step"})') == 4
    assert prometheus.value("sum(signoff_relay_batch_size_count)") >= 1
    assert prometheus.value("max(signoff_publisher_leading)") == 1
    assert prometheus.value("sum(signoff_ledger_transaction_seconds_count)") >= 2 + 2 + 4 + 1

    # Hooks: the two turn.completed delivered to one, failing and waiting for the other.
    await until(
        lambda: (
            prometheus.by('sum by (hook) (signoff_hook_deliveries_total{outcome="delivered"})', "hook") == {"audit": 2}
            and prometheus.value('max(signoff_hook_deliveries_undelivered{hook="broken"})') == 2
        ),
        "hook deliveries counted",
    )
    assert prometheus.value('sum(signoff_hook_deliveries_total{hook="broken",outcome="failed"})') >= 2
    assert prometheus.value('max(signoff_hook_deliveries_oldest_undelivered_age_seconds{hook="broken"})') > 0
    assert prometheus.value('max(signoff_hook_deliveries_undelivered{hook="audit"})') is None

    # The pending gauge rose and fell (as the server recorded it, second by second).
    assert prometheus.value("max_over_time(max(signoff_approval_requests_pending)[5m:1s])") == 1
    assert prometheus.value("max(signoff_approval_requests_pending)") == 0

    # RabbitMQ's own series: depth, unacked and consumers of every queue of this deployment.
    queues = Topology(ns).all_queue_names()
    for family in ("rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked", "rabbitmq_queue_consumers"):
        seen = set(prometheus.by(f'{family}{{queue=~"{ns}\\\\..*"}}', "queue"))
        assert seen == set(queues), f"{family}: {sorted(set(queues) - seen)} missing"
    # RabbitMQ refreshes its queue metrics every few seconds.
    await until(
        lambda: prometheus.value(f'sum(rabbitmq_queue_messages{{queue="{ns}.dead-letters"}})') == 1,
        "the parked message in the dead-letter queue's depth",
    )
    # The consumers count as RabbitMQ sees them: the ledger's queues each have one.
    assert prometheus.value(f'rabbitmq_queue_consumers{{queue="{ns}.ledger.responses"}}') == 1

    # Every expression of the alerts and of the dashboard evaluates against this server.
    for expr in alert_expressions() + dashboard_expressions():
        prometheus.query(as_prometheus_sees_it(expr))
    # The rules loaded and evaluate without error, and the dead letter fired its alert.
    groups = prometheus.http.get("/api/v1/rules").json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert rules and all(rule["health"] == "ok" for rule in rules), [(r["name"], r.get("lastError")) for r in rules]

    def dead_letter_alert():
        alerts = prometheus.http.get("/api/v1/alerts").json()["data"]["alerts"]
        return [a["labels"] for a in alerts if a["labels"]["alertname"] == "SignoffDeadLetters"]

    fired = await until(dead_letter_alert, "SignoffDeadLetters firing")
    # Not even JSON: its type is unreadable (the consumer's own count knows its queue's type, above).
    assert fired[0]["reason"] == "invalid" and fired[0]["type"] == "unreadable"

    # Per-service CPU and memory from the process collectors, for every service.
    assert len(prometheus.query(f"process_resident_memory_bytes{JOBS}")) == 4


async def test_readyz_turns_unready_when_the_broker_connection_is_lost_and_ready_after(pg_deployment):
    """The service's own connections are closed through the management API (RabbitMQ
    itself stays up for everyone else): /readyz says so, then the service reconnects.

    Its vhost permissions are taken away first, so it cannot reconnect until they are
    given back: how quickly a robust connection comes back cannot hide the 503."""
    deployment = pg_deployment
    deployment.metrics_ports = {"tool-executor": free_port()}
    deployment.start("tool-executor")
    url = f"http://127.0.0.1:{deployment.metrics_ports['tool-executor']}"
    user = f"{deployment.namespace}.tool-executor"
    admin = httpx.Client(base_url="http://127.0.0.1:15672/api", auth=("guest", "guest"), timeout=10)
    permissions_path = f"/permissions/%2F/{quote(user, safe='')}"

    def readyz() -> int:
        try:
            return httpx.get(f"{url}/readyz", timeout=3).status_code
        except httpx.HTTPError:
            return 0

    await until(lambda: readyz() == 200, "ready")
    granted = admin.get(permissions_path)
    granted.raise_for_status()
    permissions = {key: granted.json()[key] for key in ("configure", "write", "read")}

    def close_its_connections() -> int:
        connections = [c["name"] for c in admin.get("/connections").json() if c.get("user") == user]
        for name in connections:
            closed = admin.delete(f"/connections/{quote(name, safe='')}", headers={"X-Reason": "test: connection lost"})
            assert closed.status_code in (204, 404), closed.text  # 404: it went away by itself meanwhile
        return len(connections)

    assert admin.delete(permissions_path).status_code == 204
    try:
        assert await until(close_its_connections, "the executor's connection listed") >= 1
        await until(lambda: readyz() == 503, "unready after its connection was closed")
        assert httpx.get(f"{url}/healthz", timeout=3).status_code == 200  # alive all the while
    finally:
        admin.put(permissions_path, json=permissions).raise_for_status()
    await until(lambda: readyz() == 200, "ready again after reconnecting", timeout=60)
    admin.close()


async def test_a_standby_publisher_is_ready_and_says_it_does_not_lead_until_it_takes_over(pg_deployment):
    deployment = pg_deployment
    deployment.metrics_ports = {"publisher": free_port(), "publisher#2": free_port()}
    deployment.start("publisher")
    deployment.start("publisher#2")  # blocks on the leader's lock: standing by
    urls = {name: f"http://127.0.0.1:{port}" for name, port in deployment.metrics_ports.items()}

    def leading(name: str) -> float | None:
        try:
            text = httpx.get(f"{urls[name]}/metrics", timeout=3).text
        except httpx.HTTPError:
            return None
        return next(
            float(line.split()[1]) for line in text.splitlines() if line.startswith("signoff_publisher_leading ")
        )

    for name in urls:
        assert httpx.get(f"{urls[name]}/readyz", timeout=3).status_code == 200, name
    assert (leading("publisher"), leading("publisher#2")) == (1.0, 0.0)
    deployment.kill("publisher")
    await until(lambda: leading("publisher#2") == 1.0, "the standby leading")
    assert httpx.get(f"{urls['publisher#2']}/readyz", timeout=3).status_code == 200
