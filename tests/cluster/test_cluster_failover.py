"""Past one machine: a RabbitMQ node and the PostgreSQL primary lost mid-flow, with
32 sessions in flight through approvals. Runs on the cluster of
deploy/local/cluster_up.sh (`make cluster-test`), serially: each test kills a part
of the cluster all the tests share."""

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter

import aio_pika
import pytest

from services.operations.status import placement, render_placement
from tests.cluster.rig import (
    ADMIN,
    NODES,
    Flow,
    cluster_deployment,
    cluster_up,
    connections_by_node,
    cut_off,
    deployment_connections_by_node,
    heal,
    kill_node,
    kill_primary,
    leaders,
    node_name,
    partitions,
    peers_seen,
    promote_standby,
    psql,
    running,
    wal_sender,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(900),
    pytest.mark.slow(reason="a node is killed or cut off and the survivors elect, promote or rejoin"),
]
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


def _committed(namespace: str) -> int:
    """Rows the deployment's commits have made visible on the primary (its audit log: every
    decision, claim and closure writes there), as a superuser reads them at once."""
    return int(psql(5442, f'select count(*) from "{namespace}".audit_log', database="test"))


async def _lose_the_primary(deployment, console, sink, *, freeze_standby: bool, patience: float):
    """32 sessions in flight; the primary lost (every process of it SIGKILLed) and the standby
    promoted. freeze_standby: the primary's WAL sender stopped (SIGSTOP) for 3 s just before,
    so the standby lags what the primary committed, as a loaded or distant standby does.
    Returns the verdict and how many rows were committed on the primary while the standby was frozen."""
    flow = Flow(console, SESSIONS, patience=patience)
    await asyncio.sleep(8)
    sender = await asyncio.to_thread(wal_sender)
    committed_frozen = 0
    if freeze_standby:
        # The primary's WAL sender, not the standby's receiver: what the sender already
        # wrote to the socket would reach the standby from the kernel's buffer anyway.
        os.kill(sender, signal.SIGSTOP)
        before = flow.observed.completed_turns
        # Read in the ledger, not by the session loops: they see a turn up to a poll (under
        # load, seconds) after its commit, so "turns completed while frozen" counted commits
        # made before the freeze (20 in one run).
        at_freeze = await asyncio.to_thread(_committed, deployment.namespace)
        await asyncio.sleep(3)
        committed_frozen = await asyncio.to_thread(_committed, deployment.namespace) - at_freeze
        held = await asyncio.to_thread(psql, 5442, "select count(*) from pg_stat_activity where wait_event = 'SyncRep'")
        print(f"\ncluster: while the WAL sender was held 3 s: {committed_frozen} audit rows committed on the primary, "
              f"{held} commits waiting for the standby, {flow.observed.completed_turns - before} turns seen completed "
              f"by the session loops")
    killed_at = time.monotonic()
    kill_primary()
    await asyncio.to_thread(promote_standby)
    promoted_in = time.monotonic() - killed_at
    await asyncio.sleep(25)
    verdict = await flow.finish(deployment, sink)
    pause = flow.longest_pause(killed_at)
    print(f"cluster: promoted in {promoted_in:.1f}s; "
          f"{flow.observed.completed_turns} turns, {len(sink.requests)} outward calls; longest pause {pause:.1f}s; "
          f"figures {verdict.figures}; violations {verdict.violations}")
    return verdict, committed_frozen


async def test_the_postgresql_primary_lost_and_its_synchronous_standby_promoted_loses_and_repeats_nothing(
    flowing, sink
):
    deployment, console = flowing
    assert psql(5442, "select sync_state from pg_stat_replication") == "sync"
    # Frozen, the synchronous standby holds every commit back: nothing is acknowledged that it lacks.
    verdict, committed_frozen = await _lose_the_primary(deployment, console, sink, freeze_standby=True, patience=180)
    assert committed_frozen == 0, f"{committed_frozen} rows committed while the synchronous standby was held"
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
    verdict, committed_frozen = await _lose_the_primary(deployment, console, sink, freeze_standby=True, patience=60)
    assert committed_frozen > 0, "nothing was committed while the asynchronous standby was held"
    assert not verdict.passed, "asynchronous replication lost nothing: the scenario did not make the standby lag"


