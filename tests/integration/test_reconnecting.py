"""A service whose broker connection is lost reconnects and consumes again, on its
own (the consumers on aio-pika directly, shared/bus.py, must restore what FastStream's
did): the connections are closed through the management API, so RabbitMQ itself
stays up for everyone else on this machine. The restart of RabbitMQ itself is
tests/crash/test_broker_restart.py's (a serial pass of its own)."""

import asyncio
import signal
import subprocess
from urllib.parse import quote

import httpx

from shared.ledger.tables import Closure, Session
from shared.messages import mint
from tests.harness import SERVICES, eventually, rows, start_and_wait_for_approval

ADMIN = "http://127.0.0.1:15672/api"


def close_connections_of(users: set[str]) -> bool:
    """Close every connection of these broker users, once the management API lists one
    of each (its list lags behind); whether it did."""
    with httpx.Client(base_url=ADMIN, auth=("guest", "guest"), timeout=10) as admin:
        listed = [c for c in admin.get("/connections").json() if c.get("user") in users]
        if {c["user"] for c in listed} != users:
            return False
        for name in [c["name"] for c in listed]:
            closed = admin.delete(f"/connections/{quote(name, safe='')}", headers={"X-Reason": "test: connection lost"})
            assert closed.status_code in (204, 404), closed.text  # 404: it went away by itself meanwhile
    return True


def consumers_of(queue: str) -> int:
    with httpx.Client(base_url=ADMIN, auth=("guest", "guest"), timeout=10) as admin:
        answer = admin.get(f"/queues/%2F/{quote(queue, safe='')}")
        answer.raise_for_status()
        return int(answer.json().get("consumers", 0))


async def test_services_whose_connections_are_closed_mid_call_reconnect_consume_again_and_finish_it_once(
    pg_deployment, sink
):
    deployment = pg_deployment
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    users = {f"{deployment.namespace}.{service}" for service in SERVICES}
    queues = [
        f"{deployment.namespace}.{short}" for short in ("ledger.responses", "ledger.tools", "tool-executor.requests")
    ]

    session_id = mint("ses")
    async with deployment.console() as console:
        _, requested = await start_and_wait_for_approval(console, session_id)
        # Hold the tool call: the executor loses its connection with the call in flight.
        sink.hold_next("/sink")
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await asyncio.to_thread(sink.wait_held)
        await eventually(lambda: asyncio.to_thread(close_connections_of, users), timeout=30, interval=0.5)
        # The tool finishes while its executor is disconnected: the report waits, it is not lost.
        sink.release()

        async def consuming_again() -> bool:
            return all([await asyncio.to_thread(consumers_of, q) >= 1 for q in queues])

        await eventually(consuming_again, timeout=60, interval=0.5)

        async def idle(which: str) -> bool:
            [session] = await rows(deployment, Session, id=which)
            return session.status == "idle"

        await eventually(lambda: idle(session_id), timeout=60, interval=0.5)
        # And a whole new round trip goes through the reconnected consumers.
        second = mint("ses")
        _, again = await start_and_wait_for_approval(console, second)
        await console.respond(again.request_id, "approve", "", "", "tester")
        await eventually(lambda: idle(second), timeout=60, interval=0.5)

    closures = await rows(deployment, Closure, session_id=session_id)
    assert [c.kind for c in closures] == ["output"]
    assert sink.counts["/sink"] == 2  # once per call: the held call ran once
    for service, process in deployment.processes.items():
        assert process.poll() is None, f"{service} died with its connection instead of reconnecting"


def connected(users: set[str]) -> bool:
    with httpx.Client(base_url=ADMIN, auth=("guest", "guest"), timeout=10) as admin:
        return users <= {c.get("user") for c in admin.get("/connections").json()}


def delete_users(users: set[str]) -> None:
    with httpx.Client(base_url=ADMIN, auth=("guest", "guest"), timeout=10) as admin:
        for user in users:
            gone = admin.delete(f"/users/{quote(user, safe='')}")
            assert gone.status_code in (204, 404), gone.text


async def test_a_service_whose_broker_user_is_gone_still_stops_when_told(pg_deployment):
    # Its robust connection can never come back; a cancel or a close that waited for it
    # kept the service alive after SIGTERM, an orphan outliving `signoff up`.
    deployment = pg_deployment
    deployment.start()
    users = {f"{deployment.namespace}.{service}" for service in SERVICES}
    # Connected first (the management API lists each of them), then their users deleted.
    await eventually(lambda: asyncio.to_thread(connected, users), timeout=30, interval=0.5)
    await asyncio.to_thread(delete_users, users)
    await asyncio.sleep(2)
    for process in deployment.processes.values():
        process.send_signal(signal.SIGTERM)
    for service, process in deployment.processes.items():
        try:
            await asyncio.to_thread(process.wait, 40)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError(f"{service} did not stop within 40 s of SIGTERM without its broker user") from None
