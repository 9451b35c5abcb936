"""Approve and remember on the real services and the gateway, on
both stores: an approval remembered for this target runs the session's next matching
call with no card, not one on another target nor in another session; a revocation
makes the next call ask again; and forged remembers (a tool that may not be
remembered, a widened target, a bad duration) or a forged grant basis sent straight to
the executor are refused, with nothing run."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
import yaml

from shared import keyring
from shared.authorization import authorize
from shared.ledger.tables import ApprovalRequest, AuditEntry, Grant, ToolCall
from shared.messages import ExecuteTool, mint, now
from tests.gateway_client import GatewayClient
from tests.harness import eventually, next_event, rows
from tests.integration.test_gateway import add_people, nothing_decided, pending_card, problem, url


def tools_with_a_rememberable_refund(deployment):
    """The tests' tools, with `refund` rememberable (it is outward, so it says so) and
    its target the customer."""
    catalogue = yaml.safe_load(deployment.tools_file.read_text())
    for tool in catalogue["tools"]:
        if tool["name"] == "refund":
            tool["rememberable"] = {"outward": True}
            tool["target"] = "customer {customer}"
    path = deployment.data_dir.parent / "tools-with-a-rememberable-refund.yaml"
    path.write_text(yaml.safe_dump(catalogue))
    return path


@pytest.fixture
def gateway(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.tools_file = tools_with_a_rememberable_refund(deployment)
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    return deployment


async def turn(client: GatewayClient, session_id: str) -> None:
    """A turn in the session (a new one, or the next in one the client started)."""
    answer = await client.post("/v1/sessions", {"text": "go", "session_id": session_id})
    assert answer.status_code == 202, answer.text


async def idle(client: GatewayClient, session_id: str) -> None:
    async def done():
        return (await client.get(f"/v1/sessions/{session_id}")).json()["status"] == "idle"

    await eventually(done, 30)


async def refunds(sink, count: int) -> None:
    await eventually(lambda: asyncio.sleep(0, sink.counts["/refunds"] == count), 30)


async def test_approve_and_remember_runs_the_next_matching_call_without_a_card_and_after_revocation_it_asks_again(
        gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        session_id = f"remember-{mint('ses')}"
        await turn(alice, session_id)
        card = await pending_card(alice, session_id)
        assert (card["rememberable"], card["target"]) == (True, "customer c-1")
        verdict = await alice.decide(card["id"], args_digest=card["args_digest"],
                                     remember={"target": card["target"], "hours": None})
        assert verdict.status_code == 200 and verdict.json()["decided"] is True, verdict.text
        await refunds(sink, 1)
        await idle(alice, session_id)
        [grant] = (await alice.get(f"/v1/sessions/{session_id}/grants")).json()["grants"]
        assert (grant["granted_by"], grant["tool"], grant["target"], grant["live"]) == (
            "alice", "refund", "customer c-1", True)

        # The next refund to c-1 runs with no card, authorized by the grant.
        await turn(alice, session_id)
        await refunds(sink, 2)
        await idle(alice, session_id)
        assert len(await rows(gateway, ApprovalRequest, session_id=session_id)) == 1
        by_grant = [c for c in await rows(gateway, ToolCall, session_id=session_id) if c.grant_id == grant["id"]]
        assert len(by_grant) == 1
        [used] = await rows(gateway, AuditEntry, session_id=session_id, kind="grant.used")
        assert used.detail["call_id"] == by_grant[0].id

        # Another customer is another target: the grant does not cover it.
        await turn(alice, session_id)
        other = await pending_card(alice, session_id)
        assert other["target"] == "customer c-2"
        assert (await alice.decide(other["id"], "deny", reason="not this one")).status_code == 200
        await idle(alice, session_id)

        revoked = await alice.post(f"/v1/grants/{grant['id']}/revoke", {"reason": "enough"})
        assert revoked.status_code == 202, revoked.text
        await eventually(lambda: _revoked(gateway, grant["id"]), 20)
        await turn(alice, session_id)
        again = await pending_card(alice, session_id)
        assert again["target"] == "customer c-1"
        assert sink.counts["/refunds"] == 2
    kinds = [e.kind for e in await rows(gateway, AuditEntry, session_id=session_id)]
    assert kinds.count("grant.created") == kinds.count("grant.used") == kinds.count("grant.revoked") == 1
    [row] = await rows(gateway, Grant, id=grant["id"])
    assert row.revoked_by == "alice"


async def _revoked(deployment, grant_id: str) -> bool:
    [row] = await rows(deployment, Grant, id=grant_id)
    return row.revoked_at is not None


async def test_a_grant_covers_no_call_of_another_session(gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        first = f"remember-{mint('ses')}"
        await turn(alice, first)
        card = await pending_card(alice, first)
        assert (await alice.decide(card["id"], remember={"target": None})).json()["decided"] is True
        await refunds(sink, 1)
        second = f"remember-{mint('ses')}"
        await turn(alice, second)
        await pending_card(alice, second)
        assert sink.counts["/refunds"] == 1


async def test_forged_remembers_and_a_forged_grant_basis_are_refused_and_nothing_runs(gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        reviewed = f"reviewed-{mint('ses')}"
        await turn(alice, reviewed)
        card = await pending_card(alice, reviewed)
        assert card["rememberable"] is False
        # The page offers no "approve and remember" for it; a crafted POST asks anyway.
        assert 'id="remember-form"' not in (await alice.get(f"/inbox/requests/{card['id']}")).text
        refused = await alice.decide(card["id"], args_digest=card["args_digest"], remember={"target": None})
        assert problem(refused, 409, "tool-not-rememberable")["reason_code"] == "tool_not_rememberable"
        await nothing_decided(gateway, card, sink, "/reviewed")

        session_id = f"remember-{mint('ses')}"
        await turn(alice, session_id)
        card = await pending_card(alice, session_id)
        widened = await alice.decide(card["id"], remember={"target": "customer mallory"})
        assert problem(widened, 409, "other-target")["reason_code"] == "other_target"
        forever = await alice.decide(card["id"], remember={"target": None, "hours": -5})
        assert problem(forever, 409, "bad-duration")["reason_code"] == "bad_duration"
        await nothing_decided(gateway, card, sink, "/refunds")
        assert await rows(gateway, Grant, session_id=session_id) == []

    # A grant basis for the pending call, sealed with the ledger's own key (as a thief of it
    # could), naming a grant that exists in another session: no grant of this call is on record.
    async with GatewayClient(url(gateway)) as bob:
        await bob.login("bob")
        elsewhere = f"remember-{mint('ses')}"
        await turn(bob, elsewhere)
        theirs = await pending_card(bob, elsewhere)
        assert (await bob.decide(theirs["id"], remember={"target": None})).json()["decided"] is True
        await refunds(sink, 1)
        [grant] = await rows(gateway, Grant, session_id=elsewhere)
    [call] = await rows(gateway, ToolCall, session_id=session_id)
    forged = ExecuteTool(session_id=session_id, call_id=call.id, tool="refund", arguments=call.arguments,
                         idempotency_key=call.idempotency_key)
    forged = forged.model_copy(update={"authorization": authorize(
        keyring.ledger_private_key(gateway.settings.keys_path), forged, basis="grant", request_id=None, at=now(),
        ttl=timedelta(minutes=5), grant_id=grant.id)})
    async with gateway.console() as console:
        alerts = await console.watch(session_id)
        async with gateway.console(identity="publisher") as thief:
            await thief.send(forged)
        alert = await next_event(alerts, "operator.alerted")
    assert (alert.call_id, alert.reason_code) == (call.id, "not_on_record")
    assert "no grant of this call is on record" in alert.reason_text
    assert sink.counts["/refunds"] == 1


async def test_signoff_grants_lists_a_sessions_grants_and_revokes_one_and_the_audit_story_tells_it(gateway, sink):
    from tests.integration.test_command_line import signoff_here as signoff

    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        session_id = f"remember-{mint('ses')}"
        await turn(alice, session_id)
        card = await pending_card(alice, session_id)
        assert (await alice.decide(card["id"], remember={"target": card["target"], "hours": 2})).json()["decided"]
        await refunds(sink, 1)
        await idle(alice, session_id)
        [grant] = await rows(gateway, Grant, session_id=session_id)
        listed = await asyncio.to_thread(signoff, gateway, "grants", "--session", session_id)
        assert f"{grant.id}  live  session {session_id}  refund v1 on customer c-1, until " in listed, listed
        assert "given by alice" in listed
        revoked = await asyncio.to_thread(signoff, gateway, "grants", "revoke", grant.id, "--reason", "done")
        assert f"revoked grant {grant.id}" in revoked, revoked
        listed = await asyncio.to_thread(signoff, gateway, "grants", "--session", session_id)
        assert f"{grant.id}  revoked by " in listed, listed
        again = await asyncio.to_thread(signoff, gateway, "grants", "revoke", grant.id, check=False)
        assert "not revoked: grant_revoked" in again, again
        story = await asyncio.to_thread(signoff, gateway, "audit", "show", session_id)
        assert f"alice approved {card['id']} and remembered it: grant {grant.id}" in story, story
        assert f"revoked grant {grant.id} (refund)" in story and ": done" in story, story
        await turn(alice, session_id)
        await pending_card(alice, session_id)
        assert sink.counts["/refunds"] == 1
