"""The ledger's handlers on the in-memory store: every message type the ledger takes,
its refusals and its closures, in milliseconds (no database, no broker, no processes).

Each test drives the handlers as the ledger's consumers do (one message, one
transition) and reads what they committed: the rows of the memory database and the
outbox's events. The same handlers run on PostgreSQL and SQLite in the integration
and crash tests; the stores' likeness is tests/integration/test_ledger_store_contract.py's.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from functools import partial

import pytest

from services.approval_ledger import domain, handlers
from services.approval_ledger.authority import Authority
from services.approval_ledger.handlers import Ledger
from services.approval_ledger.store import Duplicate
from services.approval_ledger.store_memory import MemoryDatabase
from shared.audit import digest_of
from shared.catalogue import ToolCatalogue
from shared.consuming import sender
from shared.dead_letters import UNPROVEN, ParkedMessage
from shared.keyring import Channel
from shared.messages import (
    CancelTurn,
    ModelStepCompleted,
    ProposedToolCall,
    ProviderAttempt,
    RefuseExecution,
    RespondToApproval,
    StartTurn,
    ToolExecuted,
    Usage,
    mint,
    now,
)
from shared.signatures import new_private_key, sign, unseal
from shared.topology import Topology

CHANNEL_KEY = new_private_key()
LEDGER_KEY = new_private_key()
RUNS = {"kind": "python", "function": "services.tool_executor.builtin:read_clock"}
CATALOGUE = ToolCatalogue.model_validate(
    {
        "groups": {"leads": ["lena"]},
        "tools": [
            {"name": "publish_post", "label": "Publish", "implementation": RUNS, "approval": "always",
             "effect": "outward", "parameters": {"type": "object", "properties": {"title": {"type": "string"}}}},
            {"name": "read_clock", "label": "Clock", "implementation": RUNS, "approval": "never", "effect": "read"},
            {"name": "count", "label": "Count", "implementation": RUNS, "approval": "always", "effect": "idempotent"},
            {"name": "wire_money", "label": "Wire", "implementation": RUNS, "approval": "always", "effect": "outward",
             "approvers": ["alice", "bob"], "approvals_required": 2},
            {"name": "deploy", "label": "Deploy", "implementation": RUNS, "approval": "always", "effect": "outward",
             "approvers": ["alice"], "escalation": {"after_seconds": 60, "to": ["group:leads"]}},
        ],
    }
)
AUTHORITY = Authority(
    signing_key=LEDGER_KEY,
    digest_key=b"d" * 32,
    channels={"chat": Channel("chat", CHANNEL_KEY.public_key(), ("alice", "bob", "carol", "lena", "ann"))},
    response_window=timedelta(minutes=5),
    authorization_ttl=timedelta(minutes=5),
)
TOPOLOGY = Topology("unit")


class Rig:
    """One ledger on one memory database, and what it said."""

    def __init__(self, catalogue: ToolCatalogue = CATALOGUE, **options) -> None:
        self.database = MemoryDatabase()
        self.ledger = Ledger(
            open_store=partial(self.database.store, TOPOLOGY, None),
            topology=TOPOLOGY,
            catalogue=catalogue,
            authority=AUTHORITY,
            default_provider="scripted",
            check_senders=False,
            **options,
        )
        self.session_id = mint("ses")

    def rows(self, table: str, **where) -> list[dict]:
        return [r for r in self.database.rows(table) if all(r.get(k) == v for k, v in where.items())]

    def events(self, message_type: str) -> list[dict]:
        bodies = [json.loads(r["body"]) for r in self.database.rows("outbox")]
        return [b for b in bodies if b["type"] == message_type]

    def last(self, message_type: str) -> dict:
        return self.events(message_type)[-1]

    def session(self) -> dict:
        [row] = self.rows("sessions", id=self.session_id)
        return row

    async def start(self, text: str = "hello", **fields) -> str:
        """A turn (ann's unless said); the step it asks for."""
        fields.setdefault("started_by", "ann")
        await handlers.start_turn(self.ledger, StartTurn(session_id=self.session_id, text=text, **fields))
        return self.last("step.requested")["step_id"]

    async def report(self, step_id: str, *calls: ProposedToolCall, **fields) -> ModelStepCompleted:
        fields.setdefault("attempts", [ProviderAttempt(number=1, status="completed", provider="scripted")])
        report = ModelStepCompleted(session_id=self.session_id, step_id=step_id, tool_calls=list(calls), **fields)
        await handlers.model_step_completed(self.ledger, report)
        return report

    async def ask(self, tool: str = "publish_post", **arguments) -> dict:
        """A turn whose model asks for one call that needs approval; its approval.requested."""
        step_id = await self.start()
        await self.report(step_id, call(tool, **arguments))
        return self.last("approval.requested")

    def response(self, requested: dict, decision: str = "approve", responder: str = "alice", **fields):
        response = RespondToApproval(
            session_id=self.session_id,
            request_id=requested["request_id"],
            decision=decision,
            args_digest=requested["args_digest"],
            responder=responder,
            **fields,
        ).model_copy(update={"key_id": "chat"})
        return response.model_copy(update={"signature": sign(CHANNEL_KEY, response.signed_part())})

    async def respond(self, requested: dict, decision: str = "approve", responder: str = "alice", **fields):
        response = self.response(requested, decision, responder, **fields)
        await handlers.respond_to_approval(self.ledger, response)
        return response

    def claim(self, execute: dict, outcome: str = "output", **result) -> None:
        """The executor's finished claim on a call, taken under the ledger's authorization."""
        self.database.tables["execution_claims"][(execute["call_id"],)] = {
            "call_id": execute["call_id"],
            "idempotency_key": execute["idempotency_key"],
            "status": "finished",
            "holder": "executor-1",
            "lease_expires_at": now(),
            "attempts": 1,
            "outcome": outcome,
            "result": result or {"output": "done"},
            "claimed_at": now(),
            "finished_at": now(),
            "authorization": execute["authorization"],
        }

    async def executed(self, execute: dict, outcome: str = "output") -> ToolExecuted:
        report = ToolExecuted(session_id=self.session_id, call_id=execute["call_id"], outcome=outcome)
        await handlers.tool_executed(self.ledger, report)
        return report

    def overdue(self, requested: dict) -> None:
        """The request's deadline an hour ago: well past, whatever the wall clock did since
        (a 1 ms deadline failed under load when the machine's clock stepped back)."""
        self.database.tables["approval_requests"][(requested["request_id"],)]["expires_at"] = now() - timedelta(hours=1)

    def rejected(self) -> list[str]:
        return [e["reason_code"] for e in self.events("message.rejected")]


def call(tool: str, provider_call_id: str = "p1", **arguments) -> ProposedToolCall:
    return ProposedToolCall(provider_call_id=provider_call_id, name=tool, arguments=arguments)


@pytest.fixture
def rig() -> Rig:
    return Rig()


# --- turn.start -------------------------------------------------------------------


async def test_a_turn_opens_its_session_appends_the_users_words_and_asks_for_a_model_step(rig):
    step_id = await rig.start("hello", started_by="ann")
    session = rig.session()
    assert (session["status"], session["provider"], session["started_by"]) == ("running", "scripted", "ann")
    [entry] = rig.rows("transcript", session_id=rig.session_id)
    assert entry["entry"]["text"] == "hello"
    requested = rig.last("step.requested")
    assert (requested["step_id"], requested["transcript_length"]) == (step_id, 1)
    assert [a["kind"] for a in rig.rows("audit_log", session_id=rig.session_id)] == ["turn.started"]
    [turn] = rig.rows("turns", session_id=rig.session_id)
    assert (turn["status"], turn["started_by"]) == ("running", "ann")


async def test_a_model_step_names_the_catalogues_tool_menu_by_digest_stored_with_the_first_step_that_names_it(rig):
    step_id = await rig.start()
    requested = rig.last("step.requested")
    assert (requested["tools_digest"], requested["tools"]) == (CATALOGUE.menu.digest, [])
    [menu] = rig.rows("tool_menus")
    assert (menu["digest"], menu["descriptions"]) == (CATALOGUE.menu.digest, CATALOGUE.menu.descriptions)
    # Known stored now: the next step names it and writes nothing (a row gone behind the
    # ledger's back is not written again by this process).
    del rig.database.tables["tool_menus"][(CATALOGUE.menu.digest,)]
    await rig.report(step_id, call("read_clock"))
    [execute] = rig.events("tool.execute")
    rig.claim(execute)
    await rig.executed(execute)
    assert len(rig.events("step.requested")) == 2 and rig.last("step.requested")["tools_digest"] == CATALOGUE.menu.digest
    assert rig.rows("tool_menus") == []


async def test_a_reloaded_catalogues_menu_is_stored_with_its_first_step_and_named_from_then_on(rig):
    step_id = await rig.start()
    reloaded = ToolCatalogue.model_validate(
        {"tools": [{"name": "read_clock", "label": "Clock", "description": "What time it is, now.",
                    "implementation": RUNS, "approval": "never", "effect": "read"}]}
    )
    # As the ledger's SIGHUP takes it (services/approval_ledger/main.py): between two transitions.
    rig.ledger.catalogue = reloaded
    await rig.report(step_id, call("read_clock"))
    [execute] = rig.events("tool.execute")
    rig.claim(execute)
    await rig.executed(execute)
    assert [e["tools_digest"] for e in rig.events("step.requested")] == [CATALOGUE.menu.digest, reloaded.menu.digest]
    stored = {row["digest"]: row["descriptions"] for row in rig.rows("tool_menus")}
    assert stored == {CATALOGUE.menu.digest: CATALOGUE.menu.descriptions,
                      reloaded.menu.digest: reloaded.menu.descriptions}


async def test_a_turn_on_a_busy_session_is_refused_as_session_busy(rig):
    await rig.start()
    await rig.start()
    assert rig.rejected() == ["session_busy"]
    assert len(rig.rows("turns", session_id=rig.session_id)) == 1


async def test_a_busy_refusal_names_the_turn_that_keeps_the_session_busy(rig):
    await rig.start()
    [turn] = rig.rows("turns", session_id=rig.session_id)
    await handlers.start_turn(rig.ledger, StartTurn(session_id=rig.session_id, text="again", started_by="ann"))
    assert turn["id"] in rig.last("message.rejected")["reason_text"]


async def test_a_start_with_a_key_already_used_starts_nothing_and_is_answered_with_that_turn_even_after_it_ended(rig):
    step_id = await rig.start("hello", idempotency_key="k-1")
    await rig.report(step_id)  # no calls: the turn completes, the session is idle
    [turn] = rig.rows("turns", session_id=rig.session_id)
    assert (turn["status"], turn["idempotency_key"]) == ("completed", "k-1")
    # Another message (a fresh message id: the inbox cannot tell) with the same key.
    repeat = StartTurn(session_id=rig.session_id, text="hello", started_by="ann", idempotency_key="k-1")
    await handlers.start_turn(rig.ledger, repeat)
    assert len(rig.rows("turns", session_id=rig.session_id)) == 1
    assert len(rig.events("step.requested")) == 1, "no model step for the repeat"
    assert (rig.last("turn.repeated")["turn_id"], rig.last("turn.repeated")["causation_id"]) == (
        turn["id"], repeat.message_id)
    [entry] = [a for a in rig.rows("audit_log", session_id=rig.session_id) if a["kind"] == "turn.repeated"]
    assert (entry["subject"], entry["message_id"]) == (turn["id"], repeat.message_id)
    for other in ({"text": "something else", "started_by": "ann"}, {"text": "hello", "started_by": "bob"}):
        await handlers.start_turn(rig.ledger, StartTurn(session_id=rig.session_id, idempotency_key="k-1", **other))
    assert rig.rejected() == ["idempotency_key_reused", "idempotency_key_reused"]
    assert len(rig.rows("turns", session_id=rig.session_id)) == 1


async def test_a_redelivered_message_changes_nothing_the_second_time(rig):
    turn = StartTurn(session_id=rig.session_id, text="hi")
    await handlers.start_turn(rig.ledger, turn)
    before = len(rig.database.rows("outbox"))
    await handlers.start_turn(rig.ledger, turn)
    assert len(rig.database.rows("outbox")) == before
    assert len(rig.rows("inbox", message_id=turn.message_id)) == 1


async def test_a_turn_names_its_provider_and_otherwise_takes_the_default():
    rig = Rig()
    await rig.start(provider="other")
    assert rig.session()["provider"] == "other"


async def test_only_a_turn_may_open_a_session_and_a_message_for_none_is_refused_without_one(rig):
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="ann"))
    assert rig.rejected() == ["unknown_session"]
    assert rig.rows("sessions", id=rig.session_id) == []


