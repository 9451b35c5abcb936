"""Approval that depends on the arguments, through the ledger's
handlers on the in-memory store: the tool's rule is evaluated when the call is
proposed, its verdict (how many must approve, and why) is recorded with the request
and tallied from the record, and a call the rule lets through runs with no card."""

from __future__ import annotations

import json

import pytest

from shared.catalogue import ToolCatalogue
from shared.signatures import arguments_fingerprint, unseal

from .test_ledger_handlers import LEDGER_KEY, RUNS, Rig, call

RULES = ToolCatalogue.model_validate(
    {
        "tools": [
            {
                "name": "pay_invoice",
                "label": "Pay an invoice",
                "implementation": RUNS,
                "effect": "outward",
                "approvers": ["alice", "bob", "carol"],
                "approvals_required": [
                    {"when": "args.amount > 1000", "then": 2, "reason": "amount {amount:,} > 1,000: two approvers"},
                    {"then": 1, "reason": "amount {amount:,} up to 1,000: one approver"},
                ],
                "editable": ["amount", "memo"],
                "parameters": {
                    "type": "object",
                    "properties": {
                        "amount": {"type": "number", "exclusiveMinimum": 0},
                        "payee": {"type": "string"},
                        "memo": {"type": "string"},
                    },
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


# --- edit before approve -----------------------------------------------


async def test_an_edited_approval_runs_exactly_the_edited_arguments_sealed_for_them_and_the_model_is_told(rig):
    requested = await rig.ask("pay_invoice", amount=2500, payee="ACME")
    await rig.respond(requested, responder="alice", edited_arguments={"amount": 900, "payee": "ACME"})
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    # Re-evaluated for the edited arguments: 900 needs one approver, and alice's decides.
    assert (request["status"], request["approvals_required"]) == ("approved", 1)
    assert request["args_digest"] != requested["args_digest"]
    assert request["card"]["arguments"] == {"amount": 900, "payee": "ACME"} and request["card"]["edited_by"] == "alice"
    execute = rig.last("tool.execute")
    assert execute["arguments"] == {"amount": 900, "payee": "ACME"}
    sealed = unseal(LEDGER_KEY.public_key(), execute["authorization"])
    assert sealed["arguments"] == arguments_fingerprint({"amount": 900, "payee": "ACME"})
    [row] = rig.rows("tool_calls", id=requested["call_id"])
    assert row["arguments"] == {"amount": 900, "payee": "ACME"}
    [edited] = audit(rig, "arguments.edited")
    assert (edited["original_digest"], edited["edited_digest"], edited["changed"]) == (
        requested["args_digest"],
        request["args_digest"],
        ["amount"],
    )
    [entry] = [r for r in rig.rows("audit_log", session_id=rig.session_id) if r["kind"] == "arguments.edited"]
    assert entry["actor"] == "alice"
    [decision] = rig.rows("decisions", request_id=requested["request_id"])
    assert decision["message"].startswith("alice changed the arguments before approving: ") and "900" in (
        decision["message"]
    )


async def test_an_edit_that_needs_more_approvers_waits_for_them_on_the_edited_version(rig):
    requested = await rig.ask("pay_invoice", amount=500, payee="ACME")
    await rig.respond(requested, responder="alice", edited_arguments={"amount": 5000, "payee": "ACME"})
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    assert (request["status"], request["approvals_required"]) == ("pending", 2)
    assert rig.events("tool.execute") == []
    # bob approving the card as first shown names other arguments: refused.
    await rig.respond(requested, responder="bob")
    assert rig.rejected() == ["digest_mismatch"]
    await rig.respond({**requested, "args_digest": request["args_digest"]}, responder="bob")
    assert rig.last("tool.execute")["arguments"] == {"amount": 5000, "payee": "ACME"}


@pytest.mark.parametrize(
    ("tool", "arguments", "edited", "code"),
    [
        ("pay_invoice", {"amount": 500, "payee": "ACME"}, {"amount": 500, "payee": "Mallory"}, "field_not_editable"),
        ("pay_invoice", {"amount": 500, "payee": "ACME"}, {"amount": -5, "payee": "ACME"}, "edit_breaks_schema"),
        ("read_object", {"bucket": "private"}, {"bucket": "public"}, "tool_not_editable"),
    ],
)
async def test_a_refused_edit_is_answered_with_its_reason_and_nothing_is_decided_or_run(rig, tool, arguments, edited,
                                                                                        code):
    requested = await rig.ask(tool, **arguments)
    await rig.respond(requested, responder="alice", edited_arguments=edited)
    assert rig.rejected() == [code]
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    assert (request["status"], request["args_digest"]) == ("pending", requested["args_digest"])
    assert rig.rows("tool_calls", id=requested["call_id"])[0]["arguments"] == arguments
    assert rig.events("tool.execute") == [] and rig.rows("approvals") == []


async def test_an_edit_sent_with_the_digest_of_other_arguments_is_refused_and_nothing_runs(rig):
    requested = await rig.ask("pay_invoice", amount=500, payee="ACME")
    await rig.respond({**requested, "args_digest": "0" * 64}, responder="alice",
                      edited_arguments={"amount": 400, "payee": "ACME"})
    assert rig.rejected() == ["digest_mismatch"]
    assert rig.events("tool.execute") == [] and rig.rows("audit_log", kind="arguments.edited") == []


def approvers(rig: Rig, requested: dict) -> list[str]:
    return sorted(row["responder"] for row in rig.rows("approvals", request_id=requested["request_id"]))


def edited(rig: Rig, requested: dict) -> dict:
    """The request's card as its edited version was announced (the last approval.requested)."""
    announced = rig.last("approval.requested")
    assert announced["request_id"] == requested["request_id"]
    return announced


async def test_an_edit_after_approvals_restarts_the_count_and_every_approver_approves_the_edited_version(rig):
    requested = await rig.ask("pay_invoice", amount=2500, payee="ACME")
    await rig.respond(requested, responder="alice")
    await rig.respond(requested, responder="bob", edited_arguments={"amount": 2400, "payee": "ACME"})
    # alice approved 2,500, not 2,400: her approval no longer counts; bob's is the first of two.
    assert rig.rejected() == [] and rig.events("tool.execute") == []
    assert approvers(rig, requested) == ["bob"]
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    assert (request["status"], request["approvals_required"]) == ("pending", 2)
    assert rig.last("approval.counted")["count"] == 1
    [entry] = audit(rig, "arguments.edited")
    assert (entry["approvals_withdrawn"], entry["approvals_required"]) == (1, 2)
    # The card alice approved names other arguments: refused; the edited one counts, and decides.
    await rig.respond(requested, responder="alice")
    assert rig.rejected() == ["digest_mismatch"]
    await rig.respond(edited(rig, requested), responder="alice")
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "approved"
    assert rig.last("tool.execute")["arguments"] == {"amount": 2400, "payee": "ACME"}
    assert approvers(rig, requested) == ["alice", "bob"]
    # Each approval, the withdrawn one too, stays in the audit log.
    accepted = [r["actor"] for r in rig.rows("audit_log", kind="response.accepted")]
    assert accepted == ["alice", "bob", "alice"]


async def test_an_approver_who_approved_the_version_before_may_edit_and_approve_the_edited_version_once(rig):
    requested = await rig.ask("pay_invoice", amount=2500, payee="ACME")
    await rig.respond(requested, responder="alice")
    await rig.respond(requested, responder="alice", edited_arguments={"amount": 2000, "payee": "ACME"})
    assert rig.rejected() == [] and approvers(rig, requested) == ["alice"]
    assert rig.last("approval.counted")["count"] == 1
    await rig.respond(edited(rig, requested), responder="alice")
    assert rig.rejected() == ["already_approved"] and rig.events("tool.execute") == []
    await rig.respond(edited(rig, requested), responder="carol")
    assert rig.last("tool.execute")["arguments"] == {"amount": 2000, "payee": "ACME"}


async def test_an_edit_that_restarts_the_count_announces_the_edited_card_and_its_digest_without_a_token(rig):
    requested = await rig.ask("pay_invoice", amount=2500, payee="ACME")
    await rig.respond(requested, responder="alice")
    await rig.respond(requested, responder="bob", edited_arguments={"amount": 2400, "payee": "ACME", "memo": "q3"})
    first, again = rig.events("approval.requested")
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    assert (again["request_id"], again["call_id"], again["step_id"]) == (
        first["request_id"], first["call_id"], first["step_id"])
    assert again["args_digest"] == request["args_digest"] != first["args_digest"]
    assert again["card"] == request["card"]
    assert again["card"]["arguments"] == {"amount": 2400, "payee": "ACME", "memo": "q3"}
    assert again["card"]["edited_by"] == "bob" and "amount" in again["card"]["edit"]
    assert again["card"]["reason"] == "amount 2,400 > 1,000: two approvers"
    assert (again["approvals_required"], again["pending_request_ids"]) == (2, [requested["request_id"]])
    assert again["response_token"] is None and first["response_token"]
    assert again["expires_at"] == first["expires_at"]
    # The event comes before the count it restarts.
    types = [json.loads(r["body"])["type"] for r in rig.database.rows("outbox")]
    assert types[-2:] == ["approval.requested", "approval.counted"]


async def test_an_edit_the_editors_approval_decides_announces_no_card_again(rig):
    requested = await rig.ask("pay_invoice", amount=2500, payee="ACME")
    await rig.respond(requested, responder="alice")
    await rig.respond(requested, responder="bob", edited_arguments={"amount": 900, "payee": "ACME"})
    # 900 needs one approver: bob's approval of it decides; alice's of 2,500 does not count.
    assert len(rig.events("approval.requested")) == 1
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["status"] == "approved"
    assert rig.last("tool.execute")["arguments"] == {"amount": 900, "payee": "ACME"}
    assert approvers(rig, requested) == ["bob"]


async def test_a_second_edit_restarts_the_count_again(rig):
    requested = await rig.ask("pay_invoice", amount=2500, payee="ACME")
    await rig.respond(requested, responder="alice", edited_arguments={"amount": 2400, "payee": "ACME"})
    second = edited(rig, requested)
    await rig.respond(second, responder="bob", edited_arguments={"amount": 2300, "payee": "ACME"})
    assert approvers(rig, requested) == ["bob"] and rig.events("tool.execute") == []
    await rig.respond(second, responder="alice")
    assert rig.rejected() == ["digest_mismatch"]
    await rig.respond(edited(rig, requested), responder="alice")
    assert rig.last("tool.execute")["arguments"] == {"amount": 2300, "payee": "ACME"}
    assert [e["approvals_withdrawn"] for e in audit(rig, "arguments.edited")] == [0, 1]


async def test_an_edit_after_approvals_is_refused_like_any_edit_when_it_breaks_a_rule_and_the_count_stands(rig):
    requested = await rig.ask("pay_invoice", amount=2500, payee="ACME")
    await rig.respond(requested, responder="alice")
    await rig.respond(requested, responder="bob", edited_arguments={"amount": 2500, "payee": "Mallory"})
    assert rig.rejected() == ["field_not_editable"]
    assert approvers(rig, requested) == ["alice"] and rig.events("tool.execute") == []
    await rig.respond(requested, responder="bob")
    assert rig.last("tool.execute")["arguments"] == {"amount": 2500, "payee": "ACME"}


async def test_a_person_not_among_the_approvers_cannot_restart_the_count_with_an_edit(rig):
    requested = await rig.ask("pay_invoice", amount=2500, payee="ACME")
    await rig.respond(requested, responder="alice")
    await rig.respond(requested, responder="lena", edited_arguments={"amount": 2400, "payee": "ACME"})
    assert rig.rejected() == ["not_an_approver"]
    assert approvers(rig, requested) == ["alice"] and audit(rig, "arguments.edited") == []
    assert rig.rows("approval_requests", id=requested["request_id"])[0]["args_digest"] == requested["args_digest"]


async def test_an_edit_that_changes_nothing_is_a_plain_approval(rig):
    requested = await rig.ask("pay_invoice", amount=500, payee="ACME")
    await rig.respond(requested, responder="alice", edited_arguments={"amount": 500, "payee": "ACME"})
    assert rig.last("tool.execute")["arguments"] == {"amount": 500, "payee": "ACME"}
    assert rig.rows("audit_log", kind="arguments.edited") == []
