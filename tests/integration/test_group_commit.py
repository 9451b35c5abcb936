"""Group commit in the ledger (services/approval_ledger/group_commit.py): the
messages waiting together are applied in one transaction, each with its own
inbox row and effects, one session's in delivery order; a group that fails is
applied message by message, so one failing message takes no other down."""

import asyncio
from functools import partial

import pytest
from sqlalchemy import select

from services.approval_ledger import handlers
from services.approval_ledger.authority import Authority
from services.approval_ledger.group_commit import GroupCommit
from services.approval_ledger.handlers import Ledger
from services.approval_ledger.store_database import database_store
from shared import faults
from shared.catalogue import load_catalogue
from shared.ledger.database import migrate, notify_channel
from shared.ledger.tables import TABLES
from shared.messages import CancelTurn, StartTurn, mint
from shared.topology import Topology

INBOX, TURNS = TABLES["inbox"], TABLES["turns"]


async def _ledger(deployment, engine) -> Ledger:
    settings = deployment.settings
    await migrate(engine, settings)
    topology = Topology(settings.namespace)
    return Ledger(
        open_store=partial(database_store, engine, topology, notify_channel(settings)),
        topology=topology,
        catalogue=load_catalogue(settings.tools_file),
        authority=Authority.from_settings(settings),
        check_senders=False,
        default_provider=settings.provider,
    )


async def _applied_together(group: GroupCommit, messages) -> list[BaseException | None]:
    """Hand the messages to the group commit at once, as concurrent deliveries are."""
    routes = {"turn.start": handlers.start_turn, "turn.cancel": handlers.cancel_turn}
    outcomes = await asyncio.gather(*(group.apply(routes[m.type], m) for m in messages), return_exceptions=True)
    return list(outcomes)


async def test_waiting_messages_commit_in_one_transaction_each_with_its_inbox_row_and_in_session_order(deployment):
    deployment.setup()
    async with deployment.engine("approval-ledger") as engine:
        ledger = await _ledger(deployment, engine)
        group = GroupCommit(ledger, lanes=1, bound=16)
        first, second = mint("ses"), mint("ses")
        messages = [
            StartTurn(session_id=first, text="one", started_by="alice"),
            StartTurn(session_id=second, text="two"),
            # Delivered after its session's turn.start: applied after it, so there is a turn to cancel
            # (by its starter: nobody else may cancel it).
            CancelTurn(session_id=first, reason="changed my mind", cancelled_by="alice"),
        ]
        assert await _applied_together(group, messages) == [None, None, None]
        async with engine.connect() as db:
            inbox = (await db.execute(select(INBOX.c.message_id, INBOX.c.received_at))).all()
            turns = dict((await db.execute(select(TURNS.c.session_id, TURNS.c.status))).all())
    assert {row.message_id for row in inbox} == {m.message_id for m in messages}
    # One transaction: the unit of work's clock is taken once per transaction.
    assert len({row.received_at for row in inbox}) == 1
    assert turns == {first: "cancelled", second: "running"}


async def test_a_message_that_fails_in_a_group_fails_alone_and_the_others_commit(deployment):
    deployment.setup()
    faults.arm("ledger.before_commit@turn.cancel:raise", deployment.data_dir)
    try:
        async with deployment.engine("approval-ledger") as engine:
            ledger = await _ledger(deployment, engine)
            group = GroupCommit(ledger, lanes=1, bound=16)
            sessions = [mint("ses") for _ in range(3)]
            messages = [StartTurn(session_id=s, text="go") for s in sessions]
            failing = CancelTurn(session_id=sessions[0], cancelled_by="alice")
            outcomes = await _applied_together(group, [*messages, failing])
            async with engine.connect() as db:
                inbox = set((await db.execute(select(INBOX.c.message_id))).scalars())
                turns = dict((await db.execute(select(TURNS.c.session_id, TURNS.c.status))).all())
    finally:
        faults._armed.clear()
    assert outcomes[:3] == [None, None, None]
    with pytest.raises(faults.FaultRaised):
        raise outcomes[3]  # type: ignore[misc]
    assert inbox == {m.message_id for m in messages}
    assert turns == dict.fromkeys(sessions, "running")


async def test_a_duplicate_in_a_group_leaves_nothing_behind_not_even_the_session_its_turn_would_open(deployment):
    deployment.setup()
    async with deployment.engine("approval-ledger") as engine:
        ledger = await _ledger(deployment, engine)
        group = GroupCommit(ledger, lanes=1, bound=16)
        applied = StartTurn(session_id=mint("ses"), text="one")
        assert await _applied_together(group, [applied]) == [None]
        # The same message id again, naming a session nobody opened, beside a real turn.
        again = StartTurn(message_id=applied.message_id, session_id=mint("ses"), text="one")
        other = StartTurn(session_id=mint("ses"), text="two")
        assert await _applied_together(group, [again, other]) == [None, None]
        async with engine.connect() as db:
            sessions = set((await db.execute(select(TABLES["sessions"].c.id))).scalars())
    assert sessions == {applied.session_id, other.session_id}