async def test_a_message_from_a_sender_that_may_not_send_it_is_refused_and_opens_no_session():
    rig = Rig()
    rig.ledger.check_senders = True
    token = sender.set("unit.model-step")
    try:
        await handlers.start_turn(rig.ledger, StartTurn(session_id=rig.session_id, text="hi"))
    finally:
        sender.reset(token)
    assert rig.rejected() == ["unauthorized_sender"]
    assert rig.rows("sessions", id=rig.session_id) == []


# --- step.completed ---------------------------------------------------------------


async def test_a_step_without_calls_completes_the_turn_and_the_session_is_idle(rig):
    step_id = await rig.start()
    await rig.report(step_id, text="all done")
    assert rig.last("turn.completed")["text"] == "all done"
    assert rig.session()["status"] == "idle"
    [step] = rig.rows("steps", id=step_id)
    assert step["status"] == "completed"
    [attempt] = rig.rows("provider_attempts", step_id=step_id)
    assert attempt["status"] == "completed"


async def test_a_provider_error_fails_the_turn_as_provider_failed(rig):
    step_id = await rig.start()
    await rig.report(step_id, error="the provider is down")
    failed = rig.last("turn.failed")
    assert (failed["reason_code"], failed["reason_text"]) == ("provider_failed", "the provider is down")
    [turn] = rig.rows("turns", session_id=rig.session_id)
    assert (turn["status"], turn["reason_code"]) == ("failed", "provider_failed")
    assert rig.session()["status"] == "idle"


async def test_a_report_for_an_unknown_step_is_refused_as_unknown_step(rig):
    await rig.start()
    await rig.report(mint("stp"))
    assert rig.rejected() == ["unknown_step"]


