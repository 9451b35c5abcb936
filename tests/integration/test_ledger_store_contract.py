"""One contract for the ledger's store (the port, services/approval_ledger/store.py), run
against each of its three adapters: memory, SQLite and PostgreSQL (a real database, a
schema of its own per test), the eventsourcing way. The handlers' unit tests trust the
memory adapter to behave as the databases do; this is where that trust is earned.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from services.approval_ledger.domain import CANCELLED_BEFORE_RUNNING, Call, ClosureOnRecord, KeyedTurn, Note, Step, TurnSpend
from services.approval_ledger.store import Duplicate, LedgerStore
from services.approval_ledger.store_database import database_store
from services.approval_ledger.store_memory import MemoryDatabase
from shared import audit
from shared.ledger.database import migrate
from shared.messages import StartTurn, ToolCallClosed, ToolDescription, mint
from shared.tool_menu import ToolMenu
from shared.topology import Topology
from tests.harness import Deployment, require_services

TOPOLOGY = Topology("contract")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def stores(request, tmp_path):
    """Opens a store (one transaction) on a fresh ledger of the parametrized adapter: the
    databases' as the harness makes them (a schema or file of their own, the ledger's own role).
    Its transactions share what one ledger process knows of the tool menus stored;
    `stores(menus)` opens one as another process that knows `menus`."""
    if request.param == "memory":
        database = MemoryDatabase()
        yield lambda menus=None: database.store(TOPOLOGY, stored_menus=menus)
        return
    require_services(postgres=request.param == "postgres")
    deployment = Deployment(store=request.param, data_dir=tmp_path / "data")
    try:
        deployment.setup()
        async with deployment.engine("approval-ledger") as engine:
            await migrate(engine, deployment.settings)
            known: set[str] = set()
            yield lambda menus=None: database_store(engine, TOPOLOGY, None, known if menus is None else menus)
    finally:
        await deployment.cleanup()


def turn(session_id: str) -> StartTurn:
    return StartTurn(session_id=session_id, text="hi")


async def opened(stores, session_id: str) -> None:
    async with stores() as store:
        await store.receive_and_lock(turn(session_id), create_with_provider="scripted")
        await store.commit()


# --- receiving -------------------------------------------------------------------


async def test_a_message_is_received_once_and_a_turn_opens_its_session_idle(stores):
    session_id = mint("ses")
    message = turn(session_id)
    async with stores() as store:
        session = await store.receive_and_lock(message, create_with_provider="scripted")
        assert session is not None
        assert (session.id, session.status, session.provider, session.event_seq) == (session_id, "idle", "scripted", 0)
        await store.commit()
    async with stores() as store:
        with pytest.raises(Duplicate):
            await store.receive_and_lock(message, create_with_provider="scripted")


async def test_a_message_for_no_session_that_may_not_open_one_finds_none_and_leaves_none(stores):
    session_id = mint("ses")
    async with stores() as store:
        assert await store.receive_and_lock(turn(session_id)) is None
        await store.commit()
    async with stores() as store:
        assert await store.lock_session(session_id) is None


async def test_a_duplicate_inside_a_transaction_that_goes_on_leaves_no_session_behind(stores):
    first, other = turn(mint("ses")), turn(mint("ses"))
    async with stores() as store:
        await store.receive_and_lock(first, create_with_provider="scripted")
        await store.settle()
        await store.commit()
    duplicate = first.model_copy(update={"session_id": mint("ses")})
    async with stores() as store:
        with pytest.raises(Duplicate):
            await store.receive_and_lock(duplicate, create_with_provider="scripted")
        await store.receive_and_lock(other, create_with_provider="scripted")
        await store.settle()
        await store.commit()
    async with stores() as store:
        assert await store.lock_session(duplicate.session_id) is None
        assert await store.lock_session(other.session_id) is not None


# --- commit and rollback ------------------------------------------------------------


async def test_what_was_not_committed_is_gone_inbox_row_included(stores):
    session_id = mint("ses")
    message = turn(session_id)
    async with stores() as store:
        session = await store.receive_and_lock(message, create_with_provider="scripted")
        store.add("turns", _turn_row(session_id, "trn_gone", store))
        session.status = "running"
    async with stores() as store:
        # Received again: the first never happened.
        session = await store.receive_and_lock(message, create_with_provider="scripted")
        assert session.status == "idle"
        assert tuple(await store.open_turn(session_id)) == (None, None, [])


async def test_nothing_collected_is_visible_before_commit_and_the_session_row_is_written_once_at_commit(stores):
    session_id = mint("ses")
    await opened(stores, session_id)
    async with stores() as store:
        session = await store.lock_session(session_id)
        store.add("turns", _turn_row(session_id, "trn_1", store))
        # Collected, not written: a read of this transaction does not see it.
        assert await store.turn_starter("trn_1") is None
        session.status = "running"
        store.emit(session, ToolCallClosed(session_id=session_id, call_id="call_x", kind="output"))
        await store.commit()
    async with stores() as store:
        session = await store.lock_session(session_id)
        assert (session.status, session.event_seq) == ("running", 1)
        assert await store.turn_starter("trn_1") == "ann"


async def test_a_settled_transition_is_seen_by_the_next_in_the_same_transaction(stores):
    session_id = mint("ses")
    await opened(stores, session_id)
    async with stores() as store:
        session = await store.lock_session(session_id)
        store.add("turns", _turn_row(session_id, "trn_1", store))
        session.status = "running"
        await store.settle()
        again = await store.lock_session(session_id)
        assert again.status == "running"
        assert await store.turn_starter("trn_1") == "ann"
        await store.commit()


# --- locking and ordering -------------------------------------------------------------


async def test_a_sessions_transitions_are_serialized_the_second_seeing_what_the_first_committed(stores):
    session_id = mint("ses")
    await opened(stores, session_id)
    order = []

    async def bump(name: str, hold: float) -> None:
        async with stores() as store:
            session = await store.lock_session(session_id)
            order.append((name, session.event_seq))
            store.emit(session, ToolCallClosed(session_id=session_id, call_id=mint("call"), kind="output"))
            await asyncio.sleep(hold)
            await store.commit()

    first = asyncio.create_task(bump("first", 0.3))
    await asyncio.sleep(0.1)
    await bump("second", 0)
    await first
    assert order == [("first", 0), ("second", 1)]


# --- the audit chain's head --------------------------------------------------------------


async def test_each_audit_entry_chains_to_the_last_and_the_head_travels_in_the_session_row(stores):
    session_id = mint("ses")
    await opened(stores, session_id)
    async with stores() as store:
        session = await store.lock_session(session_id)
        store.audit(session, session_id, "turn.started", subject="trn_1")
        first = (session.audit_seq, session.audit_hash)
        store.audit(session, session_id, "turn.ended", subject="trn_1")
        assert session.audit_seq == first[0] + 1 == 2
        await store.commit()
        head = (session.audit_seq, session.audit_hash)
    async with stores() as store:
        session = await store.lock_session(session_id)
        assert (session.audit_seq, session.audit_hash) == head
        expected = audit.chained(
            session_id=session_id, head=head, kind="k", subject=None, actor=None, message_id=None, detail={},
            at=store.now,
        )
        store.audit(session, session_id, "k")
        assert (session.audit_seq, session.audit_hash) == (expected["session_seq"], expected["hash"])


# --- every read -----------------------------------------------------------------------


async def seeded(stores) -> dict:
    """A session with a running turn whose latest step has three calls: one awaiting
    approval (its request pending, approved once of two, due and escalation-due), one
    closed with its output after a decision with a note, one executing with a finished
    claim; provider attempts and a transcript of two entries."""
    session_id = mint("ses")
    await opened(stores, session_id)
    async with stores() as store:
        session = await store.lock_session(session_id)
        at = store.now
        earlier = at - timedelta(minutes=5)
        store.add("turns", _turn_row(session_id, "trn_1", store, created_at=earlier))
        for step_id, status, created in (("stp_1", "completed", earlier), ("stp_2", "requested", at)):
            store.add(
                "steps",
                {"id": step_id, "session_id": session_id, "turn_id": "trn_1", "status": status,
                 "created_at": created, "completed_at": None},
            )
        for position, (call_id, status) in enumerate(
            (("call_a", "awaiting_approval"), ("call_b", "closed"), ("call_c", "executing"))
        ):
            store.add(
                "tool_calls",
                {"id": call_id, "session_id": session_id, "step_id": "stp_2", "position": position,
                 "provider_call_id": f"p{position}", "tool": "publish_post", "arguments": {"n": position},
                 "args_digest": "d", "status": status, "idempotency_key": f"idk_{position}", "created_at": at},
            )
        for request_id, call_id, status, created in (
            ("apr_a", "call_a", "pending", earlier),
            ("apr_b", "call_b", "approved", at),
        ):
            store.add(
                "approval_requests",
                {"id": request_id, "call_id": call_id, "session_id": session_id, "status": status,
                 "args_digest": "d", "card": {"title": request_id}, "response_token_hash": "h",
                 "token_used_at": None, "created_at": created, "expires_at": earlier,
                 "escalate_at": earlier, "escalated_at": None, "turn_id": "trn_1", "step_id": "stp_2",
                 "attempt": 1, "run_id": "run_1", "call_seal": "seal"},
            )
        store.add(
            "approvals",
            {"request_id": "apr_a", "responder": "alice", "response_id": "rsp_a", "message_id": "msg_a",
             "channel": "chat", "reason": "", "message": "", "approved_at": at},
        )
        store.add(
            "decisions",
            {"request_id": "apr_b", "decision": "approve", "reason": "", "message": "careful",
             "responder": "bob", "message_id": "msg_b", "response_id": "rsp_b", "channel": "chat", "decided_at": at},
        )
        store.add(
            "closures",
            {"call_id": "call_b", "session_id": session_id, "kind": "output", "reason_code": None,
             "reason_text": None, "output": {"value": {"posted": True}}, "created_at": at},
        )
        for number, tokens in ((1, 10), (2, 20)):
            store.add(
                "provider_attempts",
                {"session_id": session_id, "step_id": "stp_1", "number": number, "status": "completed",
                 "provider": "scripted", "input_tokens": tokens, "output_tokens": 1,
                 "report_message_id": "msg_r", "recorded_at": at},
            )
        for position in (1, 2):
            store.add("transcript", {"session_id": session_id, "position": position, "entry": {"n": position}})
        session.transcript_len = 2
        store.add(
            "execution_claims",
            {"call_id": "call_c", "idempotency_key": "idk_2", "status": "finished", "holder": "executor-1",
             "lease_expires_at": at, "attempts": 1, "outcome": "output", "result": {"output": "done"},
             "claimed_at": earlier, "finished_at": at, "authorization": "token"},
        )
        await store.commit()
    return {"session_id": session_id, "at": at, "earlier": earlier}


def _turn_row(session_id: str, turn_id: str, store: LedgerStore, created_at=None) -> dict:
    return {"id": turn_id, "session_id": session_id, "status": "running", "final_text": None,
            "started_by": "ann", "created_at": created_at or store.now, "completed_at": None,
            "idempotency_key": f"key-{turn_id}", "text_digest": "sha256:text"}


def _calls(session_id: str) -> list[Call]:
    def one(n: int, status: str, closure=None, note=None) -> Call:
        return Call(id=f"call_{'abc'[n]}", session_id=session_id, step_id="stp_2", turn_id="trn_1",
                    provider_call_id=f"p{n}", tool="publish_post", arguments={"n": n}, idempotency_key=f"idk_{n}",
                    status=status, closure=closure, note=note)

    return [
        one(0, "awaiting_approval"),
        one(1, "closed", ClosureOnRecord("output", {"posted": True}), Note("bob", "careful")),
        one(2, "executing"),
    ]


async def test_every_read_returns_the_same_typed_values(stores):
    seed = await seeded(stores)
    session_id = seed["session_id"]
    async with stores() as store:
        session = await store.lock_session(session_id)
        read = await store.step("stp_2", session_id)
        assert (read.step, read.session_waits) == (Step("stp_2", session_id, "trn_1", "requested"), True)
        assert (await store.step("stp_none", session_id)).step is None
        siblings = await store.call_and_siblings("call_c", session_id)
        assert (siblings.calls, siblings.session_waits) == (_calls(session_id), True)
        assert (await store.call_and_siblings("call_none", session_id)).calls == []
        request, step = await store.request_and_calls("apr_a", session_id, "alice")
        assert request is not None
        assert (request.id, request.status, request.call_id, request.tool, request.approvals) == (
            "apr_a", "pending", "call_a", "publish_post", 1,
        )
        assert (request.approved_by_responder, request.escalated, request.token_used) == (True, False, False)
        assert (request.starters, request.card) == (frozenset({"ann"}), {"title": "apr_a"})
        # The session waits on no request besides this one.
        assert (step.calls, step.session_waits) == (_calls(session_id), False)
        other, _ = await store.request_and_calls("apr_a", session_id, "carol")
        assert other.approved_by_responder is False
        nothing = await store.call_and_siblings("call_none", session_id)
        assert await store.request_and_calls("apr_none", session_id, "alice") == (None, nothing)
        later = seed["at"] + timedelta(seconds=1)
        assert await store.due_requests(later) == [("apr_a", session_id)]
        assert await store.due_requests(seed["earlier"] - timedelta(seconds=1)) == []
        assert await store.due_escalations(later) == [("apr_a", session_id)]
        turn_id, latest, calls = await store.open_turn(session_id)
        assert (turn_id, latest) == ("trn_1", Step("stp_2", session_id, "trn_1", "requested"))
        assert calls == _calls(session_id)
        assert await store.turn_starter("trn_1") == "ann"
        assert await store.turn_of_key(session_id, "key-trn_1") == KeyedTurn("trn_1", "ann", "sha256:text")
        assert await store.turn_of_key(session_id, "key-none") is None
        assert await store.pending_tools(session_id) == [("publish_post", False)]
        assert await store.response_used("rsp_a") and await store.response_used("rsp_b")
        assert not await store.response_used("rsp_none")
        assert await store.pending_request_ids(session_id) == ["apr_a"]
        assert await store.turn_spend(session_id, "trn_1") == TurnSpend(2, 2, 32)
        claim = await store.claim("call_c")
        assert (claim.status, claim.outcome, claim.result, claim.holder, claim.authorization) == (
            "finished", "output", {"output": "done"}, "executor-1", "token",
        )
        assert await store.claim("call_a") is None
        assert await store.transcript_entries(session_id, 2) == [{"n": 1}, {"n": 2}]
        assert await store.transcript_rows(session) == [{"n": 1}, {"n": 2}]


async def test_the_claim_and_turn_spend_a_call_read_carries_are_the_ones_read_alone(stores):
    """`call_and_siblings` carries the call's claim and its turn's spend for the
    transition's next reads (one statement on the databases): they answer as read alone."""
    seed = await seeded(stores)
    session_id = seed["session_id"]
    async with stores() as store:
        await store.lock_session(session_id)
        alone = (await store.claim("call_c"), await store.claim("call_a"), await store.turn_spend(session_id, "trn_1"))
    for call_id, claimed in (("call_c", alone[0]), ("call_a", alone[1])):
        async with stores() as store:
            await store.lock_session(session_id)
            await store.call_and_siblings(call_id, session_id)
            assert await store.claim(call_id) == claimed
            assert await store.turn_spend(session_id, "trn_1") == alone[2] == TurnSpend(2, 2, 32)
            # A locked read (a hold-back) is never answered by what was carried.
            assert await store.claim(call_id, lock=True) == claimed


