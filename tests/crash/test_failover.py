"""Replicas: a standby publisher and a second ledger take over from SIGKILLed
ones without a restart (design.md, "Scale"; invariants 1, 4, 9). This is how a
container deployment recovers in well under a second: nothing has to start.
A leader whose lock connection is cut while it lives on is fenced: it marks
nothing sent once its successor leads, and stops relaying (design.md, "Scale and
failover", "One publisher leads")."""

import asyncio
import json
import re
import signal
from collections import Counter
from contextlib import asynccontextmanager

import aio_pika
import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import create_async_engine

from services.approval_ledger.store_database import database_store
from shared.ledger.leadership import leader_lock
from shared.ledger.database import notify_channel
from shared.ledger.tables import ApprovalRequest, Closure, OutboxRow
from shared.messages import TurnCompleted, mint
from shared.settings import Settings
from shared.topology import SENDERS, Topology
from tests.crash.test_crash_windows import finish, wire
from tests.harness import (
    POSTGRES_URL,
    RABBITMQ_URL,
    assert_nothing_left_in_any_queue,
    eventually,
    next_event,
    rows,
    start_and_wait_for_approval,
)

pytestmark = __import__("pytest").mark.crash


async def test_a_standby_publisher_relays_nothing_while_the_leader_lives_and_takes_over_when_it_is_killed(
        pg_deployment, sink):
    deployment = pg_deployment
    wire(deployment, sink)
    deployment.start()
    # The standby holds at its first relayed batch: if it relayed while the
    # leader lived, per-session order would rest on luck.
    deployment.start("publisher#2", faults="publisher.after_send:hold")
    async with deployment.console() as console:
        first = mint("ses")
        events, requested = await start_and_wait_for_approval(console, first)
        completed = await finish(console, events, requested)
        assert completed.text == "Posted."
        assert not deployment.fault_reached("publisher.after_send"), "the standby relayed while the leader lived"

        second = mint("ses")
        events, requested = await start_and_wait_for_approval(console, second)
        deployment.kill("publisher")
        await console.respond(requested.request_id, "approve", "", "", "tester")
        async def standby_relayed():
            return deployment.fault_reached("publisher.after_send")

        await eventually(standby_relayed)
        assert "publisher taking over" in deployment.log_path("publisher#2").read_text()
        deployment.release("publisher.after_send")
        completed = await next_event(events, "turn.completed", timeout=30)
        assert completed.text == "Posted."
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    assert sink.counts["/sink"] == 2, "each approved call ran once"
    for session_id in (first, second):
        assert [c.kind for c in await rows(deployment, Closure, session_id=session_id)] == ["output"]


async def test_a_second_ledger_applies_the_responses_waiting_for_a_killed_one(pg_deployment, sink):
    deployment = pg_deployment
    wire(deployment, sink)
    deployment.start()
    deployment.start("approval-ledger#2")
    async with deployment.console() as console:
        waiting = [(session_id, *await start_and_wait_for_approval(console, session_id))
                   for session_id in (mint("ses") for _ in range(4))]
        deployment.kill("approval-ledger")
        # Nothing restarts: the responses go to the ledger that is still running.
        completed = await asyncio.gather(*(finish(console, events, requested)
                                           for _, events, requested in waiting))
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    assert [c.text for c in completed] == ["Posted."] * 4
    assert sink.counts["/sink"] == 4, "each approved call ran once"
    for session_id, _, requested in waiting:
        assert [r.id for r in await rows(deployment, ApprovalRequest, session_id=session_id)] == [requested.request_id]
        assert [c.kind for c in await rows(deployment, Closure, session_id=session_id)] == ["output"]


# --- a leader cut off from its lock, alive -------------------------------------------------


class Copy:
    """Every message the publishers put on the bus, as RabbitMQ routed it: a queue of the
    test's own, bound to the events exchange and to the publisher's commands."""

    def __init__(self, queue: aio_pika.abc.AbstractQueue) -> None:
        self.queue = queue
        self.counts: Counter[str] = Counter()

    async def drain(self) -> None:
        while (message := await self.queue.get(no_ack=True, fail=False)) is not None:
            self.counts[message.message_id] += 1

    async def wait_for(self, message_ids: list[str], times: int = 1, timeout: float = 20.0) -> None:
        """Until each of these was relayed at least `times` times."""
        async def arrived():
            await self.drain()
            return all(self.counts[m] >= times for m in message_ids)

        await eventually(arrived, timeout)

    def relayed(self, message_ids: list[str]) -> int:
        return sum(self.counts[m] for m in message_ids)


