"""Approval that depends on the arguments (issue 23, section 4), through the ledger's
handlers on the in-memory store: the tool's rule is evaluated when the call is
proposed, its verdict (how many must approve, and why) is recorded with the request
and tallied from the record, and a call the rule lets through runs with no card."""

from __future__ import annotations

import pytest

from shared.catalogue import ToolCatalogue
from shared.signatures import unseal

from .test_ledger_handlers import LEDGER_KEY, RUNS, Rig, call

RULES = ToolCatalogue.model_validate(
    {
        "tools": [
            {
                "name": "pay_invoice",
                "label": "Pay an invoice",
                "implementation": RUNS,
                "effect": "outward",
                "approvers": ["alice", "bob"],
                "approvals_required": [
                    {"when": "args.amount > 1000", "then": 2, "reason": "amount {amount:,} > 1,000: two approvers"},
                    {"then": 1, "reason": "amount {amount:,} up to 1,000: one approver"},
                ],
                "parameters": {
                    "type": "object",
                    "properties": {"amount": {"type": "number"}, "payee": {"type": "string"}},
                    "required": ["amount", "payee"],
                },
            },
            {
                "name": "read_object",
                "label": "Read an object",
                "implementation": RUNS,
                "effect": "read",
                "approval": [
                    {"when": "args.bucket == 'public'", "then": "never", "reason": "bucket public: anyone may read it"},
                    {"then": "always", "reason": "bucket {bucket} is not public"},
                ],
                "parameters": {
                    "type": "object",
                    "properties": {"bucket": {"type": "string"}, "key": {"type": "string"}},
                    "required": ["bucket"],
                },
            },
            {
                "name": "send_note",
                "label": "Send a note",
                "implementation": RUNS,
                "effect": "outward",
                "approvers": ["alice", "bob"],
                "approvals_required": [
                    {"when": "args.urgent", "then": 2, "reason": "urgent: two approvers"},
                    {"then": 1},
                ],
                "parameters": {"type": "object", "properties": {"urgent": {"type": "boolean"}}},
            },
        ]
    }
)


@pytest.fixture
def rig() -> Rig:
    return Rig(RULES)


def audit(rig: Rig, kind: str) -> list[dict]:
    return [row["detail"] for row in rig.rows("audit_log", session_id=rig.session_id) if row["kind"] == kind]


async def test_a_payment_above_the_threshold_asks_two_approvers_and_the_card_and_audit_log_say_why(rig):
    requested = await rig.ask("pay_invoice", amount=2500, payee="ACME")
    why = "amount 2,500 > 1,000: two approvers"
    assert (requested["approvals_required"], requested["card"]["reason"]) == (2, why)
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    assert (request["approvals_required"], request["reason"], request["card"]["reason"]) == (2, why, why)
    [asked] = audit(rig, "approval.requested")
    assert (asked["approvals_required"], asked["reason"], asked["rule_error"]) == (2, why, None)
    [proposed] = audit(rig, "call.proposed")
    assert (proposed["plan"], proposed["reason"]) == ("ask", why)
    await rig.respond(requested, responder="alice")
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "pending"
    assert rig.events("tool.execute") == []
    await rig.respond(requested, responder="bob")
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "approved"
    assert len(rig.events("tool.execute")) == 1


async def test_a_payment_up_to_the_threshold_is_decided_by_one_approver_as_recorded_with_its_request(rig):
    requested = await rig.ask("pay_invoice", amount=500, payee="ACME")
    assert (requested["approvals_required"], requested["card"]["reason"]) == (
        1,
        "amount 500 up to 1,000: one approver",
    )
    await rig.respond(requested, responder="alice")
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "approved"
    assert len(rig.events("tool.execute")) == 1


async def test_a_call_the_rule_needs_no_approval_for_runs_at_once_with_no_card_and_the_audit_log_says_why(rig):
    step_id = await rig.start()
    await rig.report(step_id, call("read_object", bucket="public", key="a.txt"))
    assert rig.events("approval.requested") == []
    assert rig.rows("approval_requests") == []
    execute = rig.last("tool.execute")
    assert unseal(LEDGER_KEY.public_key(), execute["authorization"])["basis"] == "policy"
    [proposed] = audit(rig, "call.proposed")
    assert (proposed["plan"], proposed["reason"]) == ("run", "bucket public: anyone may read it")


async def test_a_call_the_rule_asks_for_needs_a_person_and_says_which_case_decided(rig):
    requested = await rig.ask("read_object", bucket="private", key="a.txt")
    assert requested["card"]["reason"].startswith("bucket private is not public")
    assert rig.events("tool.execute") == []


async def test_a_rule_that_cannot_be_evaluated_for_the_call_asks_the_tools_most_approvers_and_says_so(rig):
    requested = await rig.ask("send_note")
    assert requested["approvals_required"] == 2
    [asked] = audit(rig, "approval.requested")
    assert asked["approvals_required"] == 2 and "could not be evaluated" in asked["rule_error"]
    await rig.respond(requested, responder="alice")
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "pending"
