"""Approve and remember, through the ledger's handlers on the
in-memory store: an approval that asks to remember makes a sealed grant; later calls
of its session that it covers run with no card, authorized by the grant; a revocation
takes effect for every call decided after it; and a remember the ledger may not give
refuses the whole response, so nothing runs."""

from __future__ import annotations

import asyncio

import pytest

from services.approval_ledger import handlers
from shared.authorization import GrantTerms, grant_seal_names
from shared.catalogue import ToolCatalogue
from shared.messages import Remember, RevokeGrant, mint
from shared.signatures import unseal

from .test_ledger_handlers import LEDGER_KEY, RUNS, Rig, call

REFUND_PARAMETERS = {
    "type": "object",
    "properties": {"amount": {"type": "number"}, "customer": {"type": "string"}},
    "required": ["amount", "customer"],
}


def catalogue(version: str = "1") -> ToolCatalogue:
    return ToolCatalogue.model_validate(
        {
            "groups": {"operators": ["olga"]},
            "tools": [
                {
                    "name": "refund",
                    "label": "Refund",
                    "version": version,
                    "implementation": RUNS,
                    "effect": "outward",
                    "target": "customer {customer}",
                    "approvers": ["alice", "bob"],
                    "rememberable": {"outward": True},
                    "editable": ["amount"],
                    "parameters": REFUND_PARAMETERS,
                },
                {
                    "name": "pay",
                    "label": "Pay",
                    "implementation": RUNS,
                    "effect": "outward",
                    "target": "customer {customer}",
                    "approvers": ["alice", "bob"],
                    "approvals_required": [{"when": "args.amount > 1000", "then": 2}, {"then": 1}],
                    "rememberable": {"outward": True, "several_approvers": True},
                    "parameters": REFUND_PARAMETERS,
                },
                {
                    "name": "publish_post",
                    "label": "Publish",
                    "implementation": RUNS,
                    "effect": "outward",
                    "parameters": {"type": "object", "properties": {"title": {"type": "string"}}},
                },
            ],
        }
    )


@pytest.fixture
def rig() -> Rig:
    return Rig(catalogue())


def audit(rig: Rig, kind: str) -> list[dict]:
    return [row for row in rig.rows("audit_log", session_id=rig.session_id) if row["kind"] == kind]


async def finish(rig: Rig) -> None:
    """The last call ran; the model answers with words, and the turn ends."""
    execute = rig.last("tool.execute")
    rig.claim(execute)
    await rig.executed(execute)
    await rig.report(rig.last("step.requested")["step_id"])
    assert rig.session()["status"] == "idle"


async def next_call(rig: Rig, tool: str = "refund", **arguments) -> None:
    """A new turn in the same session whose model asks for one call."""
    step_id = await rig.start()
    await rig.report(step_id, call(tool, **arguments))


async def remembered(rig: Rig, target: str | None = "customer c-1", hours: float | None = None) -> dict:
    """alice approves a refund to c-1 and remembers it; the call runs; the grant row."""
    requested = await rig.ask("refund", amount=20, customer="c-1")
    await rig.respond(requested, responder="alice", remember=Remember(target=target, hours=hours))
    assert rig.rejected() == []
    await finish(rig)
    [grant] = rig.rows("grants")
    return grant


async def revoke(rig: Rig, grant_id: str, by: str = "alice", session_id: str | None = None) -> None:
    command = RevokeGrant(session_id=session_id or rig.session_id, grant_id=grant_id, revoked_by=by, reason="enough")
    await handlers.revoke_grant(rig.ledger, command)


def requests(rig: Rig) -> int:
    return len(rig.events("approval.requested"))