@asynccontextmanager
async def copy_of_the_relay(namespace: str):
    connection = await aio_pika.connect_robust(RABBITMQ_URL)  # the broker's administrator: it only watches
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        topology = Topology(namespace)
        await queue.bind(topology.events.name, "#")
        for kind in (k for k, sender in SENDERS.items() if sender == "publisher"):
            await queue.bind(topology.commands.name, kind)
        yield Copy(queue)


async def commit_events(ledger, settings, count: int, per_transaction: int = 1) -> list[str]:
    """Commit `count` events to the outbox as the ledger does; their message ids, in order."""
    topology, channel = Topology(settings.namespace), notify_channel(settings)
    sent = []
    for _ in range(count // per_transaction):
        async with database_store(ledger, topology, channel) as uow:
            for _ in range(per_transaction):
                event = TurnCompleted(session_id=mint("ses"), turn_id=mint("trn"), text="load")
                uow.emit(None, event)
                sent.append(event.message_id)
            await uow.commit()
    return sent


async def cut_the_leaders_lock_connection(deployment) -> int:
    """As the database's administrator, end the backend that holds this ledger's publisher
    lock (`pg_terminate_backend`): the leader's process and its other connections live on."""
    admin = create_async_engine(Settings(database_url=POSTGRES_URL).ledger_url)
    try:
        async with admin.begin() as conn:
            holders = (await conn.execute(text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = 0 AND objid = :key "
                "AND objsubid = 1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
                {"key": leader_lock(deployment.settings)})).scalars().all()
            assert len(holders) == 1, f"one backend holds the leader lock, not {holders}"
            assert await conn.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": holders[0]})
            return holders[0]
    finally:
        await admin.dispose()


def logged(deployment, name: str, line: str) -> int:
    """How many times a process (its last start) logged a line containing `line`."""
    return deployment.log_path(name).read_text(errors="replace").split("--- start ")[-1].count(line)


async def until_logged(deployment, name: str, line: str) -> None:
    async def seen():
        return logged(deployment, name, line)

    await eventually(seen)


async def fenced_batches(deployment, name: str) -> list[str]:
    """The message ids of the batches a deposed leader published and was refused to mark sent."""
    found = re.findall(r"deposed before marking outbox rows (\d+)\.\.(\d+) sent",
                       deployment.log_path(name).read_text(errors="replace"))
    ids = []
    for first, last in found:
        ids += [r.message_id for r in sorted(await rows(deployment, OutboxRow), key=lambda r: r.id)
                if int(first) <= r.id <= int(last)]
    return ids


async def sent_at(deployment, message_ids: list[str]) -> dict:
    async with deployment.ledger() as sessions, sessions() as db:
        return dict((await db.execute(select(OutboxRow.message_id, OutboxRow.sent_at)
                                      .where(OutboxRow.message_id.in_(message_ids)))).all())


async def test_a_leader_cut_from_its_lock_stops_relaying_and_the_standby_relays_every_row_once(pg_deployment):
    """The leader's lock connection is cut while its process lives on; then load. The standby
    takes over; the old leader stands by again and relays nothing; every row is relayed once,
    but a batch the old leader had in flight (if any: the one it logs as fenced), twice."""
    deployment = pg_deployment
    deployment.start("publisher")
    deployment.start("publisher#2")
    settings = deployment.settings
    async with copy_of_the_relay(deployment.namespace) as copy, deployment.engine("approval-ledger") as ledger:
        before = await commit_events(ledger, settings, 10)
        await copy.wait_for(before)

        await cut_the_leaders_lock_connection(deployment)
        await until_logged(deployment, "publisher#2", "publisher taking over")
        # Load, from four writers at once: the new leader relays it.
        load = [m for batch in await asyncio.gather(*(commit_events(ledger, settings, 60, per_transaction=3)
                                                      for _ in range(4))) for m in batch]
        await copy.wait_for(load)

        # The old leader relays nothing: with the new one frozen, what is committed stays unsent.
        deployment.processes["publisher#2"].send_signal(signal.SIGSTOP)
        frozen = await commit_events(ledger, settings, 10)
        await asyncio.sleep(2.5)  # more than twice the old leader's idle poll (1 s)
        await copy.drain()
        assert copy.relayed(frozen) == 0, "the old leader relayed beside the new one"
        assert all(at is None for at in (await sent_at(deployment, frozen)).values())
        assert logged(deployment, "publisher", "publisher lost the lead") == 1
        assert logged(deployment, "publisher", "publisher standing by") == 1, "it stands by again"

        # It stood by: when the new leader dies, it leads again.
        deployment.kill("publisher#2")
        await copy.wait_for(frozen)
        assert logged(deployment, "publisher", "publisher taking over") == 1
        await asyncio.sleep(0.5)
        await copy.drain()
        in_flight = await fenced_batches(deployment, "publisher")
    relayed = before + load + frozen
    assert len(set(relayed)) == len(relayed) == 260
    assert copy.counts == Counter({m: 2 if m in in_flight else 1 for m in relayed}), (
        "each row relayed once, but the batch the deposed leader had in flight, twice")


@pytest.mark.parametrize("hooks", ["without-hooks", "with-a-hook"])
async def test_a_deposed_leaders_batch_in_flight_is_not_marked_sent_by_it_and_goes_out_again_once(
        pg_deployment, tmp_path, hooks):
    """The fence itself: the leader has published a batch and not yet marked it sent when its
    lock connection is cut. The new leader sends the batch again and marks it sent; the old
    leader, let go, may not mark it (its epoch is gone), stands by, and relays nothing more.
    Both ways of marking: without hooks one statement carries the fence; with a hook the
    mark-sent is a transaction that takes the fence (`Leadership.fence`) beside the hook's
    deliveries."""
    deployment = pg_deployment
    if hooks == "with-a-hook":
        path = tmp_path / "hooks.yaml"
        path.write_text(json.dumps({"hooks": [{
            "name": "elsewhere", "url": "http://127.0.0.1:9/hook", "events": ["approval.decided"], "secret": "s" * 40}]}))
        deployment.extra_env["SIGNOFF_HOOKS_FILE"] = str(path)
    deployment.start("publisher", faults="publisher.after_send:hold")
    deployment.start("publisher#2")
    settings = deployment.settings
    async with copy_of_the_relay(deployment.namespace) as copy, deployment.engine("approval-ledger") as ledger:
        held = await commit_events(ledger, settings, 20, per_transaction=20)  # one commit: one batch
        await copy.wait_for(held)

        async def holding():  # published and confirmed; the leader holds before marking them sent
            return deployment.fault_reached("publisher.after_send")

        await eventually(holding)
        behind = await commit_events(ledger, settings, 20)

        await cut_the_leaders_lock_connection(deployment)
        await copy.wait_for(held, times=2)
        await copy.wait_for(behind)

        async def marked_by_the_new_leader():
            marked = await sent_at(deployment, held)
            return None not in marked.values() and marked

        marked = await eventually(marked_by_the_new_leader)

        deployment.release("publisher.after_send")

        async def deposed_or_marked():
            return logged(deployment, "publisher", "publisher lost the lead") or (
                await sent_at(deployment, held) != marked)

        await eventually(deposed_or_marked)
        assert await sent_at(deployment, held) == marked, "the deposed leader marked rows sent after the new one"
        fenced = await fenced_batches(deployment, "publisher")
        assert sorted(fenced) == sorted(held) and len(fenced) == 20, "the one batch it had in flight"
        await until_logged(deployment, "publisher", "publisher standing by")

        after = await commit_events(ledger, settings, 20)
        await copy.wait_for(after)
        await asyncio.sleep(0.5)
        await copy.drain()
    assert copy.counts == Counter({**{m: 2 for m in held}, **{m: 1 for m in behind + after}})
