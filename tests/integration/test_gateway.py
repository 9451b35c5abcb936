"""The HTTP gateway (services/gateway), a real process beside the real services, on
both stores: people log in and decide through it, and the ledger judges each
response as it judges any channel's; the gateway only reads what the ledger
committed and holds no state of its own."""

from __future__ import annotations

import asyncio

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