async def test_an_approval_remembered_makes_a_sealed_grant_and_the_next_matching_call_runs_without_a_card(rig):
    grant = await remembered(rig)
    assert (grant["granted_by"], grant["tool"], grant["tool_version"], grant["target"]) == (
        "alice", "refund", "1", "customer c-1")
    assert (grant["expires_at"], grant["revoked_at"], grant["approvals_required"]) == (None, None, 1)
    terms = GrantTerms(grant["id"], rig.session_id, "refund", "1", "customer c-1", 1, None)
    assert grant_seal_names(LEDGER_KEY.public_key(), grant["grant_seal"], terms)
    [created] = audit(rig, "grant.created")
    assert (created["actor"], created["subject"], created["detail"]["target"]) == ("alice", grant["id"], "customer c-1")

    await next_call(rig, amount=30, customer="c-1")
    assert requests(rig) == 1
    execute = rig.last("tool.execute")
    sealed = unseal(LEDGER_KEY.public_key(), execute["authorization"])
    assert (sealed["basis"], sealed["grant_id"], sealed["request_id"]) == ("grant", grant["id"], None)
    [row] = rig.rows("tool_calls", id=execute["call_id"])
    assert (row["grant_id"], row["status"]) == (grant["id"], "executing")
    [used] = audit(rig, "grant.used")
    assert (used["subject"], used["actor"], used["detail"]["call_id"]) == (grant["id"], "alice", execute["call_id"])
    proposed = audit(rig, "call.proposed")[-1]["detail"]
    assert (proposed["plan"], proposed["grant_id"]) == ("run", grant["id"])
    await finish(rig)


async def test_a_grant_for_this_target_does_not_cover_another_target_but_one_for_any_target_does(rig):
    await remembered(rig)
    await next_call(rig, amount=30, customer="c-2")
    assert requests(rig) == 2 and rig.rows("grants", target=None) == []

    other = Rig(catalogue())
    await remembered(other, target=None)
    await next_call(other, amount=30, customer="c-2")
    assert requests(other) == 1
    assert unseal(LEDGER_KEY.public_key(), other.last("tool.execute")["authorization"])["basis"] == "grant"


async def test_a_grant_covers_only_its_own_session(rig):
    grant = await remembered(rig, target=None)
    elsewhere = Rig(catalogue())
    elsewhere.database, elsewhere.ledger = rig.database, rig.ledger
    await next_call(elsewhere, amount=30, customer="c-1")
    assert [e["session_id"] for e in elsewhere.events("approval.requested")][-1] == elsewhere.session_id
    assert [r for r in rig.rows("tool_calls") if r.get("grant_id") == grant["id"]] == []


async def test_a_revoked_grant_covers_no_call_decided_after_it_and_the_audit_log_says_who_revoked_it(rig):
    grant = await remembered(rig)
    await revoke(rig, grant["id"], by="alice")
    [row] = rig.rows("grants")
    assert (row["revoked_by"], row["revoked_at"] is not None) == ("alice", True)
    [revoked] = audit(rig, "grant.revoked")
    assert (revoked["actor"], revoked["subject"], revoked["detail"]["reason"]) == ("alice", grant["id"], "enough")
    await next_call(rig, amount=30, customer="c-1")
    assert requests(rig) == 2
    assert [r["grant_id"] for r in rig.rows("tool_calls")] == [None, None]


async def test_an_expired_grant_covers_no_call(rig):
    await remembered(rig, hours=0.0001)  # 0.36 s
    await asyncio.sleep(0.5)
    await next_call(rig, amount=30, customer="c-1")
    assert requests(rig) == 2


async def test_a_grant_covers_no_call_of_another_tool_version(rig):
    await remembered(rig)
    rig.ledger.catalogue = catalogue(version="2")
    await next_call(rig, amount=30, customer="c-1")
    assert requests(rig) == 2


async def test_a_grant_given_on_a_one_approver_call_covers_no_call_needing_two(rig):
    requested = await rig.ask("pay", amount=20, customer="c-1")
    await rig.respond(requested, responder="alice", remember=Remember(target=None))
    await finish(rig)
    await next_call(rig, "pay", amount=5000, customer="c-1")
    assert requests(rig) == 2
    await rig.respond(rig.last("approval.requested"), responder="alice")
    assert rig.rejected() == []
    await rig.respond(rig.last("approval.requested"), responder="bob")
    await finish(rig)
    await next_call(rig, "pay", amount=30, customer="c-2")
    assert requests(rig) == 2