async def test_whether_a_response_was_used_as_a_request_read_carries_it_is_as_read_alone(stores):
    seed = await seeded(stores)
    session_id = seed["session_id"]
    for request_id, response_id, used in (("apr_a", "rsp_a", True), ("apr_a", "rsp_b", True), ("apr_a", "rsp_new", False)):
        async with stores() as store:
            await store.lock_session(session_id)
            request, _ = await store.request_and_calls(request_id, session_id, "alice", response_id=response_id)
            assert request is not None and request.id == request_id
            assert await store.response_used(response_id) is used
            # Asked again it reads alone, and answers the same.
            assert await store.response_used(response_id) is used
    async with stores() as store:
        await store.lock_session(session_id)
        assert await store.request_and_calls("apr_none", session_id, "alice", response_id="rsp_a") == (
            None, await store.call_and_siblings("call_none", session_id),
        )
        assert await store.response_used("rsp_a") is True


async def test_a_later_turn_of_a_session_finds_its_row_as_stored_and_locked(stores):
    session_id = mint("ses")
    await opened(stores, session_id)
    async with stores() as store:
        session = await store.lock_session(session_id)
        store.emit(session, ToolCallClosed(session_id=session_id, call_id=mint("call"), kind="output"))
        await store.commit()
    order = []

    async def later_turn(name: str, hold: float) -> None:
        async with stores() as store:
            session = await store.receive_and_lock(turn(session_id), create_with_provider="other")
            assert session is not None and (session.provider, session.status) == ("scripted", "idle")
            order.append((name, session.event_seq))
            store.emit(session, ToolCallClosed(session_id=session_id, call_id=mint("call"), kind="output"))
            await asyncio.sleep(hold)
            await store.commit()

    first = asyncio.create_task(later_turn("first", 0.3))
    await asyncio.sleep(0.1)
    await later_turn("second", 0)
    await first
    assert order == [("first", 1), ("second", 2)]


