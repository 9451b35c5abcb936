"""Turns through the HTTP gateway, on both stores: a session's read says how its last
turn ended and why; a caller names its turn with an Idempotency-Key, and a repeat is
answered with the turn it already started, never a second one; a start the ledger
refuses because the session is busy is answered 409, naming the busy turn."""

from __future__ import annotations

import pytest

from shared.ledger.tables import ApprovalRequest, Turn
from shared.messages import mint
from signoff.client import AsyncClient
from tests.gateway_client import PASSWORD, GatewayClient
from tests.harness import eventually, rows
from tests.integration.test_gateway import add_people, pending_card, url


@pytest.fixture
def gateway(deployment, sink):
    """The four services and one gateway; a turn ends at its second model step."""
    deployment.extra_env.update(SINK_URL=sink.url, SIGNOFF_TURN_MAX_STEPS="2")
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    return deployment


async def test_a_session_whose_last_turn_failed_says_so_and_why_over_http(gateway):
    session_id = "loop-" + mint("ses")[4:]  # the scripted model asks for an unknown tool forever
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        started = await alice.post("/v1/sessions", {"text": "do the impossible", "session_id": session_id})
        assert started.status_code == 202, started.text

        async def ended():
            shown = (await alice.get(f"/v1/sessions/{session_id}")).json()
            return shown if (shown.get("last_turn") or {}).get("status") == "failed" else None

        shown = await eventually(ended, 60)
    last = shown["last_turn"]
    [turn] = await rows(gateway, Turn, session_id=session_id)
    assert (last["id"], last["reason_code"], last["started_by"]) == (turn.id, "step_limit", "alice")
    assert last["reason"].startswith("The turn reached its bound of 2 model steps"), last
    assert last["ended_at"] is not None
    assert shown["status"] == "idle"
    assert shown["status_reason"].startswith("last turn failed (step_limit): The turn reached its bound"), shown


async def test_the_same_idempotency_key_answers_with_the_turn_it_started_even_after_it_ended_and_nothing_runs_twice(
    gateway, sink
):
    key = {"Idempotency-Key": "start-" + mint("k")}
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        first = await alice.post("/v1/sessions", {"text": "post it"}, headers=key)
        assert first.status_code == 202, first.text
        started = first.json()
        assert started["turn_id"].startswith("trn_") and started["repeated"] is False
        again = (await alice.post("/v1/sessions", {"text": "post it"}, headers=key)).json()
        assert (again["session_id"], again["turn_id"], again["repeated"]) == (
            started["session_id"], started["turn_id"], True), "a repeat while it waits: the same turn"

        card = await pending_card(alice, started["session_id"])
        assert (await alice.decide(card["id"])).status_code == 200

        async def completed():
            shown = (await alice.get(f"/v1/sessions/{started['session_id']}")).json()
            return (shown.get("last_turn") or {}).get("status") == "completed"

        await eventually(completed, 30)
        late = await alice.post("/v1/sessions", {"text": "post it"}, headers=key)
        assert late.status_code == 202, late.text
        assert (late.json()["turn_id"], late.json()["repeated"]) == (started["turn_id"], True)

        other = await alice.post("/v1/sessions", {"text": "post something else"}, headers=key)
        assert other.status_code == 422, other.text
        assert other.json()["reason_code"] == "idempotency_key_reused"
        assert other.headers["content-type"] == "application/problem+json"
    session_id = started["session_id"]
    assert len(await rows(gateway, Turn, session_id=session_id)) == 1
    assert len(await rows(gateway, ApprovalRequest, session_id=session_id)) == 1, "one card for the one call"
    assert sink.counts["/sink"] == 1


async def test_a_start_for_a_session_that_waits_on_a_person_is_answered_409_naming_its_open_turn(gateway):
    session_id = "reviewed-" + mint("ses")[4:]
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        first = await alice.post("/v1/sessions", {"text": "go", "session_id": session_id})
        assert first.status_code == 202, first.text
        await pending_card(alice, session_id)
        busy = await alice.post("/v1/sessions", {"text": "go again", "session_id": session_id})
    assert busy.status_code == 409, busy.text
    assert busy.headers["content-type"] == "application/problem+json"
    problem = busy.json()
    assert (problem["reason_code"], problem["turn_id"]) == ("session_busy", first.json()["turn_id"])
    assert first.json()["turn_id"] in problem["detail"]
    assert len(await rows(gateway, Turn, session_id=session_id)) == 1


async def test_the_sdk_names_its_turn_and_a_repeat_gets_the_same_turn(gateway):
    key = "sdk-" + mint("k")
    async with AsyncClient(url(gateway), "alice", PASSWORD) as signoff:
        first = await signoff.start_session("post it", idempotency_key=key)
        again = await signoff.start_session("post it", idempotency_key=key)
    assert (again.session_id, again.turn_id, again.repeated) == (first.session_id, first.turn_id, True)
