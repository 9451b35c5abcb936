"""Past one machine: a RabbitMQ node and the PostgreSQL primary lost mid-flow, with
32 sessions in flight through approvals (issue 24). Runs on the cluster of
deploy/local/cluster_up.sh (`make cluster-test`), serially: each test kills a part
of the cluster all the tests share."""

import asyncio
import os
import signal
import time

import pytest

from tests.cluster.rig import (
    NODES,
    cluster_deployment,
    cluster_up,
    connections_by_node,
    kill_node,
    leaders,
    node_name,
    postmaster,
    promote_standby,
    psql,
)
from tests.cluster.rig import Flow

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
SESSIONS = 32


@pytest.fixture
def cluster():
    cluster_up()
    yield
    cluster_up()  # a killed node back, a promoted standby rebuilt: the next test starts whole


@pytest.fixture
async def flowing(cluster, tmp_path, sink):
    deployment = cluster_deployment(tmp_path, sink)
    try:
        deployment.start()
        # A second ledger and executor: replicas, as past one machine.
        deployment.start("approval-ledger#2", "tool-executor#2")
        async with deployment.console() as console:
            yield deployment, console
    finally:
        await deployment.cleanup()


async def test_the_rabbitmq_node_leading_most_queues_killed_mid_flow_loses_and_repeats_nothing(flowing, sink):
    deployment, console = flowing
    flow = Flow(console, SESSIONS)
    await asyncio.sleep(5)
    led = leaders(deployment.namespace, via=1)
    victim_name, _ = led.most_common(1)[0]
    victim = next(n for n in NODES if node_name(n) == victim_name)
    survivor = next(n for n in NODES if n != victim)
    before = flow.observed.completed_turns
    print(f"\ncluster: queue leaders {dict(led)}; clients by node {dict(connections_by_node(survivor))}; "
          f"killing {victim_name}")
    killed_at = time.monotonic()
    kill_node(victim)
    await asyncio.sleep(20)
    during = flow.observed.completed_turns - before
    print(f"cluster: {during} turns completed in the 20 s after the kill; clients by node "
          f"{dict(connections_by_node(survivor))}; leaders now {dict(leaders(deployment.namespace, via=survivor))}")
    started = time.monotonic()
    await asyncio.to_thread(cluster_up)  # the killed node back
    print(f"cluster: {victim_name} back in {time.monotonic() - started:.1f}s")
    await asyncio.sleep(10)
    verdict = await flow.finish(deployment, sink)
    pause = flow.longest_pause(killed_at)
    print(f"cluster: {flow.observed.completed_turns} turns, {len(flow.observed.shown)} requests, "
          f"{len(sink.requests)} outward calls; longest pause between completions {pause:.1f}s; "
          f"figures {verdict.figures}")
    assert during > 0, "no turn completed on the two nodes left"
    assert verdict.passed, verdict.violations
    for name, process in deployment.processes.items():
        assert process.poll() is None, f"{name} died with the node instead of moving to another"
