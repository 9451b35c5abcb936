"""Approval that depends on the arguments and edit before approve
(section 2) on the real services and the gateway, on both stores: a refund of 20 runs
with no card, one of 5,000 needs two approvers, and the card (API, inbox page) and the
audit log say why; an approval with edited arguments runs exactly them, and forged
edits are refused with nothing run."""

from __future__ import annotations

import asyncio
import html
import json
import re

import pytest
import yaml
from sqlalchemy import select

from shared.ledger.tables import ApprovalRequest, AuditEntry, Decision, ToolCall
from tests.gateway_client import GatewayClient
from tests.harness import eventually, rows
from tests.integration.test_gateway import add_people, nothing_decided, pending_card, problem, start, url

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
            tool["editable"] = ["amount"]
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


async def test_an_approval_with_edited_arguments_runs_exactly_them_and_the_audit_log_keeps_both(gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        large = await start(alice, "refund-large")
        card = await pending_card(alice, large)
        edited = {"amount": 900, "customer": "c-2"}
        verdict = (await alice.decide(card["id"], args_digest=card["args_digest"], arguments=edited)).json()
        # 900 needs one approver: the edited arguments were judged again, and alice's approval decides.
        assert verdict["decided"] is True, verdict
        await eventually(lambda: asyncio.sleep(0, sink.counts["/refunds"] == 1), 30)
        shown = (await alice.get(f"/v1/requests/{card['id']}")).json()
        assert (shown["arguments"], shown["edited_by"], shown["approvals_required"]) == (edited, "alice", 1)
    assert json.loads(sink.requests[-1]["body"]) == edited
    [call] = await rows(gateway, ToolCall, session_id=large)
    assert call.arguments == edited
    [decision] = await rows(gateway, Decision, request_id=card["id"])
    assert decision.message.startswith("alice changed the arguments before approving")
    [entry] = [e for e in await audit_of(gateway, large) if e.kind == "arguments.edited"]
    assert (entry.actor, entry.detail["original_digest"], entry.detail["changed"]) == (
        "alice", card["args_digest"], ["amount"])


async def test_a_forged_edit_of_a_field_that_is_not_editable_or_for_other_arguments_is_refused_and_nothing_runs(
        gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        card = await pending_card(alice, await start(alice, "refund-large"))
        widened = await alice.decide(card["id"], args_digest=card["args_digest"],
                                     arguments={"amount": 5000, "customer": "mallory"})
        assert problem(widened, 409, "field-not-editable")["reason_code"] == "field_not_editable"
        other = await alice.decide(card["id"], args_digest="0" * 64, arguments={"amount": 10, "customer": "c-2"})
        assert problem(other, 409, "digest-mismatch")["reason_code"] == "digest_mismatch"
        await nothing_decided(gateway, card, sink, "/refunds")
        [call] = await rows(gateway, ToolCall, session_id=card["session_id"])
        assert call.arguments == {"amount": 5000, "customer": "c-2"}


async def test_the_inbox_card_page_offers_the_editable_fields_and_its_edit_form_approves_the_edited_arguments(
        gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        large = await start(alice, "refund-large")
        card = await pending_card(alice, large)
        page = (await alice.get(f"/inbox/requests/{card['id']}")).text
        assert 'id="edit-form"' in page and 'name="arg.amount"' in page and 'name="arg.customer"' not in page
        sent = await alice.http.post(
            f"/inbox/requests/{card['id']}/decision",
            data={"csrf_token": alice.csrf, "idempotency_key": "edit-1", "decision": "approve", "edit": "1",
                  "args_digest": card["args_digest"], "arg.amount": "700"},
            headers=alice.headers(csrf=False, Origin=url(gateway)),
        )
        assert sent.status_code == 303, sent.text
        await eventually(lambda: asyncio.sleep(0, sink.counts["/refunds"] == 1), 30)
    assert json.loads(sink.requests[-1]["body"]) == {"amount": 700, "customer": "c-2"}


HOSTILE = "c\u202e-2 \u2066x\u2069\u200by\ufeff"


async def test_the_edit_form_shows_invisible_and_reordering_characters_as_escapes_and_sent_unchanged_keeps_them(
        deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.tools_file = tools_with_a_refund_rule(deployment)
    catalogue = yaml.safe_load(deployment.tools_file.read_text())
    next(t for t in catalogue["tools"] if t["name"] == "refund")["editable"] = ["amount", "customer"]
    deployment.tools_file.write_text(yaml.safe_dump(catalogue))
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    async with GatewayClient(url(deployment)) as alice:
        await alice.login("alice")
        card = await pending_card(alice, await start(alice, "refund-hostile"))
        assert card["arguments"]["customer"] == HOSTILE
        page = (await alice.get(f"/inbox/requests/{card['id']}")).text
        [value] = re.findall(r'name="arg\.customer" value="([^"]*)"', page)
        shown = html.unescape(value)
        assert shown == "c\\u202e-2 \\u2066x\\u2069\\u200by\\ufeff"
        assert not any(char in page for char in "\u202e\u2066\u2069\u200b\ufeff")
        # Sent back as shown, the field is unchanged: the call runs with the name as the model wrote it.
        sent = await alice.http.post(
            f"/inbox/requests/{card['id']}/decision",
            data={"csrf_token": alice.csrf, "idempotency_key": "edit-1", "decision": "approve", "edit": "1",
                  "args_digest": card["args_digest"], "arg.amount": "700", "arg.customer": shown},
            headers=alice.headers(csrf=False, Origin=url(deployment)),
        )
        assert sent.status_code == 303, sent.text
        await eventually(lambda: asyncio.sleep(0, sink.counts["/refunds"] == 1), 30)
    assert json.loads(sink.requests[-1]["body"]) == {"amount": 700, "customer": HOSTILE}


async def test_one_answer_in_the_tools_place_closes_a_request_that_needs_two_approvers_and_nothing_runs(gateway, sink):
    async with GatewayClient(url(gateway)) as alice, GatewayClient(url(gateway)) as bob:
        await alice.login("alice")
        await bob.login("bob")
        large = await start(alice, "refund-large")
        card = await pending_card(alice, large)
        first = (await alice.decide(card["id"])).json()
        assert (first["decided"], first["approvals"]) == (False, 1)
        assert 'id="respond-form"' in (await bob.get(f"/inbox/requests/{card['id']}")).text

        def answered(idempotency_key: str, message: str):
            return bob.http.post(
                f"/inbox/requests/{card['id']}/decision",
                data={"csrf_token": bob.csrf, "idempotency_key": idempotency_key, "decision": "respond",
                      "message": message},
                headers=bob.headers(csrf=False, Origin=url(gateway)),
            )  # fmt: skip

        empty = await answered("answer-0", "  ")
        assert empty.status_code == 422 and "Write your answer" in empty.text
        problem(await bob.decide(card["id"], "respond"), 422, "invalid")  # the API: no message, no answer
        sent = await answered("answer-1", "Refunded by cheque last week; nothing to pay.")
        assert sent.status_code == 303, sent.text
        await eventually(lambda: _request_is(gateway, card["id"], "answered"), 30)
    assert sink.counts["/refunds"] == 0
    [decision] = await rows(gateway, Decision, request_id=card["id"])
    assert (decision.decision, decision.responder) == ("respond", "bob")
    [closed] = [e for e in await audit_of(gateway, large) if e.kind == "call.closed"]
    assert (closed.detail["closed_as"], closed.detail["reason_text"]) == (
        "answered", "Refunded by cheque last week; nothing to pay.")


async def _request_is(deployment, request_id: str, status: str) -> bool:
    [request] = await rows(deployment, ApprovalRequest, id=request_id)
    return request.status == status