@pytest.mark.parametrize(
    ("tool", "remember", "code"),
    [
        ("publish_post", Remember(target=None), "tool_not_rememberable"),
        ("refund", Remember(target="customer mallory"), "other_target"),
        ("refund", Remember(target=None, hours=-1), "bad_duration"),
        ("refund", Remember(target=None, hours=24 * 367), "bad_duration"),
    ],
    ids=["not rememberable", "another target", "negative hours", "longer than a year"],
)
async def test_a_remember_the_ledger_may_not_give_refuses_the_whole_response_and_nothing_runs(rig, tool, remember,
                                                                                              code):
    arguments = {"title": "t"} if tool == "publish_post" else {"amount": 20, "customer": "c-1"}
    requested = await rig.ask(tool, **arguments)
    await rig.respond(requested, responder="alice", remember=remember)
    assert rig.rejected() == [code]
    [request] = rig.rows("approval_requests", id=requested["request_id"])
    assert request["status"] == "pending"
    assert rig.events("tool.execute") == [] and rig.rows("grants") == [] and rig.rows("approvals") == []
    [refused] = audit(rig, "response.rejected")
    assert refused["detail"]["reason_code"] == code


async def test_a_denial_cannot_be_remembered(rig):
    requested = await rig.ask("refund", amount=20, customer="c-1")
    await rig.respond(requested, "deny", responder="alice", reason="no", remember=Remember(target=None))
    assert rig.rejected() == ["remember_with_denial"]
    assert rig.rows("decisions") == [] and rig.rows("grants") == []


async def test_only_the_approval_that_decides_may_remember_and_it_does(rig):
    requested = await rig.ask("pay", amount=5000, customer="c-1")
    await rig.respond(requested, responder="alice", remember=Remember(target=None))
    assert rig.rejected() == ["remember_before_decided"]
    assert rig.rows("approvals") == []
    await rig.respond(requested, responder="alice")
    await rig.respond(requested, responder="bob", remember=Remember(target=None))
    [grant] = rig.rows("grants")
    assert (grant["granted_by"], grant["approvals_required"]) == ("bob", 2)
    await finish(rig)
    await next_call(rig, "pay", amount=4000, customer="c-9")
    assert requests(rig) == 1


@pytest.mark.parametrize("by", ["alice", "bob", "ann", "olga"], ids=["granter", "approver", "starter", "operator"])
async def test_the_granter_an_approver_the_sessions_starter_or_an_operator_may_revoke(rig, by):
    grant = await remembered(rig)
    await revoke(rig, grant["id"], by=by)
    assert rig.rows("grants")[0]["revoked_by"] == by


async def test_anyone_else_may_not_revoke_and_a_grant_is_revoked_once_in_its_own_session(rig):
    grant = await remembered(rig)
    await revoke(rig, grant["id"], by="mallory")
    await revoke(rig, mint("grt"))
    await revoke(rig, grant["id"], session_id=mint("ses"))
    assert rig.rows("grants")[0]["revoked_at"] is None
    await revoke(rig, grant["id"])
    await revoke(rig, grant["id"])
    assert rig.rejected() == ["may_not_revoke", "unknown_grant", "unknown_session", "grant_revoked"]


async def test_an_edited_approval_cannot_be_remembered_and_the_edit_is_not_applied(rig):
    requested = await rig.ask("refund", amount=20, customer="c-1")
    await rig.respond(requested, responder="alice", remember=Remember(target=None),
                      edited_arguments={"amount": 25, "customer": "c-1"})
    assert rig.rejected() == ["remember_with_edit"]
    assert rig.rows("tool_calls")[0]["arguments"] == {"amount": 20, "customer": "c-1"}
    assert rig.events("tool.execute") == [] and rig.rows("grants") == []
