"""The HTTP gateway (services/gateway), a real process beside the real services, on
both stores: people log in and decide through it, and the ledger judges each
response as it judges any channel's; the gateway only reads what the ledger
committed and holds no state of its own."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.gateway import users
from shared.ledger.tables import ApprovalRequest, AuditEntry, Decision, InboxRow
from shared.messages import mint
from tests.gateway_client import PASSWORD, PEOPLE, GatewayClient
from tests.harness import eventually, rows


def add_people(deployment) -> None:
    keys = deployment.data_dir / "keys"
    for name, groups, operator in PEOPLE:
        users.add(keys, keys / "gateway" / "users.yaml", name, PASSWORD, list(groups), operator)


@pytest.fixture
def gateway(deployment, sink):
    """The four services and one gateway, with the tests' people as its users."""
    deployment.extra_env["SINK_URL"] = sink.url
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    return deployment


def url(deployment, name: str = "gateway") -> str:
    return f"http://127.0.0.1:{deployment.gateway_ports[name]}"


async def pending_card(client: GatewayClient, session_id: str, timeout: float = 20.0) -> dict:
    async def found():
        answer = await client.get("/v1/requests", params={"status": "pending", "session_id": session_id})
        assert answer.status_code == 200, answer.text
        return answer.json()["requests"]

    [card] = await eventually(found, timeout)
    return card


async def start(client: GatewayClient, prefix: str) -> str:
    session_id = f"{prefix}-{mint('ses')}"
    answer = await client.post("/v1/sessions", {"text": "go", "session_id": session_id})
    assert answer.status_code == 202, answer.text
    assert answer.json()["session_id"] == session_id
    return session_id