async def _wait_for(check, timeout: float, what: str) -> float:
    """Seconds until `check()` (a blocking call, run in a thread) holds."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if await asyncio.to_thread(check):
            return time.monotonic() - started
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout}s")


async def test_a_rabbitmq_node_cut_off_from_the_other_two_stops_while_they_go_on_and_nothing_is_lost_or_repeated(
    flowing, sink
):
    """A split, not a crash: the node keeps running and its clients' connections stay up,
    only its links to its peers go. Under pause_minority it must not go on alone (a
    message it confirmed there could vanish when the split heals); the two others must."""
    deployment, console = flowing
    flow = Flow(console, SESSIONS)
    await asyncio.sleep(5)
    clients = deployment_connections_by_node(deployment.namespace, via=1)
    victim_name, _ = clients.most_common(1)[0]
    victim = next(n for n in NODES if node_name(n) == victim_name)
    survivor = next(n for n in NODES if n != victim)
    # A client of the victim alone, and a queue the victim leads: what a split-brain would confirm.
    probe = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{5680 + victim}/")
    channel = await probe.channel()
    probe_queue = f"{deployment.namespace}.partition-probe"
    await channel.declare_queue(probe_queue, durable=True,
                                arguments={"x-queue-type": "quorum", "x-queue-leader-locator": "client-local"})
    await channel.default_exchange.publish(aio_pika.Message(b"before"), routing_key=probe_queue, timeout=10)
    print(f"\ncluster: the deployment's clients by node {dict(clients)}; queue leaders "
          f"{dict(leaders(deployment.namespace, via=1))}; cutting off {victim_name}")
    before = flow.observed.completed_turns
    cut_at = time.monotonic()
    await asyncio.to_thread(cut_off, victim)
    try:
        # The minority confirms nothing: a publish to the queue it leads, on its own connection.
        try:
            await channel.default_exchange.publish(aio_pika.Message(b"during"), routing_key=probe_queue, timeout=10)
            confirmed_alone = True
        except Exception as error:  # the publish times out, or the paused node closes the connection
            confirmed_alone = False
            print(f"cluster: a publish on {victim_name} during the split: {type(error).__name__}")
        paused_in = await _wait_for(lambda: not running(victim), 30, f"{victim_name} paused")
        await asyncio.sleep(max(0.0, 20 - (time.monotonic() - cut_at)))
        during = flow.observed.completed_turns - before
        # As `signoff status` shows it (its management API on a node of the majority).
        where = await placement(deployment.settings.model_copy(update={"rabbitmq_admin_url": ADMIN.format(
            port=15680 + survivor)}))
        moved = sum(where.broker.values(), Counter())
        print("\n".join(render_placement(where)))
        print(f"cluster: {victim_name} paused {paused_in:.1f}s after the cut; {during} turns completed in the 20 s "
              f"of the split; the deployment's clients by node now {dict(moved)}")
        still_cut = peers_seen(victim)
    finally:
        await asyncio.to_thread(heal, victim)
    back_in = await _wait_for(lambda: running(victim) and len(peers_seen(victim)) == len(NODES) - 1, 120,
                              f"{victim_name} back in the cluster")
    remembered = {node_name(n): partitions(n) for n in NODES}
    print(f"cluster: healed; {victim_name} running again in {back_in:.1f}s; splits remembered {remembered}")
    with contextlib.suppress(Exception):
        await probe.close()
    await asyncio.sleep(10)
    verdict = await flow.finish(deployment, sink)
    pause = flow.longest_pause(cut_at)
    print(f"cluster: {flow.observed.completed_turns} turns, {len(flow.observed.shown)} requests, "
          f"{len(sink.requests)} outward calls; longest pause between completions {pause:.1f}s; "
          f"figures {verdict.figures}")
    async with deployment.observer() as observer:
        await observer.queue_delete(probe_queue)
    assert still_cut == [], f"the split did not hold: {victim_name} still saw {still_cut}"
    assert not any(remembered.values()), f"the nodes still disagree after healing: {remembered}"
    assert not confirmed_alone, f"{victim_name}, cut off, confirmed a publish on its own (split brain)"
    assert during > 0, "no turn completed on the two nodes of the majority"
    assert victim_name not in moved, f"clients still on the paused {victim_name}: {dict(moved)}"
    assert all(set(servers) == {"127.0.0.1:5442"} for servers in where.database.values()), where.database
    assert verdict.passed, verdict.violations
    for name, process in deployment.processes.items():
        assert process.poll() is None, f"{name} died with the split instead of moving to another node"