async def test_a_second_report_for_a_step_is_discarded_with_its_attempts_counted(rig):
    step_id = await rig.start()
    await rig.report(step_id, text="first")
    await rig.report(step_id, text="second")
    assert [e["text"] for e in rig.events("turn.completed")] == ["first"]
    assert [a["status"] for a in rig.rows("provider_attempts", step_id=step_id)] == ["completed", "discarded"]


async def test_a_call_that_needs_approval_asks_a_person_and_the_session_waits(rig):
    requested = await rig.ask(title="Hi")
    assert rig.session()["status"] == "waiting"
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    assert (request["status"], request["call_id"]) == ("pending", requested["call_id"])
    assert requested["pending_request_ids"] == [requested["request_id"]]
    [row] = rig.rows("tool_calls", id=requested["call_id"])
    assert row["status"] == "awaiting_approval"
    assert request["response_token_hash"] == domain.token_hash(requested["response_token"])


async def test_a_call_allowed_by_policy_runs_at_once_sealed_by_the_ledger(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    assert unseal(LEDGER_KEY.public_key(), execute["authorization"])["basis"] == "policy"
    [row] = rig.rows("tool_calls", id=execute["call_id"])
    assert row["status"] == "executing"
    assert rig.session()["status"] == "running"


async def test_a_call_of_an_unknown_tool_closes_at_once_and_the_model_is_asked_again(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("no_such_tool"))
    [closure] = rig.rows("closures", session_id=rig.session_id)
    assert (closure["kind"], closure["reason_code"]) == ("error", "unknown_tool")
    assert len(rig.events("step.requested")) == 2


async def test_a_later_step_names_the_requests_the_session_already_waits_on(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("publish_post", "p1", title="a"), call("read_clock", "p2"))
    first = rig.last("approval.requested")
    execute = rig.last("tool.execute")
    rig.claim(execute)
    await rig.executed(execute)
    assert rig.session()["status"] == "waiting"
    assert rig.last("approval.requested")["pending_request_ids"] == [first["request_id"]]


async def test_a_turn_at_its_step_bound_ends_as_step_limit_and_tells_an_operator():
    rig = Rig(turn_bounds=domain.TurnBounds(steps=1))
    step_id = await rig.start()
    usage = Usage(input_tokens=5, output_tokens=5)
    await rig.report(
        step_id,
        call("read_clock"),
        attempts=[ProviderAttempt(number=1, status="completed", provider="scripted", usage=usage)],
    )
    execute = rig.last("tool.execute")
    rig.claim(execute)
    await rig.executed(execute)
    assert rig.last("turn.failed")["reason_code"] == domain.STEP_LIMIT
    assert rig.last("operator.alerted")["reason_code"] == domain.STEP_LIMIT
    assert len(rig.events("step.requested")) == 1


# --- approval.respond -------------------------------------------------------------


async def test_an_approval_decides_the_request_and_sends_the_call_to_the_executor_sealed_for_it(rig):
    requested = await rig.ask(title="Hi")
    response = await rig.respond(requested, message="go ahead")
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    assert (request["status"], request["token_used_at"]) == ("approved", None)
    [decision] = rig.rows("decisions", request_id=requested["request_id"])
    assert (decision["decision"], decision["responder"], decision["response_id"]) == (
        "approve",
        "alice",
        response.response_id,
    )
    execute = rig.last("tool.execute")
    sealed = unseal(LEDGER_KEY.public_key(), execute["authorization"])
    assert (sealed["basis"], sealed["request_id"]) == ("approval", requested["request_id"])
    assert rig.last("approval.decided")["decision"] == "approve"
    assert rig.session()["status"] == "running"


async def test_a_denial_closes_the_call_as_denied_and_the_model_is_told(rig):
    requested = await rig.ask(title="Hi")
    await rig.respond(requested, "deny", reason="not today")
    [closure] = rig.rows("closures", call_id=requested["call_id"])
    assert (closure["kind"], closure["reason_text"]) == ("denied", "not today")
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "denied"
    assert len(rig.events("step.requested")) == 2
    assert rig.events("tool.execute") == []


async def test_an_unsigned_response_is_refused_as_unsigned(rig):
    requested = await rig.ask(title="Hi")
    unsigned = rig.response(requested).model_copy(update={"signature": None})
    await handlers.respond_to_approval(rig.ledger, unsigned)
    assert rig.rejected() == ["unsigned"]
    assert rig.rows("decisions") == []


async def test_a_response_id_used_once_is_refused_as_replayed_the_second_time(rig):
    requested = await rig.ask(tool="wire_money")
    first = await rig.respond(requested, responder="alice")
    again = rig.response(requested, responder="bob", response_id=first.response_id)
    await handlers.respond_to_approval(rig.ledger, again)
    assert rig.rejected() == ["replayed"]


async def test_a_response_to_an_unknown_request_is_refused_as_unknown_request(rig):
    requested = await rig.ask(title="Hi")
    await rig.respond({**requested, "request_id": mint("apr")})
    assert rig.rejected() == ["unknown_request"]


async def test_a_response_to_a_decided_request_is_refused_as_already_decided(rig):
    requested = await rig.ask(title="Hi")
    await rig.respond(requested)
    await rig.respond(requested)
    assert rig.rejected() == ["already_decided"]


async def test_a_response_for_other_arguments_than_shown_is_refused_as_digest_mismatch(rig):
    requested = await rig.ask(title="Hi")
    await rig.respond({**requested, "args_digest": "other"})
    assert rig.rejected() == ["digest_mismatch"]


async def test_a_responder_the_tool_does_not_name_is_refused(rig):
    requested = await rig.ask(tool="deploy")
    await rig.respond(requested, responder="carol")
    assert rig.rejected() == ["not_an_approver"]


async def test_an_approval_towards_a_request_needing_two_is_counted_and_the_second_decides(rig):
    requested = await rig.ask(tool="wire_money")
    await rig.respond(requested, responder="alice")
    counted = rig.last("approval.counted")
    assert (counted["count"], counted["required"]) == (1, 2)
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "pending"
    await rig.respond(requested, responder="alice")
    assert rig.rejected() == ["already_approved"]
    await rig.respond(requested, responder="bob")
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "approved"
    assert len(rig.rows("approvals", request_id=requested["request_id"])) == 2
    assert len(rig.events("tool.execute")) == 1


async def test_an_approval_of_a_call_whose_row_was_altered_closes_it_and_tells_an_operator(rig):
    requested = await rig.ask(title="Hi")
    rig.database.tables["tool_calls"][(requested["call_id"],)]["arguments"] = {"title": "Bye"}
    await rig.respond(requested)
    assert rig.rejected() == ["altered"]
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "altered"
    [closure] = rig.rows("closures", call_id=requested["call_id"])
    assert closure["reason_code"] == "altered"
    assert rig.last("operator.alerted")["reason_code"] == "altered"
    assert rig.events("tool.execute") == []


# --- tool.completed ---------------------------------------------------------------


async def test_a_tool_result_is_taken_from_the_executors_sealed_claim_and_the_step_resumes(rig):
    requested = await rig.ask(title="Hi")
    await rig.respond(requested)
    execute = rig.last("tool.execute")
    rig.claim(execute, output="posted")
    await rig.executed(execute)
    [closure] = rig.rows("closures", call_id=execute["call_id"])
    assert (closure["kind"], closure["output"]) == ("output", {"value": "posted"})
    assert rig.last("tool.closed")["kind"] == "output"
    assert len(rig.events("step.requested")) == 2
    kinds = [a["kind"] for a in rig.rows("audit_log", subject=execute["call_id"])]
    assert kinds[-3:] == ["execution.claimed", "execution.finished", "call.closed"]


async def test_a_tool_report_without_a_claim_is_refused_and_an_operator_is_told(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    await rig.executed(execute)
    assert rig.rejected() == ["not_claimed"]
    assert rig.last("operator.alerted")["reason_code"] == "not_claimed"
    assert rig.rows("closures") == []


async def test_a_tool_report_for_an_unknown_call_is_refused_as_unknown_call(rig):
    await rig.start()
    await rig.executed({"call_id": mint("call")})
    assert rig.rejected() == ["unknown_call"]


async def test_a_repeated_tool_report_for_a_closed_call_changes_nothing(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    rig.claim(execute)
    await rig.executed(execute)
    before = len(rig.database.rows("outbox"))
    await rig.executed(execute)
    assert len(rig.database.rows("outbox")) == before
    assert rig.rejected() == []


async def test_an_outcome_unknown_result_closes_its_call_so_and_tells_an_operator(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    rig.claim(execute, outcome="outcome_unknown", error="it stopped")
    await rig.executed(execute, outcome="outcome_unknown")
    [closure] = rig.rows("closures", call_id=execute["call_id"])
    assert closure["kind"] == "outcome_unknown"
    assert rig.last("operator.alerted")["reason_code"] == "outcome_unknown"


# --- execution.refused ------------------------------------------------------------


async def test_an_execution_the_executor_refused_is_audited_and_an_operator_is_told(rig):
    await rig.start()
    refusal = RefuseExecution(
        session_id=rig.session_id, call_id=mint("call"), tool="read_clock", reason_code="bad_seal", reason_text="no"
    )
    await handlers.execution_refused(rig.ledger, refusal)
    alerted = rig.last("operator.alerted")
    assert (alerted["reason_code"], alerted["call_id"]) == ("bad_seal", refusal.call_id)
    assert rig.rows("audit_log", kind="execution.refused")[0]["subject"] == refusal.call_id


# --- turn.cancel ------------------------------------------------------------------


async def test_cancelling_a_waiting_turn_withdraws_its_request_and_closes_its_call_as_cancelled(rig):
    requested = await rig.ask(title="Hi")
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="ann", reason="no"))
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "cancelled"
    [closure] = rig.rows("closures", call_id=requested["call_id"])
    assert (closure["kind"], closure["reason_text"]) == ("cancelled", "Cancelled by ann: no")
    assert rig.last("turn.cancelled")["cancelled_by"] == "ann"
    assert rig.session()["status"] == "cancelled"
    await rig.respond(requested)
    assert rig.rejected() == ["already_decided"]


async def test_cancelling_a_call_the_executor_has_not_taken_holds_its_claim_back(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="ann"))
    [claim] = rig.rows("execution_claims", call_id=execute["call_id"])
    assert (claim["holder"], claim["status"], claim["result"]) == (
        "ledger",
        "finished",
        {"error": domain.CANCELLED_BEFORE_RUNNING},
    )
    assert rig.rows("closures", call_id=execute["call_id"])[0]["kind"] == "cancelled"


async def test_cancelling_a_running_outward_call_closes_it_as_outcome_unknown_and_tells_an_operator(rig):
    requested = await rig.ask(title="Hi")
    await rig.respond(requested)
    execute = rig.last("tool.execute")
    rig.claim(execute)
    rig.database.tables["execution_claims"][(execute["call_id"],)]["status"] = "claimed"
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="ann"))
    assert rig.rows("closures", call_id=execute["call_id"])[0]["kind"] == "outcome_unknown"
    assert rig.last("operator.alerted")["reason_code"] == "outcome_unknown"


