"""Approval that depends on the arguments (issue 23, section 4) on the real services
and the gateway, on both stores: a refund of 20 runs with no card, one of 5,000 needs
two approvers, and the card (API, inbox page) and the audit log say why."""

from __future__ import annotations

import asyncio

import pytest
import yaml
from sqlalchemy import select

from shared.ledger.tables import ApprovalRequest, AuditEntry
from tests.gateway_client import GatewayClient
from tests.harness import eventually
from tests.integration.test_gateway import add_people, pending_card, start, url

WHY_LARGE = "amount 5,000 above 100; amount 5,000 > 1,000: two approvers"


def tools_with_a_refund_rule(deployment):
    """The tests' tools, with `refund` approved by rule: up to 100 needs nobody, above
    1,000 two approvers, else one."""
    catalogue = yaml.safe_load(deployment.tools_file.read_text())
    for tool in catalogue["tools"]:
        if tool["name"] == "refund":
            tool["approval"] = [
                {"when": "args.amount <= 100", "then": "never", "reason": "amount {amount:,} up to 100: no approval"},
                {"then": "always", "reason": "amount {amount:,} above 100"},
            ]
            tool["approvals_required"] = [
                {"when": "args.amount > 1000", "then": 2, "reason": "amount {amount:,} > 1,000: two approvers"},
                {"then": 1, "reason": "amount {amount:,} up to 1,000: one approver"},
            ]
    path = deployment.data_dir.parent / "tools-with-a-refund-rule.yaml"
    path.write_text(yaml.safe_dump(catalogue))
    return path


@pytest.fixture
def gateway(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.tools_file = tools_with_a_refund_rule(deployment)
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    return deployment


async def audit_of(deployment, session_id: str) -> list[AuditEntry]:
    async with deployment.ledger() as ledger, ledger() as db:
        return list((await db.scalars(select(AuditEntry).where(AuditEntry.session_id == session_id))).all())


async def test_a_small_refund_runs_unasked_and_a_large_one_needs_two_approvers_and_says_why(gateway, sink):
    async with GatewayClient(url(gateway)) as alice, GatewayClient(url(gateway)) as bob:
        await alice.login("alice")
        await bob.login("bob")
        small = await start(alice, "refund-small")
        await eventually(lambda: asyncio.sleep(0, sink.counts["/refunds"] == 1), 30)
        assert (await alice.get("/v1/requests", params={"session_id": small})).json()["requests"] == []

        large = await start(alice, "refund-large")
        card = await pending_card(alice, large)
        assert (card["approvals_required"], card["reason"]) == (2, WHY_LARGE)
        page = await alice.get(f"/inbox/requests/{card['id']}")
        assert page.status_code == 200 and "amount 5,000 &gt; 1,000: two approvers" in page.text
        first = (await alice.decide(card["id"])).json()
        assert (first["decided"], first["approvals"], first["approvals_required"]) == (False, 1, 2)
        assert sink.counts["/refunds"] == 1
        assert (await bob.decide(card["id"])).json()["decided"] is True
        await eventually(lambda: asyncio.sleep(0, sink.counts["/refunds"] == 2), 30)

    async with gateway.ledger() as ledger, ledger() as db:
        request = await db.get(ApprovalRequest, card["id"])
        assert (request.approvals_required, request.reason, request.card["reason"]) == (2, WHY_LARGE, WHY_LARGE)
    [ran] = [e for e in await audit_of(gateway, small) if e.kind == "call.proposed"]
    assert (ran.detail["plan"], ran.detail["reason"]) == ("run", "amount 20 up to 100: no approval")
    [asked] = [e for e in await audit_of(gateway, large) if e.kind == "approval.requested"]
    assert (asked.detail["approvals_required"], asked.detail["reason"]) == (2, WHY_LARGE)