async def test_a_withdrawn_request_and_a_held_back_claim_are_written_at_commit(stores):
    seed = await seeded(stores)
    session_id = seed["session_id"]
    async with stores() as store:
        await store.lock_session(session_id)
        store.withdraw_request("call_a")
        held = await store.hold_back(Call(id="call_new", session_id=session_id, step_id="stp_2", turn_id="trn_1",
                                          provider_call_id="p9", tool="t", arguments={}, idempotency_key="idk_9",
                                          status="executing"))
        assert held is None
        finished = await store.hold_back(_calls(session_id)[2])
        assert finished.holder == "executor-1"
        # Collected: not yet written.
        assert await store.pending_request_ids(session_id) == ["apr_a"]
        assert await store.claim("call_new") is None
        store.update("approval_requests", "apr_b", escalated_to=["lena"])
        await store.commit()
    async with stores() as store:
        assert await store.pending_request_ids(session_id) == []
        claim = await store.claim("call_new")
        assert (claim.holder, claim.status, claim.outcome, claim.result) == (
            "ledger", "finished", "error", {"error": CANCELLED_BEFORE_RUNNING},
        )


MENU = ToolMenu.of([
    ToolDescription(name="send", description="Sends money, é.", parameters={"type": "object", "properties": {
        "amount": {"type": "number", "maximum": 1e6}, "to": {"type": "string"}}}),
    ToolDescription(name="look", description="Looks.", parameters={"type": "object", "additionalProperties": False}),
])


