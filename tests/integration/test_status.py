"""`signoff status` on a healthy deployment (all ready, every queue consumed, exit 0) and
on a degraded one (a service killed, a message parked: exit 1, each named)."""

import asyncio
import subprocess
import sys
import time

import aio_pika

from shared.settings import PROJECT_ROOT
from shared.messages import mint
from tests.harness import SERVICES, free_port, start_and_wait_for_approval


def status(deployment) -> subprocess.CompletedProcess:
    env = deployment.env()
    env["SIGNOFF_STATUS_TARGETS"] = ",".join(
        f"{service}=http://127.0.0.1:{port}" for service, port in deployment.metrics_ports.items()
    )
    return subprocess.run(
        [sys.executable, "-m", "services.operations.cli", "status"], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True,
        timeout=60,
    )


async def until(check, what: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    deadline = time.monotonic() + timeout
    while True:
        shown = await asyncio.to_thread(status, check.deployment)
        if check(shown):
            return shown
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not shown within {timeout}s:\n{shown.stdout}{shown.stderr}")
        await asyncio.sleep(0.5)


async def test_status_says_all_is_well_then_names_what_needs_a_person(deployment):
    deployment.metrics_ports = {service: free_port() for service in SERVICES}
    deployment.extra_env["SINK_URL"] = "http://127.0.0.1:9"
    deployment.start()
    ns = deployment.namespace
    async with deployment.console() as console:  # a person is asked: normal, nothing wrong
        await start_and_wait_for_approval(console, mint("ses"))

    def healthy(shown):
        return shown.returncode == 0

    healthy.deployment = deployment
    shown = await until(healthy, "a healthy deployment")
    out = shown.stdout
    for service in SERVICES:
        assert f"{service:<20} http://127.0.0.1:{deployment.metrics_ports[service]}" in out
    assert "NOT READY" not in out and out.rstrip().endswith("all well")
    assert f"{ns}.ledger.turns" in out and f"{ns}.tool-executor.requests" in out
    assert "relay lag" in out and "dead letters         0" in out
    assert "approvals waiting    1 (oldest " in out and "first expires in " in out
    assert "  post_to_sink       1" in out

    deployment.kill("model-step")
    async with deployment.console() as console:
        exchange = await console.channel.get_exchange(f"{ns}.channels")
        await exchange.publish(aio_pika.Message(b"{not json", message_id="garbage"), routing_key="approval.respond")

    def degraded(shown):
        return shown.returncode == 1 and "parked message" in shown.stdout and "nobody consumes" in shown.stdout

    degraded.deployment = deployment
    shown = await until(degraded, "a degraded deployment")
    out = shown.stdout
    assert "model-step           " in out and "NOT READY: no answer" in out
    assert f"nobody consumes {ns}.model-step.requests" in out
    assert "1 parked message(s): see `signoff dead-letters`" in out
    assert "dead letters         1" in out


def _all_ready(deployment) -> bool:
    import httpx

    for port in deployment.metrics_ports.values():
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code != 200:
                return False
        except httpx.HTTPError:
            return False
    return True


async def status_now(deployment, capsys) -> tuple[int, str]:
    """`signoff status` at once, in this process: a new interpreter would take a second to
    start, long enough for the management API's sampled figures to catch up."""
    from services.operations.status import show_status

    capsys.readouterr()
    code = await show_status(deployment.settings)
    return code, capsys.readouterr().out


async def test_status_is_exact_the_moment_services_are_ready_a_message_is_parked_and_it_is_dropped(
        deployment, capsys):
    from services.operations.parked import drop_dead_letters

    deployment.metrics_ports = {service: free_port() for service in SERVICES}
    deployment.extra_env["SINK_URL"] = "http://127.0.0.1:9"
    deployment.extra_env["SIGNOFF_STATUS_TARGETS"] = ",".join(
        f"{service}=http://127.0.0.1:{port}" for service, port in deployment.metrics_ports.items()
    )
    ns = deployment.namespace
    wrong = []  # every moment checked, each said (one stale figure must not hide the next)
    deployment.start()
    deadline = time.monotonic() + 30
    while not await asyncio.to_thread(_all_ready, deployment):
        assert time.monotonic() < deadline, "the services' /readyz never all answered 200"
        await asyncio.sleep(0.02)
    code, out = await status_now(deployment, capsys)
    if not (code == 0 and out.rstrip().endswith("all well") and f"{f'{ns}.ledger.turns':<44} {0:>7}" in out):
        wrong.append(f"at once after every /readyz answered 200 (exit {code}):\n{out}")
    assert "UNACKED is the management API's sample" in out

    async with deployment.observer() as admin:
        channel = await admin.get_underlay_channel()
        async with deployment.console() as console:
            exchange = await console.channel.get_exchange(f"{ns}.channels")
            await exchange.publish(aio_pika.Message(b"{not json", message_id="junk"), routing_key="approval.respond")
        # The moment the broker holds it in the dead letters (its own answer, not a sample).
        deadline = time.monotonic() + 30
        while (await channel.queue_declare(f"{ns}.dead-letters", passive=True)).message_count != 1:
            assert time.monotonic() < deadline, "the garbage was never parked"
            await asyncio.sleep(0.01)
    code, out = await status_now(deployment, capsys)
    if not (code == 1 and "1 parked message(s): see `signoff dead-letters`" in out and "dead letters         1" in out):
        wrong.append(f"at once after a message was parked (exit {code}):\n{out}")

    assert await drop_dead_letters(deployment.settings, "junk", "olga", "garbage") == 0
    code, out = await status_now(deployment, capsys)
    if not (code == 0 and out.rstrip().endswith("all well") and "parked message" not in out
            and "dead letters         0" in out):
        wrong.append(f"at once after `dead-letters drop` (exit {code}):\n{out}")
    assert not wrong, "status was wrong " + "\n".join(wrong)


async def test_status_says_which_rabbitmq_node_and_postgresql_server_each_service_is_connected_to(
        pg_deployment, capsys):
    import re

    import httpx

    from tests.harness import POSTGRES_URL, RABBITMQ_ADMIN_URL

    deployment = pg_deployment
    deployment.extra_env["SINK_URL"] = "http://127.0.0.1:9"
    deployment.start()
    admin = httpx.URL(RABBITMQ_ADMIN_URL)
    node = httpx.get(admin.join("api/overview"), auth=(admin.username, admin.password), timeout=10).json()["node"]
    server = POSTGRES_URL.split("@", 1)[1].split("/", 1)[0]

    def placed(out: str, service: str) -> bool:
        return re.search(rf"^{re.escape(service)}\s+{re.escape(node)} \(\d+\)\s+{re.escape(server)} \(\d+\)$", out,
                         re.MULTILINE) is not None

    # The management API lists a connection some seconds after it opens (its statistics are sampled).
    deadline = time.monotonic() + 30
    while True:
        _, out = await status_now(deployment, capsys)
        if all(placed(out, service) for service in SERVICES):
            break
        assert time.monotonic() < deadline, f"not every service shown on {node} and {server}:\n{out}"
        await asyncio.sleep(1)
    assert f"(database servers: {server} primary)" in out, out

    deployment.kill("tool-executor")  # gone from both: what is shown is live, not configured
    deadline = time.monotonic() + 30
    while True:
        _, out = await status_now(deployment, capsys)
        if not re.search(r"^tool-executor ", out, re.MULTILINE):
            break
        assert time.monotonic() < deadline, f"a killed executor still shown connected:\n{out}"
        await asyncio.sleep(1)
    assert all(placed(out, service) for service in SERVICES if service != "tool-executor"), out