async def test_a_running_call_of_a_tool_no_longer_in_the_catalogue_counts_as_outward(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    rig.claim(execute)
    rig.database.tables["execution_claims"][(execute["call_id"],)]["status"] = "claimed"
    rig.ledger.catalogue = ToolCatalogue.model_validate({"tools": []})
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="ann"))
    assert rig.rows("closures", call_id=execute["call_id"])[0]["kind"] == "outcome_unknown"


async def test_cancelling_a_session_without_an_open_turn_is_refused_as_nothing_to_cancel(rig):
    step_id = await rig.start()
    await rig.report(step_id, text="done")
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="ann"))
    assert rig.rejected() == ["nothing_to_cancel"]


async def test_cancelling_another_persons_turn_is_refused(rig):
    await rig.start(started_by="ann")
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="mallory"))
    assert rig.rejected() == ["may_not_cancel"]


async def test_a_model_step_running_when_its_turn_is_cancelled_is_discarded_when_it_reports(rig):
    step_id = await rig.start()
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="ann"))
    assert rig.rows("steps", id=step_id)[0]["status"] == "cancelled"
    await rig.report(step_id, text="late")
    assert rig.events("turn.completed") == []


# --- the sweeps: expiry and escalation ----------------------------------------------


async def test_a_request_past_its_deadline_closes_as_expired_once(rig):
    requested = await rig.ask(title="Hi")
    rig.overdue(requested)
    [(request_id, session_id)] = await _due(rig, "due_requests")
    assert await handlers.expire_request(rig.ledger, request_id, session_id)
    assert not await handlers.expire_request(rig.ledger, request_id, session_id)
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "expired"
    assert rig.rows("closures", call_id=requested["call_id"])[0]["kind"] == "expired"
    assert len(rig.events("approval.expired")) == 1


async def test_a_request_before_its_deadline_does_not_expire(rig):
    requested = await rig.ask(title="Hi")
    assert not await handlers.expire_request(rig.ledger, requested["request_id"], rig.session_id)


async def test_a_request_is_escalated_once_to_its_tools_group_who_may_then_approve_it(rig):
    requested = await rig.ask(tool="deploy")
    assert await handlers.escalate_request(rig.ledger, requested["request_id"], rig.session_id)
    assert not await handlers.escalate_request(rig.ledger, requested["request_id"], rig.session_id)
    [escalated] = rig.events("approval.escalated")
    assert escalated["escalated_to"] == ["lena"]
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["escalated_to"] == ["lena"]
    await rig.respond(requested, responder="lena")
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "approved"


async def test_a_request_of_a_tool_without_escalation_or_no_longer_pending_is_not_escalated(rig):
    plain = await rig.ask(title="Hi")
    assert not await handlers.escalate_request(rig.ledger, plain["request_id"], rig.session_id)
    await rig.respond(plain)
    other = Rig()
    requested = await other.ask(tool="deploy")
    await other.respond(requested)
    assert not await handlers.escalate_request(other.ledger, requested["request_id"], other.session_id)


async def _due(rig: Rig, read: str) -> list[tuple[str, str]]:
    async with rig.ledger.unit_of_work() as store:
        return await getattr(store, read)(now() + timedelta(seconds=1))


# --- parked messages --------------------------------------------------------------


def parked(rig: Rig, message_type: str, **envelope) -> ParkedMessage:
    return ParkedMessage(
        message_id=mint("msg"),
        message_type=message_type,
        session_id=rig.session_id,
        reason="delivery_limit",
        detail="redelivered too often",
        consumer="unit",
        parked_at=now().isoformat(),
        envelope=envelope,
    )


