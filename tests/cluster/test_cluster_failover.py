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
    Flow,
    cluster_deployment,
    cluster_up,
    connections_by_node,
    kill_node,
    kill_primary,
    leaders,
    node_name,
    promote_standby,
    psql,
    wal_sender,
)

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


async def _lose_the_primary(deployment, console, sink, *, freeze_standby: bool, patience: float):
    """32 sessions in flight; the primary lost (every process of it SIGKILLed) and the standby
    promoted. freeze_standby: the primary's WAL sender stopped (SIGSTOP) for 3 s just before,
    so the standby lags what the primary committed, as a loaded or distant standby does."""
    flow = Flow(console, SESSIONS, patience=patience)
    await asyncio.sleep(8)
    before = flow.observed.completed_turns
    sender = wal_sender()
    if freeze_standby:
        # The primary's WAL sender, not the standby's receiver: what the sender already
        # wrote to the socket would reach the standby from the kernel's buffer anyway.
        os.kill(sender, signal.SIGSTOP)
        await asyncio.sleep(3)
    frozen_turns = flow.observed.completed_turns - before
    killed_at = time.monotonic()
    kill_primary()
    await asyncio.to_thread(promote_standby)
    promoted_in = time.monotonic() - killed_at
    await asyncio.sleep(25)
    verdict = await flow.finish(deployment, sink)
    pause = flow.longest_pause(killed_at)
    print(f"\ncluster: promoted in {promoted_in:.1f}s; {frozen_turns} turns completed while the standby was frozen; "
          f"{flow.observed.completed_turns} turns, {len(sink.requests)} outward calls; longest pause {pause:.1f}s; "
          f"figures {verdict.figures}; violations {verdict.violations}")
    return verdict


async def test_the_postgresql_primary_lost_and_its_synchronous_standby_promoted_loses_and_repeats_nothing(
    flowing, sink
):
    deployment, console = flowing
    assert psql(5442, "select sync_state from pg_stat_replication") == "sync"
    # Frozen, the synchronous standby holds every commit back: nothing is acknowledged that it lacks.
    verdict = await _lose_the_primary(deployment, console, sink, freeze_standby=True, patience=180)
    assert verdict.passed, verdict.violations
    for name, process in deployment.processes.items():
        assert process.poll() is None, f"{name} died with the primary instead of finding the new one"


async def test_with_asynchronous_replication_the_same_loss_forgets_acknowledged_work(flowing, sink):
    """The trade-off, measured: what the primary acknowledged but the standby had not
    received is gone after the promotion (decisions, closures, claims)."""
    deployment, console = flowing
    # Asynchronous for this test (cluster_up.sh, after it, makes it synchronous again).
    psql(5442, "alter system set synchronous_standby_names = ''")
    psql(5442, "select pg_reload_conf()")
    await asyncio.sleep(1)
    assert psql(5442, "select sync_state from pg_stat_replication") == "async"
    verdict = await _lose_the_primary(deployment, console, sink, freeze_standby=True, patience=60)
    assert not verdict.passed, "asynchronous replication lost nothing: the scenario did not make the standby lag"