async def test_a_tool_menu_is_stored_with_the_transaction_that_keeps_it_and_known_stored_only_once_it_commits(stores):
    session_id = mint("ses")
    await opened(stores, session_id)
    async with stores() as store:
        session = await store.lock_session(session_id)
        store.keep_tool_menu(MENU)
        store.emit(session, ToolCallClosed(session_id=session_id, call_id="call_x", kind="output"))
        # Rolled back: nothing stored, and not known as stored.
    async with stores() as store:
        assert await store.tool_menu(MENU.digest) is None
        assert MENU.digest not in store.stored_menus
        await store.lock_session(session_id)
        store.keep_tool_menu(MENU)
        store.keep_tool_menu(MENU)  # a second step of the same transaction: one row
        await store.commit()
    async with stores() as store:
        assert MENU.digest in store.stored_menus
        assert await store.tool_menu(MENU.digest) == MENU.descriptions, "read back as it was stored"


async def test_a_tool_menu_another_ledger_stored_is_kept_again_without_failing_and_stays_as_it_was(stores):
    session_id = mint("ses")
    await opened(stores, session_id)
    async with stores() as store:
        await store.lock_session(session_id)
        store.keep_tool_menu(MENU)
        await store.commit()
    # Another ledger process (or this one restarted) knows nothing: it stores the menu again, if absent.
    other: set[str] = set()
    async with stores(other) as store:
        session = await store.lock_session(session_id)
        store.keep_tool_menu(MENU)
        store.emit(session, ToolCallClosed(session_id=session_id, call_id="call_x", kind="output"))
        await store.settle()
        await store.commit()
    assert other == {MENU.digest}
    async with stores() as store:
        assert await store.tool_menu(MENU.digest) == MENU.descriptions
        assert (await store.lock_session(session_id)).event_seq == 1, "the transaction that kept it committed"