async def test_a_parked_step_request_fails_the_turn_waiting_on_it(rig):
    step_id = await rig.start()
    await handlers.message_parked(rig.ledger, parked(rig, "step.requested", step_id=step_id))
    failed = rig.last("turn.failed")
    assert failed["reason_code"] == "message_parked"
    assert rig.session()["status"] == "idle"


async def test_a_parked_execution_fails_the_turn_and_holds_the_calls_claim_back(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    await handlers.message_parked(rig.ledger, parked(rig, "tool.execute", call_id=execute["call_id"]))
    assert rig.last("turn.failed")["reason_code"] == "message_parked"
    assert rig.rows("execution_claims", call_id=execute["call_id"])[0]["holder"] == "ledger"


async def test_a_parked_message_nothing_waits_on_changes_nothing(rig):
    await rig.start()
    before = len(rig.database.rows("outbox"))
    await handlers.message_parked(rig.ledger, parked(rig, "approval.respond", request_id="apr_x"))
    await handlers.message_parked(rig.ledger, parked(rig, "step.completed", step_id="stp_other"))
    assert len(rig.database.rows("outbox")) == before


# --- one transaction, several transitions (group commit) ------------------------------


async def test_transitions_settled_in_one_store_commit_together_and_a_duplicate_among_them_is_skipped(rig):
    first = StartTurn(session_id=rig.session_id, text="a")
    other = StartTurn(session_id=mint("ses"), text="b")
    async with rig.ledger.unit_of_work() as store:
        for message in (first, other):
            await handlers.start_turn.within(rig.ledger, store, message)
            await store.settle()
        with pytest.raises(Duplicate):
            await handlers.start_turn.within(rig.ledger, store, first)
        assert rig.database.rows("turns") == []
        await store.commit()
    assert len(rig.database.rows("turns")) == 2
    assert store.settled == 2


# --- what a transition says besides its rows ----------------------------------------


async def test_each_applied_transition_logs_one_line_once_committed_and_a_rejected_one_only_its_rejection(
    rig, caplog
):
    caplog.set_level("INFO", logger="signoff.ledger")
    turn = StartTurn(session_id=rig.session_id, text="hi", started_by="ann")
    await handlers.start_turn(rig.ledger, turn)
    await handlers.start_turn(rig.ledger, StartTurn(session_id=rig.session_id, text="again"))
    lines = [r.getMessage() for r in caplog.records if r.name == "signoff.ledger"]
    assert lines[0] == f"applied turn.start {turn.message_id}: session {rig.session_id} is running"
    assert [line for line in lines[1:] if line.startswith("applied")] == []
    assert any(line.startswith("rejected turn.start") and line.endswith("session_busy") for line in lines[1:])


async def test_an_execution_refusal_is_audited_with_its_sender_tool_and_a_digest_of_its_reason(rig):
    await rig.start()
    refusal = RefuseExecution(
        session_id=rig.session_id, call_id=mint("call"), tool="read_clock", reason_code="bad_seal", reason_text="why"
    )
    token = sender.set("unit.tool-executor")
    try:
        await handlers.execution_refused(rig.ledger, refusal)
    finally:
        sender.reset(token)
    [entry] = rig.rows("audit_log", kind="execution.refused")
    assert (entry["actor"], entry["message_id"], entry["session_id"]) == (
        "unit.tool-executor",
        refusal.message_id,
        rig.session_id,
    )
    assert entry["detail"]["tool"] == "read_clock" and entry["detail"]["reason_code"] == "bad_seal"
    assert entry["detail"]["reason_digest"] == digest_of("why")
    alerted = rig.last("operator.alerted")
    assert (alerted["tool"], alerted["causation_id"], alerted["reason_text"]) == (
        "read_clock",
        refusal.message_id,
        "The executor refused to run it: why",
    )


async def test_an_escalation_is_audited_and_announced_with_the_requests_card_and_digest(rig):
    requested = await rig.ask(tool="deploy")
    await handlers.escalate_request(rig.ledger, requested["request_id"], rig.session_id)
    [entry] = rig.rows("audit_log", kind="approval.escalated")
    assert (entry["subject"], entry["detail"]["to"]) == (requested["request_id"], ["lena"])
    escalated = rig.last("approval.escalated")
    assert (escalated["call_id"], escalated["args_digest"], escalated["card"]) == (
        requested["call_id"],
        requested["args_digest"],
        requested["card"],
    )
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["escalated_at"] is not None


async def test_a_tool_result_is_audited_as_claimed_and_finished_with_the_claims_holder_attempt_and_digests(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    rig.claim(execute, output="12:00")
    token = sender.set("unit.tool-executor")
    try:
        report = await rig.executed(execute)
    finally:
        sender.reset(token)
    claimed, finished = (rig.rows("audit_log", kind=kind, subject=execute["call_id"])[0]
                         for kind in ("execution.claimed", "execution.finished"))
    [claim] = rig.rows("execution_claims", call_id=execute["call_id"])
    assert (claimed["actor"], claimed["message_id"]) == ("executor-1", report.message_id)
    assert claimed["detail"]["attempt"] == 1
    assert claimed["detail"]["claimed_at"] == claim["claimed_at"].isoformat()
    assert (finished["actor"], finished["detail"]["outcome"]) == ("unit.tool-executor", "output")
    assert finished["detail"]["output_digest"] == digest_of("12:00")
    assert finished["detail"]["error_digest"] is None


async def test_a_refused_report_of_a_known_session_is_chained_and_numbered_in_that_session(rig):
    await rig.start()
    before = rig.session()
    await rig.executed({"call_id": mint("call")})
    [rejected] = rig.events("message.rejected")
    assert rejected["sequence"] == before["event_seq"] + 1
    [entry] = rig.rows("audit_log", kind="message.rejected")
    assert entry["session_seq"] == before["audit_seq"] + 1
    assert rig.session()["audit_hash"] == entry["hash"]


# --- what each transition leaves, field by field ----------------------------------------


def numbered(rig: Rig) -> None:
    """Every event of the session carries the next sequence number, and every audit entry
    the next number of the session's chain, each chained to the one before."""
    bodies = [json.loads(r["body"]) for r in rig.database.rows("outbox") if r["session_id"] == rig.session_id]
    assert [b.get("sequence") for b in bodies] == list(range(1, len(bodies) + 1))
    entries = sorted(rig.rows("audit_log", session_id=rig.session_id), key=lambda e: e["session_seq"])
    assert [e["session_seq"] for e in entries] == list(range(1, len(entries) + 1))
    session = rig.session()
    assert (session["event_seq"], session["audit_seq"]) == (len(bodies), len(entries))
    assert session["audit_hash"] == entries[-1]["hash"]


def audited(rig: Rig, kind: str, **where) -> dict:
    [entry] = [e for e in rig.rows("audit_log", kind=kind) if all(e["detail"].get(k) == v for k, v in where.items())]
    return entry


async def test_a_turns_start_is_audited_with_its_starter_and_a_digest_of_its_words(rig):
    before = now()
    await rig.start("hello there", started_by="ann")
    [row] = rig.rows("turns", session_id=rig.session_id)
    entry = audited(rig, "turn.started")
    assert (entry["subject"], entry["actor"], entry["detail"]) == (row["id"], "ann", {"text_digest": digest_of("hello there")})
    assert rig.session()["updated_at"] >= before
    [entry] = rig.rows("transcript", session_id=rig.session_id)
    assert entry["entry"]["role"] == "user"
    numbered(rig)


async def test_each_proposed_call_is_audited_with_the_ledgers_digest_and_its_plan():
    rig = Rig()
    step_id = await rig.start()
    report = await rig.report(step_id, call("publish_post", "p1", title="a"), call("read_clock", "p2"),
                              call("no_such_tool", "p3"))
    calls = {c["provider_call_id"]: c for c in rig.rows("tool_calls", session_id=rig.session_id)}
    for provider_call_id, plan, reason_code in (("p1", "ask", None), ("p2", "run", None), ("p3", "close", "unknown_tool")):
        row = calls[provider_call_id]
        entry = rig.rows("audit_log", kind="call.proposed", subject=row["id"])[0]
        spec = CATALOGUE.get(row["tool"])
        version = spec.version if spec else ""
        assert (entry["actor"], entry["message_id"]) == ("model", report.message_id)
        assert entry["detail"]["plan"] == plan and entry["detail"]["reason_code"] == reason_code
        assert entry["detail"]["tool"] == row["tool"]
        assert entry["detail"]["call_digest"] == AUTHORITY.digest(row["id"], row["tool"], version, row["arguments"])
    assert audited(rig, "call.proposed", plan="ask")["detail"]["reason"] is not None
    assert [calls[p]["position"] for p in ("p1", "p2", "p3")] == [0, 1, 2]
    step = rig.rows("steps", id=step_id)[0]
    for row in calls.values():
        assert (row["step_id"], row["session_id"]) == (step_id, rig.session_id)
        assert row["id"].startswith("call_") and row["idempotency_key"].startswith("idk_")
    closed = rig.last("tool.closed")
    assert (closed["call_id"], closed["causation_id"]) == (calls["p3"]["id"], report.message_id)
    assert step["status"] == "completed"
    numbered(rig)


async def test_a_request_keeps_its_deadline_escalation_time_attempt_run_and_the_ledgers_seal():
    rig = Rig(approval_timeout=600.0)
    step_id = await rig.start()
    attempts = [ProviderAttempt(number=1, status="failed", provider="scripted"),
                ProviderAttempt(number=2, status="completed", provider="scripted")]
    await rig.report(step_id, call("deploy", "p1"), attempts=attempts)
    requested = rig.last("approval.requested")
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    created = request["created_at"]
    assert request["expires_at"] == created + timedelta(seconds=600)
    assert request["escalate_at"] == created + timedelta(seconds=60)
    assert (request["attempt"], request["run_id"]) == (2, rig.ledger.run_id)
    [row] = rig.rows("tool_calls", id=requested["call_id"])
    assert request["call_seal"] == AUTHORITY.seal_request(
        request["id"], row["id"], rig.session_id, "deploy", {}
    )
    assert request["args_digest"] == AUTHORITY.digest(request["id"], "deploy", CATALOGUE.get("deploy").version, {})
    assert (requested["turn_id"], requested["step_id"]) == (request["turn_id"], step_id)
    numbered(rig)


async def test_a_decision_is_announced_with_its_reason_and_responder_and_the_step_resumes_in_its_turn(rig):
    requested = await rig.ask(title="Hi")
    response = await rig.respond(requested, "deny", reason="not today")
    decided = rig.last("approval.decided")
    assert (decided["request_id"], decided["call_id"], decided["causation_id"]) == (
        requested["request_id"], requested["call_id"], response.message_id,
    )
    assert (decided["decision"], decided["reason"], decided["responder"]) == ("deny", "not today", "alice")
    closed = rig.last("tool.closed")
    assert (closed["call_id"], closed["causation_id"], closed["kind"]) == (
        requested["call_id"], response.message_id, "denied",
    )
    [turn] = rig.rows("turns", session_id=rig.session_id)
    [_, later] = sorted(rig.rows("steps", session_id=rig.session_id), key=lambda s: s["created_at"])
    assert later["turn_id"] == turn["id"]
    assert rig.last("step.requested")["causation_id"] == response.message_id
    numbered(rig)


async def test_an_altered_call_is_closed_in_answer_to_the_response_and_its_operator_alert_names_it(rig, caplog):
    caplog.set_level("INFO", logger="signoff.ledger")
    requested = await rig.ask(title="Hi")
    rig.database.tables["tool_calls"][(requested["call_id"],)]["arguments"] = {"title": "Bye"}
    before = rig.session()["updated_at"]
    response = await rig.respond(requested)
    closed = rig.last("tool.closed")
    assert (closed["call_id"], closed["causation_id"], closed["reason_code"]) == (
        requested["call_id"], response.message_id, "altered",
    )
    alerted = rig.last("operator.alerted")
    assert (alerted["call_id"], alerted["tool"], alerted["causation_id"]) == (
        requested["call_id"], "publish_post", response.message_id,
    )
    [turn] = rig.rows("turns", session_id=rig.session_id)
    assert rig.rows("steps", session_id=rig.session_id)[-1]["turn_id"] == turn["id"]
    assert len(rig.events("step.requested")) == 2
    assert rig.session()["updated_at"] > before
    assert (f"call {requested['call_id']}: its arguments on record differ from the ones approved in "
            f"{requested['request_id']}") in [r.getMessage() for r in caplog.records]
    numbered(rig)


async def test_an_execution_refusal_is_numbered_in_its_session_and_logged(rig, caplog):
    caplog.set_level("INFO", logger="signoff.ledger")
    await rig.start()
    refusal = RefuseExecution(
        session_id=rig.session_id, call_id=mint("call"), tool="read_clock", reason_code="bad_seal", reason_text="no"
    )
    await handlers.execution_refused(rig.ledger, refusal)
    numbered(rig)
    assert f"the executor refused call {refusal.call_id}: bad_seal" in [r.getMessage() for r in caplog.records]


async def test_a_tool_result_closes_its_call_in_answer_to_the_report_and_the_step_resumes_in_its_turn(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    rig.claim(execute, output="12:00")
    before = rig.session()["updated_at"]
    report = await rig.executed(execute)
    closed = rig.last("tool.closed")
    assert (closed["call_id"], closed["causation_id"]) == (execute["call_id"], report.message_id)
    [turn] = rig.rows("turns", session_id=rig.session_id)
    assert rig.rows("steps", session_id=rig.session_id)[-1]["turn_id"] == turn["id"]
    assert rig.last("step.requested")["causation_id"] == report.message_id
    assert rig.session()["updated_at"] > before
    numbered(rig)


async def test_an_outcome_unknown_result_alerts_an_operator_naming_the_call_in_answer_to_the_report(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    rig.claim(execute, outcome="outcome_unknown", error="it stopped")
    report = await rig.executed(execute, outcome="outcome_unknown")
    alerted = rig.last("operator.alerted")
    assert (alerted["call_id"], alerted["tool"], alerted["causation_id"]) == (
        execute["call_id"], "read_clock", report.message_id,
    )
    assert audited(rig, "execution.finished")["detail"]["error_digest"] == digest_of("it stopped")
    numbered(rig)


async def test_a_refused_tool_report_alerts_an_operator_with_why_and_is_logged(rig, caplog):
    caplog.set_level("INFO", logger="signoff.ledger")
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    rig.claim(execute)
    rig.database.tables["execution_claims"][(execute["call_id"],)]["authorization"] = "forged"
    report = await rig.executed(execute)
    alerted = rig.last("operator.alerted")
    assert (alerted["call_id"], alerted["causation_id"], alerted["reason_code"]) == (
        execute["call_id"], report.message_id, "not_claimed",
    )
    assert alerted["reason_text"].startswith("A tool.completed was refused: ")
    assert f"refused a report for call {execute['call_id']}: not_claimed" in [r.getMessage() for r in caplog.records]
    assert rig.rows("closures") == []
    numbered(rig)


async def test_a_stale_report_and_a_second_step_report_are_logged_as_ignored(rig, caplog):
    caplog.set_level("INFO", logger="signoff.ledger")
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    rig.claim(execute)
    await rig.executed(execute)
    await rig.executed(execute)
    await rig.report(step_id, text="again")
    lines = [r.getMessage() for r in caplog.records]
    assert f"ignored a report for call {execute['call_id']} in status closed" in lines
    assert f"discarded a second report for step {step_id}" in lines


async def test_a_request_expires_without_a_cause_its_event_saying_when_and_the_step_resumes_in_its_turn(rig):
    requested = await rig.ask(title="Hi")
    rig.overdue(requested)
    assert await handlers.expire_request(rig.ledger, requested["request_id"], rig.session_id)
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    expired = rig.last("approval.expired")
    assert (expired["request_id"], expired["call_id"]) == (requested["request_id"], requested["call_id"])
    assert expired["expired_at"] == request["expires_at"].isoformat().replace("+00:00", "Z") or expired[
        "expired_at"] == request["expires_at"].isoformat()
    closed = rig.last("tool.closed")
    assert (closed["call_id"], closed["causation_id"], closed["kind"]) == (requested["call_id"], None, "expired")
    [turn] = rig.rows("turns", session_id=rig.session_id)
    assert rig.rows("steps", session_id=rig.session_id)[-1]["turn_id"] == turn["id"]
    assert rig.last("step.requested")["causation_id"] is None
    numbered(rig)


async def test_an_escalation_is_numbered_in_its_session(rig):
    requested = await rig.ask(tool="deploy")
    assert await handlers.escalate_request(rig.ledger, requested["request_id"], rig.session_id)
    escalated = rig.last("approval.escalated")
    assert (escalated["request_id"], escalated["session_id"]) == (requested["request_id"], rig.session_id)
    numbered(rig)


async def test_a_turn_bounded_by_the_tokens_this_transition_spent_ends_in_answer_to_its_report():
    from shared.observability import TURNS_BOUNDED

    rig = Rig(turn_bounds=domain.TurnBounds(steps=0, tokens=10))
    counted = TURNS_BOUNDED.labels("tokens")._value.get()
    step_id = await rig.start()
    usage = Usage(input_tokens=6, output_tokens=4)
    report = await rig.report(
        step_id, call("no_such_tool"),
        attempts=[ProviderAttempt(number=1, status="completed", provider="scripted", usage=usage)],
    )
    failed = rig.last("turn.failed")
    [turn] = rig.rows("turns", session_id=rig.session_id)
    assert (failed["reason_code"], failed["turn_id"], failed["causation_id"]) == (
        domain.STEP_LIMIT, turn["id"], report.message_id,
    )
    assert "10 provider tokens" in failed["reason_text"]
    alerted = rig.last("operator.alerted")
    assert (alerted["turn_id"], alerted["call_id"], alerted["causation_id"]) == (turn["id"], None, report.message_id)
    assert TURNS_BOUNDED.labels("tokens")._value.get() == counted + 1
    assert len(rig.events("step.requested")) == 1
    assert rig.rows("transcript", session_id=rig.session_id)[-1]["entry"]["role"] == "tool"
    numbered(rig)


async def test_a_cancelled_turn_writes_its_calls_closures_for_the_models_next_turn(rig):
    requested = await rig.ask(title="Hi")
    command = CancelTurn(session_id=rig.session_id, cancelled_by="ann", reason="enough")
    await handlers.cancel_turn(rig.ledger, command)
    closed = rig.last("tool.closed")
    assert (closed["call_id"], closed["causation_id"]) == (requested["call_id"], command.message_id)
    entries = [r["entry"] for r in rig.rows("transcript", session_id=rig.session_id)]
    assert entries[-1]["role"] == "tool" and "Cancelled by ann: enough" in json.dumps(entries[-1])
    [turn] = rig.rows("turns", session_id=rig.session_id)
    assert (turn["status"], turn["ended_by"], turn["reason_text"]) == ("cancelled", "ann", "enough")
    assert rig.rows("steps", session_id=rig.session_id)[0]["status"] == "completed"
    numbered(rig)


async def test_an_approver_of_a_pending_request_and_an_operator_may_cancel_and_the_escalation_group_once_escalated():
    operators = ToolCatalogue.model_validate(
        {**CATALOGUE.model_dump(mode="json", exclude_none=True), "groups": {"leads": ["lena"], "operators": ["olga"]}}
    )
    for canceller, escalate in (("alice", False), ("olga", False), ("lena", True)):
        rig = Rig(catalogue=operators)
        requested = await rig.ask(tool="deploy")
        if escalate:
            await handlers.escalate_request(rig.ledger, requested["request_id"], rig.session_id)
        await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by=canceller))
        assert rig.rejected() == [], canceller
        assert rig.last("turn.cancelled")["cancelled_by"] == canceller
    rig = Rig(catalogue=operators)
    await rig.ask(tool="deploy")
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="lena"))
    assert rig.rejected() == ["may_not_cancel"]


