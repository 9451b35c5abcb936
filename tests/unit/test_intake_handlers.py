"""The intake's transitions on the in-memory store: a program files a call, a person
decides, the caller claims and reports (runs: caller) or the executor runs it (runs:
signoff); refusals by the catalogue, the same call filed again, claim fencing, a lapsed
lease, the signed verdict. Milliseconds; the same handlers run on both databases in
tests/integration/test_intake.py."""

from __future__ import annotations

import json
from datetime import timedelta

from services.approval_ledger import handlers, intake
from shared.catalogue import ToolCatalogue
from shared.consuming import sender
from shared.messages import (
    CancelTurn,
    ClaimCall,
    FileCall,
    ReportCallResult,
    claim_token_hash,
    filed_session_id,
    mint,
)
from shared.signatures import unseal
from tests.unit.test_ledger_handlers import CATALOGUE, LEDGER_KEY, RUNS, Rig

PROGRAM = "bot:agent"
INTAKE_CATALOGUE = ToolCatalogue.model_validate(
    {
        **CATALOGUE.model_dump(mode="json", exclude={"tools"}),
        "tools": [
            *CATALOGUE.model_dump(mode="json")["tools"],
            {"name": "send_refund", "label": "Refund", "runs": "caller", "approval": "always", "effect": "outward",
             "editable": True,
             "parameters": {"type": "object", "required": ["customer", "amount"],
                            "properties": {"customer": {"type": "string"}, "amount": {"type": "number"}}}},
            {"name": "lookup", "label": "Lookup", "runs": "caller", "approval": "never", "effect": "read",
             "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
        ],
        "origins": {
            "http:agent": {"programs": [PROGRAM], "tools": ["send_refund", "publish_post", "lookup"]},
            "mcp:desktop": {"programs": [PROGRAM], "unknown_tools": {"approvers": ["alice"]}},
        },
    }
)
assert RUNS


class IntakeRig(Rig):
    def __init__(self) -> None:
        super().__init__(INTAKE_CATALOGUE)

    async def file(self, tool: str = "send_refund", caller_call_id: str = "tc-1", origin: str = "http:agent",
                   program: str = PROGRAM, **arguments) -> FileCall:
        arguments = arguments or {"customer": "c-9", "amount": 12.5}
        command = FileCall(session_id=filed_session_id(program, caller_call_id), program=program, origin=origin,
                           tool=tool, arguments=arguments, caller_call_id=caller_call_id, thread="th-1",
                           summary="Refund c-9")
        self.session_id = command.session_id
        await handlers.file_call(self.ledger, command)
        return command

    def filed(self) -> dict:
        [row] = self.rows("filed_calls", session_id=self.session_id)
        return row

    async def claim(self, token: str = "t" * 43, **fields) -> ClaimCall:  # type: ignore[override]
        filed = self.filed()
        fields.setdefault("program", PROGRAM)
        command = ClaimCall(session_id=filed["session_id"], call_id=filed["id"], claim_token_hash=claim_token_hash(token),
                            **fields)
        await handlers.claim_call(self.ledger, command)
        return command

    async def report(self, token: str = "t" * 43, **fields) -> ReportCallResult:  # type: ignore[override]
        filed = self.filed()
        fields.setdefault("program", PROGRAM)
        fields.setdefault("outcome", "output")
        command = ReportCallResult(session_id=filed["session_id"], call_id=filed["id"],
                                   claim_token_hash=claim_token_hash(token), **fields)
        await handlers.report_call_result(self.ledger, command)
        return command

    def rejected(self) -> list[str]:
        return [e["reason_code"] for e in self.events("message.rejected")]


async def test_a_filed_call_asks_a_person_with_a_card_that_names_who_filed_it_and_waits():
    rig = IntakeRig()
    await rig.file()
    requested = rig.last("approval.requested")
    card = requested["card"]
    assert card["tool"] == "send_refund" and card["target"] == "run by the caller"
    assert card["filed"] == {"program": PROGRAM, "origin": "http:agent", "caller_call_id": "tc-1", "thread": "th-1",
                             "summary": "Refund c-9", "declared_by_caller": False}
    assert rig.session()["status"] == "waiting" and rig.session()["provider"] == intake.INTAKE
    assert rig.session()["started_by"] == PROGRAM
    [audit] = [e for e in rig.rows("audit_log") if e["kind"] == "call.filed"]
    assert (audit["detail"]["origin"], audit["detail"]["caller_call_id"], audit["detail"]["thread"]) == (
        "http:agent", "tc-1", "th-1")
    assert rig.events("step.requested") == [] and rig.events("tool.execute") == []


async def test_the_same_call_filed_again_changes_nothing_and_with_other_arguments_is_refused():
    rig = IntakeRig()
    await rig.file()
    await rig.file()  # a new message id, the same call
    assert len(rig.rows("approval_requests")) == 1 and len(rig.events("approval.requested")) == 1
    await rig.file(customer="c-9", amount=99999)
    assert rig.rejected() == ["call_id_reused"]
    assert len(rig.rows("approval_requests")) == 1 and len(rig.rows("filed_calls")) == 1


async def test_the_catalogue_alone_decides_what_a_program_may_file():
    rig = IntakeRig()
    await rig.file(tool="count", caller_call_id="a")  # a catalogue tool outside the origin's set
    await rig.file(tool="zap", caller_call_id="b")  # unknown, and http:agent declares no default
    await rig.file(caller_call_id="c", origin="http:other")
    await rig.file(caller_call_id="d", program="bot:intruder")
    await rig.file(caller_call_id="e", customer=5, amount=1)
    assert rig.rejected() == ["tool_not_declared_for_origin", "unknown_tool", "unknown_origin",
                              "origin_not_allowed", "invalid_arguments"]
    assert rig.rows("filed_calls") == [] and rig.rows("approval_requests") == []
    # A refused filing opens no session.
    assert rig.rows("sessions") == []


async def test_an_unknown_tool_of_an_origin_with_a_default_asks_and_its_card_says_the_caller_declared_it():
    rig = IntakeRig()
    await rig.file(tool="delete_file", origin="mcp:desktop", path="/tmp/x", api_token="s3cret")
    card = rig.last("approval.requested")["card"]
    assert card["tool"] == "mcp:desktop/delete_file" and card["filed"]["declared_by_caller"] is True
    assert "declared by the caller" in card["label"]
    assert card["arguments"]["api_token"] != "s3cret" and "api_token" in card["hidden"]


async def test_runs_caller_claim_is_granted_once_and_the_result_closes_the_call_once():
    rig = IntakeRig()
    await rig.file()
    await rig.claim()
    assert rig.rejected() == ["not_approved"]
    await rig.respond(rig.last("approval.requested"))
    assert rig.events("tool.execute") == []
    await rig.claim(holder="worker-1")
    await rig.claim(holder="worker-1")  # the same token again: the same claim
    await rig.claim(token="u" * 43, holder="worker-2")
    await rig.claim(program="bot:other")
    assert rig.rejected()[1:] == ["claim_held", "unknown_call"]
    assert "worker-1" in rig.events("message.rejected")[1]["reason_text"]
    await rig.report(token="u" * 43)
    await rig.report(output={"refunded": True})
    await rig.report(output={"refunded": True})
    assert rig.rejected()[3:] == ["wrong_claim_token", "already_reported"]
    [closure] = rig.rows("closures")
    assert (closure["kind"], closure["output"]) == ("output", {"value": {"refunded": True}})
    assert rig.last("turn.completed")["text"] == "" and rig.session()["status"] == "idle"


async def test_a_result_without_a_claim_is_refused():
    rig = IntakeRig()
    await rig.file()
    await rig.respond(rig.last("approval.requested"))
    await rig.report()
    assert rig.rejected() == ["not_claimed"] and rig.rows("closures") == []


async def test_a_claim_whose_lease_ends_with_no_result_closes_as_outcome_unknown_and_asks_a_person():
    rig = IntakeRig()
    await rig.file()
    await rig.respond(rig.last("approval.requested"))
    await rig.claim(lease_seconds=5)
    due = rig.filed()["lease_expires_at"] + timedelta(seconds=1)
    async with rig.ledger.unit_of_work() as store:
        assert await store.due_leases(due) == [(rig.filed()["id"], rig.session_id)]
    rig.filed()["lease_expires_at"] -= timedelta(seconds=10)
    assert await intake.lapse_claim(rig.ledger, rig.filed()["id"], rig.session_id)
    assert not await intake.lapse_claim(rig.ledger, rig.filed()["id"], rig.session_id)
    [closure] = rig.rows("closures")
    assert (closure["kind"], closure["reason_code"]) == ("outcome_unknown", "claim_lapsed")
    assert rig.last("operator.alerted")["reason_code"] == "claim_lapsed"
    await rig.report()
    await rig.claim(token="u" * 43)
    assert rig.rejected() == ["claim_lapsed", "call_closed"]


async def test_the_verdict_is_sealed_by_the_ledger_and_names_the_edited_arguments():
    rig = IntakeRig()
    await rig.file()
    await rig.respond(rig.last("approval.requested"), edited_arguments={"customer": "c-9", "amount": 10})
    claims = unseal(LEDGER_KEY.public_key(), rig.filed()["verdict"])
    assert (claims["decision"], claims["arguments"], claims["responder"]) == (
        "approve", {"customer": "c-9", "amount": 10}, "alice")
    assert claims["caller_call_id"] == "tc-1" and claims["program"] == PROGRAM and claims["edited_by"] == "alice"


async def test_a_denial_is_sealed_with_the_persons_reason():
    rig = IntakeRig()
    await rig.file()
    await rig.respond(rig.last("approval.requested"), "deny", reason="not this one")
    claims = unseal(LEDGER_KEY.public_key(), rig.filed()["verdict"])
    assert (claims["decision"], claims["reason"]) == ("deny", "not this one")
    assert rig.rows("closures")[0]["kind"] == "denied"


async def test_runs_signoff_goes_to_the_executor_once_approved():
    rig = IntakeRig()
    await rig.file(tool="publish_post", title="hello")
    await rig.respond(rig.last("approval.requested"))
    [execute] = rig.events("tool.execute")
    assert execute["tool"] == "publish_post" and execute["arguments"] == {"title": "hello"}
    assert json.loads(json.dumps(execute))["authorization"]


async def test_a_tool_that_needs_no_approval_is_claimable_at_once():
    rig = IntakeRig()
    await rig.file(tool="lookup", caller_call_id=mint("c"), q="x")
    assert rig.events("approval.requested") == []
    await rig.claim()
    await rig.report(output=1)
    assert rig.rejected() == [] and rig.rows("closures")[0]["kind"] == "output"


async def test_a_filed_call_nobody_decides_expires_and_its_turn_completes():
    rig = IntakeRig()
    await rig.file()
    [request] = rig.rows("approval_requests")
    request["expires_at"] -= timedelta(days=2)
    assert await handlers.expire_request(rig.ledger, request["id"], rig.session_id)
    assert rig.rows("closures")[0]["kind"] == "expired"
    assert rig.events("turn.completed") and rig.events("step.requested") == []


async def test_a_filed_call_cancelled_while_its_caller_holds_the_claim_closes_as_outcome_unknown():
    rig = IntakeRig()
    await rig.file()
    await rig.respond(rig.last("approval.requested"))
    await rig.claim(holder="worker-1")
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by=PROGRAM, reason="stop"))
    [closure] = rig.rows("closures")
    assert closure["kind"] == "outcome_unknown"
    await rig.report()
    assert rig.rejected() == ["claim_lapsed"]


async def test_a_filed_call_cancelled_before_it_is_claimed_is_cancelled():
    rig = IntakeRig()
    await rig.file()
    await rig.respond(rig.last("approval.requested"))
    await handlers.cancel_turn(rig.ledger, CancelTurn(session_id=rig.session_id, cancelled_by=PROGRAM, reason="stop"))
    assert rig.rows("closures")[0]["kind"] == "cancelled"
    await rig.claim()
    assert rig.rejected() == ["call_closed"]


async def test_over_the_bus_a_call_is_filed_only_by_a_channel_that_may_speak_for_the_program():
    rig = IntakeRig()
    rig.ledger.check_senders = True
    for user in ("unit.channel.chat", "unit.model-step"):
        token = sender.set(user)
        try:
            await rig.file(caller_call_id=user)
        finally:
            sender.reset(token)
    assert rig.rejected() == ["wrong_principal", "unauthorized_sender"]
    assert rig.rows("filed_calls") == [] and rig.rows("sessions") == []
