"""Programs at the gateway: API tokens (`signoff token create`), a real gateway process
beside the real services, on both stores. A token speaks as `bot:<name>`, does only what
its scopes allow, and approves only when its scope says so and the tool's approvers name it."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import httpx
import pytest
import yaml

from services.gateway import programs
from shared.ledger.tables import AuditEntry, Decision, Session
from tests.gateway_client import GatewayClient
from tests.harness import eventually, rows
from tests.integration.test_gateway import (
    add_people,
    gateway_alone,
    nothing_decided,
    pending_card,
    problem,
    start,
    url,
)

BOT = "ci-bot"


def tools_naming_the_bot(deployment) -> Path:
    """The tests' tools, with `post_reviewed` also approvable by bot:ci-bot (the others do not name it)."""
    catalogue = yaml.safe_load(deployment.tools_file.read_text())
    for tool in catalogue["tools"]:
        if tool["name"] == "post_reviewed":
            tool["approvers"] = [*tool["approvers"], programs.principal_of(BOT)]
    path = deployment.data_dir.parent / "tools-naming-a-bot.yaml"
    path.write_text(yaml.safe_dump(catalogue))
    return path


@pytest.fixture
def gateway(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.tools_file = tools_naming_the_bot(deployment)
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    return deployment


def make_token(deployment, name: str, scopes: str) -> str:
    keys = deployment.data_dir / "keys"
    token, _ = programs.create(keys, keys / "gateway" / "users.yaml", name, programs.parse_scopes(scopes))
    return token


class Program:
    """A program's HTTP client: `Authorization: Bearer`, no cookie, no CSRF token."""

    def __init__(self, deployment, token: str) -> None:
        self.http = httpx.AsyncClient(base_url=url(deployment), timeout=30,
                                      headers={"Authorization": f"Bearer {token}"})

    async def __aenter__(self) -> Program:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.http.aclose()

    async def decide(self, request_id: str, decision: str = "approve") -> httpx.Response:
        return await self.http.post(f"/v1/requests/{request_id}/decision", json={"decision": decision},
                                    headers={"Idempotency-Key": secrets.token_hex(8)})


async def test_a_token_with_sessions_start_starts_a_session_but_without_requests_decide_cannot_approve(
        gateway, sink):
    token = make_token(gateway, BOT, "sessions:start,requests:read")
    async with Program(gateway, token) as bot:
        me = await bot.http.get("/v1/me")
        assert me.status_code == 200 and me.json()["principal"] == "bot:ci-bot", me.text
        session_id = f"reviewed-{secrets.token_hex(4)}"
        started = await bot.http.post("/v1/sessions", json={"text": "go", "session_id": session_id})
        assert started.status_code == 202, started.text
        async with GatewayClient(url(gateway)) as alice:
            await alice.login("alice")
            card = await pending_card(alice, session_id)
        [session] = await rows(gateway, Session, id=session_id)
        assert session.started_by == "bot:ci-bot"
        assert (await bot.http.get(f"/v1/sessions/{session_id}")).status_code == 200
        assert (await bot.http.get(f"/v1/requests/{card['id']}")).status_code == 200
        refused = problem(await bot.decide(card["id"]), 403, "insufficient-scope")
        assert "requests:decide" in refused["detail"]
        # Routes no token may use: password login, logout.
        problem(await bot.http.post("/v1/logout"), 403, "insufficient-scope")
    await nothing_decided(gateway, card, sink, "/reviewed")
    # Nothing was sent: the ledger never saw a response, accepted or refused.
    assert await rows(gateway, AuditEntry, session_id=session_id, kind="response.rejected") == []


async def test_a_token_with_requests_decide_approves_only_where_the_tools_approvers_name_it(gateway, sink):
    token = make_token(gateway, BOT, "requests:read,requests:decide")
    async with GatewayClient(url(gateway)) as alice, Program(gateway, token) as bot:
        await alice.login("alice")
        # post_separated: approvers "anyone"; a program is no one's "anyone".
        separated = await pending_card(alice, await start(alice, "separated"))
        refused = problem(await bot.decide(separated["id"]), 403, "not-an-approver")
        assert refused["reason_code"] == "not_an_approver"
        await nothing_decided(gateway, separated, sink, "/separated")
        # post_reviewed names bot:ci-bot: it approves, and the record names it.
        reviewed = await pending_card(alice, await start(alice, "reviewed"))
        answer = await bot.decide(reviewed["id"])
        assert answer.status_code == 200, answer.text
        assert (answer.json()["responder"], answer.json()["decided"]) == ("bot:ci-bot", True)
        await eventually(lambda: _true(sink.counts["/reviewed"] == 1))
    [decision] = await rows(gateway, Decision, request_id=reviewed["id"])
    assert (decision.responder, decision.channel) == ("bot:ci-bot", "gateway")
    [rejected] = await rows(gateway, AuditEntry, session_id=separated["session_id"], kind="response.rejected")
    assert (rejected.actor, rejected.detail["reason_code"]) == ("bot:ci-bot", "not_an_approver")


@gateway_alone
async def test_a_revoked_or_wrong_token_gets_401_and_no_token_appears_in_the_logs(gateway, sink):
    keys = gateway.data_dir / "keys"
    token = make_token(gateway, BOT, "sessions:start,requests:read,requests:decide")
    async with Program(gateway, token) as bot:
        assert (await bot.http.get("/v1/requests")).status_code == 200
        programs.revoke(keys, keys / "gateway" / "users.yaml", BOT)
        problem(await bot.http.get("/v1/requests"), 401, "unauthenticated")
        problem(await bot.http.post("/v1/sessions", json={"text": "go"}), 401, "unauthenticated")
    wrong = programs.TOKEN_PREFIX + secrets.token_urlsafe(32)
    for header in (f"Bearer {wrong}", "Bearer", "Bearer not-a-token", "Basic dXNlcjpwYXNz"):
        async with httpx.AsyncClient(base_url=url(gateway), timeout=30) as http:
            problem(await http.get("/v1/requests", headers={"Authorization": header}), 401, "unauthenticated")
    # A token created again works; the revoked one still does not.
    again = make_token(gateway, BOT, "requests:read")
    async with Program(gateway, again) as bot, Program(gateway, token) as old:
        assert (await bot.http.get("/v1/requests")).status_code == 200
        problem(await old.http.get("/v1/requests"), 401, "unauthenticated")
    logs = "".join(p.read_text(errors="replace") for p in (gateway.data_dir / "logs").glob("*.log"))
    assert "gateway ready" in logs
    for secret in (token, again, wrong):
        assert secret not in logs and secret[len(programs.TOKEN_PREFIX):] not in logs
    stored = (keys / "gateway" / "tokens.yaml").read_text()
    assert again not in stored and programs.lookup_hash(again) in stored


async def _true(value):
    return value


@gateway_alone
async def test_an_expired_token_gets_401_and_sends_nothing(gateway, sink):
    users_file = gateway.data_dir / "keys" / "gateway" / "users.yaml"
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        card = await pending_card(alice, await start(alice, "reviewed"))
    expires_at = time.time() + 10
    token, done = programs.create(users_file.parent.parent, users_file, BOT,
                                  programs.parse_scopes("requests:read,requests:decide"), expires_at)
    assert "expires" in done[0] and "expires" in programs.listing(users_file)[0]
    async with Program(gateway, token) as bot:
        assert (await bot.http.get(f"/v1/requests/{card['id']}")).status_code == 200  # before it expires
        await asyncio.sleep(max(0.0, expires_at - time.time() + 0.5))
        problem(await bot.http.get("/v1/requests"), 401, "unauthenticated")
        problem(await bot.decide(card["id"]), 401, "unauthenticated")
    await nothing_decided(gateway, card, sink, "/reviewed")
    assert await rows(gateway, AuditEntry, session_id=card["session_id"], kind="response.rejected") == []


@gateway_alone
async def test_failed_tokens_from_one_address_are_limited_across_two_replicas_a_right_token_included(deployment):
    gateway = deployment
    gateway.extra_env["SIGNOFF_GATEWAY_TOKEN_FAILURES_PER_ADDRESS"] = "3"
    add_people(gateway)
    gateway.start()
    gateway.start("gateway", "gateway#2")
    replicas = [url(gateway), url(gateway, "gateway#2")]
    token = make_token(gateway, BOT, "requests:read")
    wrong = [programs.TOKEN_PREFIX + secrets.token_urlsafe(32) for _ in range(4)]
    async with httpx.AsyncClient(timeout=30) as http:
        async def ask(replica: int, bearer: str) -> httpx.Response:
            return await http.get(replicas[replica] + "/v1/requests", headers={"Authorization": f"Bearer {bearer}"})

        assert (await ask(0, token)).status_code == 200
        for attempt in range(3):  # three failures, spread over both replicas
            problem(await ask(attempt % 2, wrong[attempt]), 401, "unauthenticated")
        for replica in (0, 1):
            limited = problem(await ask(replica, wrong[3]), 429, "too-many-token-failures")
            assert limited["status"] == 429
            answer = await ask(replica, token)  # the right token too: guessing stops, whatever the guess
            problem(answer, 429, "too-many-token-failures")
            assert int(answer.headers["retry-after"]) >= 1