async def test_a_parked_message_fails_the_turn_saying_which_message_and_why_and_is_logged(rig, caplog):
    caplog.set_level("INFO", logger="signoff.ledger")
    step_id = await rig.start()
    message = parked(rig, "step.requested", step_id=step_id)
    await handlers.message_parked(rig.ledger, message)
    said = f"step.requested {message.message_id} was parked (delivery_limit): redelivered too often"
    failed = rig.last("turn.failed")
    [turn] = rig.rows("turns", session_id=rig.session_id)
    assert (failed["reason_text"], failed["turn_id"], failed.get("causation_id")) == (said, turn["id"], None)
    assert turn["reason_text"] == said
    assert rig.rows("steps", id=step_id)[0]["status"] == "cancelled"
    assert f"turn {turn['id']} of session {rig.session_id} failed: {said}" in [r.getMessage() for r in caplog.records]
    numbered(rig)


async def test_a_parked_copy_nothing_proves_is_logged_and_changes_nothing(caplog):
    caplog.set_level("INFO", logger="signoff.ledger")
    rig = Rig()
    await rig.start()
    rig.ledger.check_senders = True
    before = len(rig.database.rows("outbox"))
    message = parked(rig, "step.requested", step_id=rig.last("step.requested")["step_id"])
    await handlers.message_parked(rig.ledger, message)
    assert len(rig.database.rows("outbox")) == before
    assert any(line.startswith(f"a parked step.requested {message.message_id} is not acted on")
               and line.endswith("(published to the dead letters by nobody named)")
               for line in [r.getMessage() for r in caplog.records])


