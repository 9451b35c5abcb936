"""RabbitMQ restarted mid-flow: durable quorum queues and persistent, confirmed
messages lose nothing, and every service reconnects on its own (invariant 9).

The broker is shared by every test on this machine, so this test runs in its
own serial pass (`-m broker_restart`, after the parallel suite)."""

import asyncio
import subprocess

import httpx
import pytest

from shared.ledger.tables import Closure, Session
from shared.messages import mint
from tests.harness import SERVICES, eventually, free_port, rows, start_and_wait_for_approval

pytestmark = [
    pytest.mark.crash,
    pytest.mark.broker_restart,
    pytest.mark.slow(reason="the shared RabbitMQ is restarted and its queues recovered"),
]


def rabbitmqctl(*args: str) -> None:
    # stop_app/start_app stops the broker itself (every connection dropped,
    # every queue reloaded from disk) without the minute an Erlang VM restart costs.
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, timeout=120)


async def test_a_rabbitmq_restart_between_approval_and_execution_loses_nothing(pg_deployment, sink):
    deployment = pg_deployment
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.metrics_ports = {service: free_port() for service in SERVICES}
    deployment.start()

    def readiness() -> dict[str, int]:
        """Each service's /readyz answer (unready while the broker is gone)."""
        answers = {}
        for service, port in deployment.metrics_ports.items():
            try:
                answers[service] = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=3).status_code
            except httpx.HTTPError:
                answers[service] = 0
        return answers

    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        # Hold the tool call so the broker goes down with work in every stage.
        sink.hold_next("/sink")
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await asyncio.to_thread(sink.wait_held)
    assert set((await asyncio.to_thread(readiness)).values()) == {200}
    await asyncio.to_thread(rabbitmqctl, "stop_app")

    async def none_ready():
        return set((await asyncio.to_thread(readiness)).values()) == {503}

    await eventually(none_ready, timeout=30, interval=0.25)
    # The tool finishes while the broker is down: its report must wait, not vanish.
    sink.release()
    await asyncio.sleep(1)
    await asyncio.to_thread(rabbitmqctl, "start_app")
    await asyncio.to_thread(rabbitmqctl, "await_startup")

    async def finished():
        [session] = await rows(deployment, Session, id=session_id)
        return session.status == "idle"

    await eventually(finished, timeout=90, interval=0.5)

    async def all_ready():
        return set((await asyncio.to_thread(readiness)).values()) == {200}

    await eventually(all_ready, timeout=60, interval=0.5)
    closures = await rows(deployment, Closure, session_id=session_id)
    assert [c.kind for c in closures] == ["output"]
    assert sink.counts["/sink"] == 1
    for service, process in deployment.processes.items():
        assert process.poll() is None, f"{service} died with the broker instead of reconnecting"
