"""The publisher relays only what the ledger committed (invariant 1)."""

import asyncio

from services.approval_ledger.store_database import database_store
from shared.ledger.database import notify_channel
from shared.messages import TurnCompleted, mint
from shared.topology import Topology
from tests.harness import next_event


async def test_the_publisher_sends_nothing_that_was_not_committed(deployment):
    deployment.start("publisher")
    settings = deployment.settings
    session_id = mint("ses")
    topology = Topology(settings.namespace)
    async with deployment.console() as console, deployment.engine("approval-ledger") as ledger:
        events = await console.watch(session_id)
        rolled_back = TurnCompleted(session_id=session_id, turn_id=mint("trn"), text="never committed")
        async with database_store(ledger, topology, notify_channel(settings)) as uow:
            uow.emit(None, rolled_back)
            await uow.flush()  # the row exists inside the transaction, then is rolled back
        committed = TurnCompleted(session_id=session_id, turn_id=mint("trn"), text="committed")
        async with database_store(ledger, topology, notify_channel(settings)) as uow:
            uow.emit(None, committed)
            await uow.commit()

        first = await next_event(events, "turn.completed")
        assert first.message_id == committed.message_id
        await asyncio.sleep(0.5)  # several relay cycles: the rolled-back row must never surface
        assert await events.get(no_ack=True, fail=False) is None


async def test_events_of_one_session_arrive_in_commit_order_with_increasing_sequence(deployment):
    deployment.start("publisher")
    settings = deployment.settings
    session_id = mint("ses")
    async with deployment.console() as console, deployment.engine("approval-ledger") as ledger:
        events = await console.watch(session_id)
        sent = []
        for n in range(50):
            async with database_store(ledger, Topology(settings.namespace), notify_channel(settings)) as uow:
                message = TurnCompleted(session_id=session_id, turn_id=mint("trn"), text=str(n), sequence=n + 1)
                uow.emit(None, message)
                await uow.commit()
                sent.append(message.message_id)
        received = [(await next_event(events, "turn.completed")).message_id for _ in sent]
    assert received == sent


async def test_on_sqlite_a_second_publisher_refuses_to_start_naming_the_one_that_relays(sqlite_deployment):
    import pytest

    deployment = sqlite_deployment
    deployment.start()
    first = deployment.processes["publisher"].pid
    with pytest.raises(AssertionError) as refused:
        deployment.start("publisher#2")
    said = str(refused.value)
    assert "publisher#2 exited with 1 during start-up" in said
    assert "another publisher already relays this SQLite ledger" in said and f"pid {first} " in said
    # The first goes on relaying alone: a whole turn still goes through.
    session_id = "read-" + mint("ses")[4:]
    async with deployment.console() as console:
        from shared.messages import StartTurn

        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="what time is it?"))
        await next_event(events, "turn.completed", timeout=30)