async def test_a_parked_message_naming_no_valid_session_changes_nothing(rig):
    await rig.start()
    before = len(rig.database.rows("outbox"))
    step_id = rig.last("step.requested")["step_id"]
    for session_id in ("not an id!", mint("ses")):
        message = dataclasses.replace(parked(rig, "step.requested", step_id=step_id), session_id=session_id)
        await handlers.message_parked(rig.ledger, message)
    assert len(rig.database.rows("outbox")) == before


async def test_a_response_is_refused_from_another_channels_broker_user_and_counts_from_its_own(rig):
    requested = await rig.ask(title="Hi")
    rig.ledger.check_senders = True
    # Signed with chat's key: refused from the inbox channel's broker user, counted from chat's.
    for user in ("unit.channel.inbox", "unit.channel.chat"):
        token = sender.set(user)
        try:
            await rig.respond(requested)
        finally:
            sender.reset(token)
    assert rig.rejected() == ["wrong_channel"]
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "approved"
    numbered(rig)


async def test_a_response_naming_another_sessions_request_is_refused_as_unknown_request(rig):
    requested = await rig.ask(title="Hi")
    other = mint("ses")
    await handlers.start_turn(rig.ledger, StartTurn(session_id=other, text="hi", started_by="ann"))
    response = rig.response(requested).model_copy(update={"session_id": other})
    response = response.model_copy(update={"signature": sign(CHANNEL_KEY, response.signed_part())})
    await handlers.respond_to_approval(rig.ledger, response)
    assert [e["reason_code"] for e in rig.events("message.rejected")] == ["unknown_request"]
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "pending"