async def test_a_restarted_count_withdraws_the_requests_approvals_before_the_same_persons_new_one_goes_in(stores):
    """An edit restarts a request's count: its approvals so far go, and the editor's own
    approval of the edited version goes in, in the same transition, also when the editor
    is one who approved before (the same request and person: PostgreSQL must delete first)."""
    seed = await seeded(stores)
    session_id = seed["session_id"]
    async with stores() as store:
        await store.lock_session(session_id)
        store.add(
            "approvals",
            {"request_id": "apr_a", "responder": "bob", "response_id": "rsp_a2", "message_id": "msg_a2",
             "channel": "chat", "reason": "", "message": "", "approved_at": store.now},
        )
        store.add(
            "approvals",
            {"request_id": "apr_b", "responder": "bob", "response_id": "rsp_b2", "message_id": "msg_b2",
             "channel": "chat", "reason": "", "message": "", "approved_at": store.now},
        )
        await store.commit()
    async with stores() as store:
        await store.lock_session(session_id)
        store.restart_count("apr_a")
        store.add(
            "approvals",
            {"request_id": "apr_a", "responder": "alice", "response_id": "rsp_a3", "message_id": "msg_a3",
             "channel": "chat", "reason": "", "message": "", "approved_at": store.now},
        )
        # Collected: not yet written.
        request, _ = await store.request_and_calls("apr_a", session_id, "bob")
        assert (request.approvals, request.approved_by_responder) == (2, True)
        await store.commit()
    async with stores() as store:
        request, _ = await store.request_and_calls("apr_a", session_id, "bob")
        assert (request.approvals, request.approved_by_responder) == (1, False)
        request, _ = await store.request_and_calls("apr_a", session_id, "alice")
        assert (request.approvals, request.approved_by_responder) == (1, True)
        assert await store.response_used("rsp_a3") and not await store.response_used("rsp_a2")
        # Another request's approvals are not touched.
        other, _ = await store.request_and_calls("apr_b", session_id, "bob")
        assert (other.approvals, other.approved_by_responder) == (1, True)