async def test_a_person_logs_in_and_approves_and_the_tool_runs_once_in_their_name(gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        assert (await alice.login("alice")).status_code == 200
        session_id = await start(alice, "reviewed")
        card = await pending_card(alice, session_id)
        assert card["tool"] == "post_reviewed" and card["approvers"] == ["alice", "bob", "carol"]
        answer = await alice.decide(card["id"])
        assert answer.status_code == 200, answer.text
        verdict = answer.json()
        assert (verdict["outcome"], verdict["responder"], verdict["decided"]) == ("accepted", "alice", True)
        await eventually(lambda: _async(sink.counts["/reviewed"] == 1))
        shown = (await alice.get(f"/v1/sessions/{session_id}")).json()
        await eventually(lambda: _session_status(alice, session_id, "idle"), 30)
    [decision] = await rows(gateway, Decision, request_id=card["id"])
    assert (decision.responder, decision.channel, decision.decision) == ("alice", "gateway", "approve")
    audit = await rows(gateway, AuditEntry, session_id=session_id, kind="response.accepted")
    assert [(a.actor, a.detail["channel"]) for a in audit] == [("alice", "gateway")]
    [request] = await rows(gateway, ApprovalRequest, id=card["id"])
    assert request.status == "approved" and shown["started_by"] == "alice"
    await asyncio.sleep(0.5)
    assert sink.counts["/reviewed"] == 1


async def _async(value):
    return value


async def _session_status(client, session_id, status):
    return (await client.get(f"/v1/sessions/{session_id}")).json()["status"] == status


def problem(answer, status: int, kind: str) -> dict:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json"), answer.headers
    document = answer.json()
    assert document["type"] == f"urn:signoff:problem:{kind}" and document["status"] == status, document
    return document


async def nothing_decided(deployment, card: dict, sink, path: str) -> None:
    """The request is still pending, no response to it was accepted and its tool never ran."""
    [request] = await rows(deployment, ApprovalRequest, id=card["id"])
    assert request.status == "pending"
    assert await rows(deployment, Decision, request_id=card["id"]) == []
    accepted = await rows(deployment, AuditEntry, session_id=card["session_id"], kind="response.accepted")
    assert accepted == []
    assert sink.counts[path] == 0


async def test_a_person_who_is_not_an_approver_is_refused_with_the_ledgers_reason_and_nothing_changes(gateway, sink):
    async with GatewayClient(url(gateway)) as sam, GatewayClient(url(gateway)) as mallory:
        await sam.login("sam")
        await mallory.login("mallory")
        session_id = await start(sam, "reviewed")
        card = await pending_card(sam, session_id)
        refused = problem(await mallory.decide(card["id"]), 403, "not-an-approver")
        assert refused["reason_code"] == "not_an_approver" and "mallory" in refused["detail"]
        await nothing_decided(gateway, card, sink, "/reviewed")
        [rejected] = await rows(gateway, AuditEntry, session_id=session_id, kind="response.rejected")
        assert (rejected.actor, rejected.detail["channel"]) == ("mallory", "gateway")


async def test_the_starter_is_refused_for_a_tool_that_forbids_it_and_two_people_complete_a_two_approver_tool(
        gateway, sink):
    async with GatewayClient(url(gateway)) as sam, GatewayClient(url(gateway)) as alice, \
            GatewayClient(url(gateway)) as bob:
        for client, name in ((sam, "sam"), (alice, "alice"), (bob, "bob")):
            await client.login(name)
        separated = await pending_card(sam, await start(sam, "separated"))
        assert problem(await sam.decide(separated["id"]), 403, "starter-may-not-approve")["reason_code"] == \
            "starter_may_not_approve"
        await nothing_decided(gateway, separated, sink, "/separated")
        assert (await alice.decide(separated["id"])).json()["decided"] is True

        four_eyes = await pending_card(sam, await start(sam, "four-eyes"))
        first = (await alice.decide(four_eyes["id"])).json()
        assert (first["decided"], first["approvals"], first["approvals_required"]) == (False, 1, 2)
        assert (await alice.get(f"/v1/requests/{four_eyes['id']}")).json()["approvals"] == 1
        second = (await bob.decide(four_eyes["id"])).json()
        assert (second["decided"], second["responder"]) == (True, "bob")
        await eventually(lambda: _async(sink.counts["/four-eyes"] == 1 and sink.counts["/separated"] == 1))
    [decision] = await rows(gateway, Decision, request_id=four_eyes["id"])
    assert decision.responder == "bob" and decision.channel == "gateway"


async def test_without_the_csrf_token_from_another_origin_or_with_an_ended_session_nothing_changes(
        deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SIGNOFF_GATEWAY_SESSION_SECONDS="12")
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    async with GatewayClient(url(deployment)) as alice, GatewayClient(url(deployment)) as bob:
        await alice.login("alice")
        logged_in = time.monotonic()
        card = await pending_card(alice, await start(alice, "reviewed"))
        decision = {"decision": "approve"}
        path = f"/v1/requests/{card['id']}/decision"
        problem(await alice.post(path, decision, csrf=False, headers={"Idempotency-Key": "k1"}), 403, "csrf")
        problem(await alice.post(path, decision, headers={"Idempotency-Key": "k2", "X-CSRF-Token": "forged"}),
                403, "csrf")
        # The cookie and token sent by a page of another origin (a browser names it).
        problem(await alice.post(path, decision, headers={"Idempotency-Key": "k3", "Origin": "https://evil.test"}),
                403, "cross-origin")
        # Another person's CSRF token with alice's cookie.
        await bob.login("bob")
        problem(await alice.post(path, decision, headers={"Idempotency-Key": "k4", "X-CSRF-Token": bob.csrf}),
                403, "csrf")
        # A cookie altered to name someone else.
        forged = GatewayClient(url(deployment))
        payload, mac = alice.cookie.split(".")
        forged.cookie, forged.csrf = bob.cookie.split(".")[0] + "." + mac, alice.csrf
        problem(await forged.decide(card["id"]), 401, "unauthenticated")
        await forged.http.aclose()
        # Logged out: the cookie no longer counts, on any replica.
        assert (await bob.post("/v1/logout")).status_code == 204
        problem(await bob.decide(card["id"]), 401, "unauthenticated")
        # Expired.
        assert time.monotonic() - logged_in < 11, "too slow to check the other cases before the session ended"
        await asyncio.sleep(max(0.0, logged_in + 12.5 - time.monotonic()))
        problem(await alice.decide(card["id"]), 401, "unauthenticated")
        await nothing_decided(deployment, card, sink, "/reviewed")
        assert await rows(deployment, AuditEntry, session_id=card["session_id"], kind="response.rejected") == []


async def test_the_same_idempotency_key_twice_and_two_keys_racing_make_one_decision_and_one_run(gateway, sink):
    async with GatewayClient(url(gateway)) as alice, GatewayClient(url(gateway, "gateway")) as bob:
        await alice.login("alice")
        await bob.login("bob")
        card = await pending_card(alice, await start(alice, "reviewed"))
        once = await alice.decide(card["id"], key="approve-once")
        again = await alice.decide(card["id"], key="approve-once")
        assert once.status_code == again.status_code == 200 and once.json() == again.json()
        # The same key for another decision is refused, and sends nothing.
        problem(await alice.decide(card["id"], "deny", key="approve-once"), 422, "idempotency-key-reused")
        [decision] = await rows(gateway, Decision, request_id=card["id"])
        assert decision.response_id == once.json()["response_id"]
        assert len(await rows(gateway, InboxRow, session_id=card["session_id"], message_type="approval.respond")) == 1

        raced = await pending_card(alice, await start(alice, "reviewed"))
        answers = await asyncio.gather(alice.decide(raced["id"], key="race-1"), bob.decide(raced["id"], key="race-2"))
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200, 409], [a.text for a in answers]
        loser = next(a for a in answers if a.status_code == 409).json()
        assert loser["reason_code"] == "already_decided"
        await eventually(lambda: _async(sink.counts["/reviewed"] == 2))
    assert len(await rows(gateway, Decision, request_id=raced["id"])) == 1
    await asyncio.sleep(0.5)
    assert sink.counts["/reviewed"] == 2