async def test_a_response_after_the_requests_deadline_is_refused_before_any_sweep_closed_it(rig):
    requested = await rig.ask(title="Hi")
    rig.overdue(requested)
    await rig.respond(requested)
    assert rig.rejected() == ["expired"]
    assert rig.events("tool.execute") == []
    numbered(rig)


async def test_an_approval_without_a_message_tells_the_model_nothing_more_and_runs_in_answer_to_it(rig):
    requested = await rig.ask(title="Hi")
    before = rig.session()["updated_at"]
    response = await rig.respond(requested)
    [decision] = rig.rows("decisions", request_id=requested["request_id"])
    assert decision["message"] == ""
    assert rig.last("tool.execute")["causation_id"] == response.message_id
    assert rig.session()["updated_at"] > before
    numbered(rig)


async def test_a_session_waiting_on_two_requests_still_waits_when_one_is_decided_or_expires(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("publish_post", "p1", title="a"), call("count", "p2"))
    first, second = rig.events("approval.requested")
    await rig.respond(first, "deny")
    assert rig.session()["status"] == "waiting"
    rig.database.tables["approval_requests"][(second["request_id"],)]["expires_at"] = now() - timedelta(hours=1)
    other = Rig()
    step_id = await other.start()
    await other.report(step_id, call("publish_post", "p1", title="a"), call("count", "p2"))
    first, second = other.events("approval.requested")
    other.database.tables["approval_requests"][(first["request_id"],)]["expires_at"] = now() - timedelta(hours=1)
    assert await handlers.expire_request(other.ledger, first["request_id"], other.session_id)
    assert other.session()["status"] == "waiting"
    assert len(other.events("step.requested")) == 1


async def test_a_parked_execution_closes_the_running_call_as_cancelled_by_signoff(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    await handlers.message_parked(rig.ledger, parked(rig, "tool.execute", call_id=execute["call_id"]))
    [closure] = rig.rows("closures", call_id=execute["call_id"])
    assert closure["reason_text"].startswith("Cancelled by signoff: tool.execute ")


async def test_an_expiry_and_an_escalation_touch_the_session(rig):
    requested = await rig.ask(tool="deploy")
    before = rig.session()["updated_at"]
    assert await handlers.escalate_request(rig.ledger, requested["request_id"], rig.session_id)
    rig.database.tables["approval_requests"][(requested["request_id"],)]["expires_at"] = now() - timedelta(hours=1)
    assert await handlers.expire_request(rig.ledger, requested["request_id"], rig.session_id)
    assert rig.session()["updated_at"] > before
    numbered(rig)


async def test_a_cancel_naming_another_turn_is_refused_as_unknown_turn_and_a_refusal_is_numbered(rig):
    await rig.start()
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="ann", turn_id=mint("trn")))
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="mallory"))
    assert rig.rejected() == ["unknown_turn", "may_not_cancel"]
    assert rig.session()["status"] == "running"
    numbered(rig)


async def test_a_cancel_closes_only_the_open_calls_holds_back_only_the_running_and_answers_the_command(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("publish_post", "p1", title="a"), call("read_clock", "p2"))
    requested, execute = rig.last("approval.requested"), rig.last("tool.execute")
    rig.claim(execute, output="12:00")
    await rig.executed(execute)
    command = CancelTurn(session_id=rig.session_id, cancelled_by="ann")
    await handlers.cancel_turn(rig.ledger, command)
    assert [c["kind"] for c in rig.rows("closures", call_id=execute["call_id"])] == ["output"]
    assert [c["kind"] for c in rig.rows("closures", call_id=requested["call_id"])] == ["cancelled"]
    assert rig.rows("execution_claims", call_id=requested["call_id"]) == []
    cancelled = rig.last("turn.cancelled")
    assert (cancelled["causation_id"], cancelled["turn_id"]) == (command.message_id, rig.rows("turns")[0]["id"])
    numbered(rig)


async def test_cancelling_a_running_read_closes_it_as_cancelled_and_a_running_outward_call_alerts_naming_it(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_clock"))
    execute = rig.last("tool.execute")
    rig.claim(execute)
    rig.database.tables["execution_claims"][(execute["call_id"],)]["status"] = "claimed"
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by="ann"))
    assert rig.rows("closures", call_id=execute["call_id"])[0]["kind"] == "cancelled"
    assert rig.events("operator.alerted") == []
    other = Rig()
    requested = await other.ask(title="Hi")
    await other.respond(requested)
    execute = other.last("tool.execute")
    other.claim(execute)
    other.database.tables["execution_claims"][(execute["call_id"],)]["status"] = "claimed"
    await handlers.cancel_turn(other.ledger, CancelTurn(session_id=other.session_id, cancelled_by="ann"))
    alerted = other.last("operator.alerted")
    assert (alerted["call_id"], alerted["tool"]) == (execute["call_id"], "publish_post")
    numbered(other)


async def test_a_bounded_turn_is_logged_with_its_turn_session_and_bound(caplog):
    caplog.set_level("INFO", logger="signoff.ledger")
    rig = Rig(turn_bounds=domain.TurnBounds(steps=1))
    step_id = await rig.start()
    await rig.report(step_id, call("no_such_tool"))
    [turn] = rig.rows("turns", session_id=rig.session_id)
    assert f"turn {turn['id']} of session {rig.session_id} ended at its bound: steps" in [
        r.getMessage() for r in caplog.records
    ]


async def test_a_parked_copy_nothing_proves_is_logged_as_unproven(caplog):
    caplog.set_level("INFO", logger="signoff.ledger")
    rig = Rig()
    await rig.start()
    rig.ledger.check_senders = True
    message = parked(rig, "step.requested", step_id=rig.last("step.requested")["step_id"])
    await handlers.message_parked(rig.ledger, message)
    assert any(f"is not acted on: {UNPROVEN} (" in r.getMessage() for r in caplog.records)