@pytest.mark.parametrize("stores", ["memory", "postgres"], indirect=True)
async def test_an_executor_claiming_between_hold_backs_read_and_its_commit_fails_the_commit_and_the_retry_finds_its_claim(
    stores,
):
    # The race `LedgerStore.hold_back` leaves to the claim's primary key: its locked read
    # finds no claim (nothing to lock), the executor claims the call and commits, then the
    # ledger's commit must fail rather than overwrite or ignore the executor's claim, and the
    # transition applied again reads the executor's claim. (SQLite cannot interleave so: the
    # ledger's transaction holds the one writer from its inbox row on.)
    seed = await seeded(stores)
    session_id = seed["session_id"]
    call = Call(id="call_new", session_id=session_id, step_id="stp_2", turn_id="trn_1", provider_call_id="p9",
                tool="t", arguments={}, idempotency_key="idk_9", status="executing")
    async with stores() as ledger:
        await ledger.lock_session(session_id)
        assert await ledger.hold_back(call) is None
        async with stores() as executor:
            executor.add(
                "execution_claims",
                {"call_id": "call_new", "idempotency_key": "idk_9", "status": "claimed", "holder": "executor-2",
                 "lease_expires_at": executor.now + timedelta(minutes=1), "attempts": 1, "outcome": None,
                 "result": None, "claimed_at": executor.now, "finished_at": None, "authorization": "token"},
            )
            await executor.commit()
        with pytest.raises(Exception):  # noqa: B017 - each adapter's own duplicate-key error
            await ledger.commit()
    async with stores() as retried:
        await retried.lock_session(session_id)
        claim = await retried.hold_back(call)
        assert claim is not None and (claim.holder, claim.status) == ("executor-2", "claimed")
        await retried.commit()
    async with stores() as store:
        claim = await store.claim("call_new")
        assert (claim.holder, claim.status) == ("executor-2", "claimed")
