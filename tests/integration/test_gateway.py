"""The HTTP gateway (services/gateway), a real process beside the real services, on
both stores: people log in and decide through it, and the ledger judges each
response as it judges any channel's; the gateway only reads what the ledger
committed and holds no state of its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest

from services.gateway import users
from shared.ledger.tables import ApprovalRequest, AuditEntry, Decision, InboxRow
from shared.messages import mint
from shared.settings import Settings
from tests.gateway_client import PASSWORD, PEOPLE, GatewayClient
from tests.harness import eventually, next_event, rows

# What the gateway alone checks, before anything reaches the ledger (a login, a token, a header):
# one store is enough, and SQLite is the cheaper one to set up.
gateway_alone = pytest.mark.parametrize("store", ["sqlite"])


def add_people(deployment) -> None:
    # A loaded test machine may take the ledger longer than the default 5 s to decide;
    # the tests expect the verdict itself (the 202 path has a test of its own).
    deployment.extra_env.setdefault("SIGNOFF_GATEWAY_DECISION_WAIT_SECONDS", "30")
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


async def test_a_person_who_may_not_approve_a_card_may_not_deny_it_and_a_hidden_card_answers_as_a_missing_one(
        gateway, sink):
    async with GatewayClient(url(gateway)) as sam, GatewayClient(url(gateway)) as mallory:
        await sam.login("sam")
        await mallory.login("mallory")
        session_id = await start(sam, "reviewed")  # alice, bob and carol approve it
        card = await pending_card(sam, session_id)
        # Mallory may neither see nor approve it: every door answers as for a card that does not exist.
        for request_id in (card["id"], "apr_nosuchrequest"):
            path = f"/v1/requests/{request_id}"
            answers = [
                await mallory.get(path),
                await mallory.decide(request_id),
                await mallory.decide(request_id, "deny", key="stop-it", reason="no"),
                await mallory.get(f"{path}/decision/msg_{'0' * 60}"),
            ]
            documents = [problem(answer, 404, "not-found") for answer in answers]
            if request_id == card["id"]:
                hidden = documents
        assert hidden == documents
        assert await rows(gateway, AuditEntry, session_id=session_id, kind="response.rejected") == []
        # Sam started the session and sees the card, but is not among its approvers: the ledger
        # refuses his denial as it refuses his approval.
        refused = problem(await sam.decide(card["id"], "deny", reason="changed my mind"), 403, "not-an-approver")
        assert refused["reason_code"] == "not_an_approver" and "sam" in refused["detail"]
        problem(await sam.decide(card["id"]), 403, "not-an-approver")
        await nothing_decided(gateway, card, sink, "/reviewed")
        rejected = await rows(gateway, AuditEntry, session_id=session_id, kind="response.rejected")
        assert sorted((r.actor, r.detail["decision"], r.detail["channel"]) for r in rejected) == [
            ("sam", "approve", "gateway"), ("sam", "deny", "gateway")]


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
    deployment.extra_env.update(SINK_URL=sink.url, SIGNOFF_GATEWAY_SESSION_SECONDS="25")
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
        assert time.monotonic() - logged_in < 24, "too slow to check the other cases before the session ended"
        await asyncio.sleep(max(0.0, logged_in + 25.5 - time.monotonic()))
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
        # The same key again sent nothing again.
        assert len(await rows(gateway, InboxRow, session_id=card["session_id"], message_type="approval.respond")) == 1
        # The same key for another decision is refused.
        problem(await alice.decide(card["id"], "deny", key="approve-once"), 422, "idempotency-key-reused")
        [decision] = await rows(gateway, Decision, request_id=card["id"])
        assert decision.response_id == once.json()["response_id"]

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


async def test_an_idempotency_key_reused_with_another_body_or_on_another_request_is_refused_422_and_decides_nothing(
        gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        card = await pending_card(alice, await start(alice, "reviewed"))
        other = await pending_card(alice, await start(alice, "reviewed"))
        first = await alice.decide(card["id"], key="once", message="first")
        assert first.status_code == 200, first.text
        reused = [
            await alice.decide(card["id"], key="once", message="second"),
            await alice.decide(card["id"], key="once", message="first", args_digest="0" * 64),
            await alice.decide(card["id"], key="once", message="first", arguments={"message": "edited"}),
            await alice.decide(other["id"], key="once", message="first"),
        ]
        for answer in reused:
            problem(answer, 422, "idempotency-key-reused")
        # The same body again is the first answer, not a refusal.
        again = await alice.decide(card["id"], key="once", message="first")
        assert again.status_code == 200 and again.json() == first.json()
        await eventually(lambda: _async(sink.counts["/reviewed"] == 1))
    [still] = await rows(gateway, ApprovalRequest, id=other["id"])
    assert still.status == "pending" and await rows(gateway, Decision, request_id=other["id"]) == []
    [decision] = await rows(gateway, Decision, request_id=card["id"])
    assert (decision.response_id, decision.message) == (first.json()["response_id"], "first")


@gateway_alone
async def test_every_answer_says_nosniff_cards_are_not_kept_and_odd_csrf_tokens_or_event_ids_are_problems(gateway):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        card = await pending_card(alice, await start(alice, "reviewed"))
        answers = {
            "card": await alice.get(f"/v1/requests/{card['id']}"),
            "cards": await alice.get("/v1/requests"),
            "problem": await alice.get("/v1/requests/apr_nosuchrequest"),
            "openapi": await alice.get("/v1/openapi.json"),
            "script": await alice.get("/inbox/static/inbox.js"),
            "unmatched": await alice.get("/v1/nowhere"),
        }
        for name, answer in answers.items():
            assert answer.headers.get("x-content-type-options") == "nosniff", (name, answer.headers)
        for name in ("card", "cards", "problem"):
            assert answers[name].headers.get("cache-control") == "no-store", name
        path = f"/v1/requests/{card['id']}/decision"
        # A CSRF token with letters outside ASCII, as a header and as the inbox form's field.
        for token in ("é".encode(), "\u202e".encode(), b"\xff\xfe"):
            problem(await alice.post(path, {"decision": "deny", "reason": "x"},
                                     headers={"Idempotency-Key": "odd", "X-CSRF-Token": token}), 403, "csrf")
        page = await alice.http.post(f"/inbox/requests/{card['id']}/decision",
                                     data={"csrf_token": "tökén", "decision": "deny", "reason": "x",
                                           "idempotency_key": "odd-form"},
                                     headers=alice.headers(csrf=False, Origin=url(gateway)))
        assert page.status_code == 403 and page.headers.get("x-content-type-options") == "nosniff", page.text
        for event_id in (b"10000000000000000000000000.1", b"10^25.1", b"+7.1", b"1_0.1", b"07.1", b"7.-1",
                         "\u0663.1".encode(), b"9223372036854775808.1"):
            # Streamed: an id taken for good would open a stream that never ends.
            headers = {**alice.headers(csrf=False), "Last-Event-ID": event_id}
            async with alice.http.stream("GET", "/v1/events", headers=headers) as answer:
                assert answer.status_code == 400, (event_id, answer.status_code)
                await answer.aread()
                problem(answer, 400, "bad-event-id")


async def chunks(*sizes: int):
    for size in sizes:
        yield b" " * size


async def test_malformed_requests_each_get_a_problem_document_and_change_nothing(gateway, sink):
    async with GatewayClient(url(gateway)) as alice, GatewayClient(url(gateway)) as sam, \
            GatewayClient(url(gateway)) as nobody:
        await alice.login("alice")
        await sam.login("sam")
        card = await pending_card(alice, await start(alice, "reviewed"))
        others = await start(alice, "read")  # a session sam did not start
        decision = f"/v1/requests/{card['id']}/decision"
        key = {"Idempotency-Key": "malformed"}
        raw = {**alice.headers(), **key, "Content-Type": "application/json"}
        cases = [
            (await alice.http.post(decision, content=b"{not json", headers=raw), 400, "malformed-json"),
            (await alice.http.post(decision, content=b"", headers=raw), 422, "invalid"),
            (await alice.http.post(decision, content=b"[1, 2]", headers=raw), 422, "invalid"),
            (await alice.http.post(decision, content=b'"approve"', headers=raw), 422, "invalid"),
            (await alice.http.post(decision, content=b"\xff\xfe", headers=raw), 400, "malformed-json"),
            (await alice.http.post(decision, content=b"x" * 70_000, headers=raw), 413, "too-large"),
            # Chunked, no length declared: counted as it arrives.
            (await alice.http.post(decision, content=chunks(40_000, 40_000), headers=raw), 413, "too-large"),
            (await alice.post(decision, {"decision": "maybe"}, headers=key), 422, "invalid"),
            (await alice.post(decision, {"decision": 1}, headers=key), 422, "invalid"),
            (await alice.post(decision, {"decision": "approve", "responder": "bob"}, headers=key),
             422, "unknown-field"),
            (await alice.post(decision, {"decision": "approve", "reason": ["x"]}, headers=key), 422, "invalid"),
            (await alice.post(decision, {"decision": "deny", "reason": "a\x00b"}, headers=key), 422, "invalid"),
            (await alice.post(decision, {"decision": "approve", "reason": "r" * 5000}, headers=key), 422, "invalid"),
            (await alice.post(decision, {"decision": "approve"}), 422, "invalid"),  # no Idempotency-Key
            (await alice.post(decision, {"decision": "approve"}, headers={"Idempotency-Key": "a b"}), 422, "invalid"),
            (await alice.post("/v1/requests/apr_nosuchrequest/decision", {"decision": "approve"}, headers=key),
             404, "not-found"),
            (await alice.post("/v1/requests/bad%20id/decision", {"decision": "approve"}, headers=key),
             422, "invalid"),
            (await alice.get("/v1/requests/apr_nosuchrequest"), 404, "not-found"),
            (await alice.get("/v1/requests", params={"status": "maybe"}), 422, "invalid"),
            (await alice.get("/v1/requests", params={"limit": "lots"}), 422, "invalid"),
            (await sam.get(f"/v1/requests/{card['id']}"), 404, "not-found"),  # someone else's request
            (await sam.get(f"/v1/sessions/{card['session_id']}"), 404, "not-found"),
            (await sam.post(f"/v1/sessions/{others}/cancel", {}), 404, "not-found"),
            (await sam.post("/v1/sessions", {"text": "go", "session_id": card["session_id"]}), 404, "not-found"),
            (await alice.post("/v1/sessions", {"text": ""}), 422, "invalid"),
            (await alice.post("/v1/sessions", {"text": "go", "started_by": "bob"}), 422, "unknown-field"),
            (await alice.post("/v1/sessions", {"text": "go", "session_id": "../x"}), 422, "invalid"),
            (await nobody.get("/v1/requests"), 401, "unauthenticated"),
            (await nobody.decide(card["id"]), 401, "unauthenticated"),
            (await alice.http.put(decision, headers=raw), 405, "method-not-allowed"),
            (await alice.get("/v1/events", headers={"Last-Event-ID": "not-an-id"}), 400, "bad-event-id"),
            (await alice.http.post("/v1/login", content=b"{", headers={"Content-Type": "application/json"}),
             400, "malformed-json"),
        ]
        assert len(cases) >= 20
        for answer, status, kind in cases:
            problem(answer, status, kind)
        await nothing_decided(gateway, card, sink, "/reviewed")
        assert await rows(gateway, AuditEntry, session_id=card["session_id"], kind="response.rejected") == []
        # The session that sam could not cancel is still alice's and was not cancelled.
        assert await rows(gateway, AuditEntry, session_id=others, kind="message.rejected") == []


async def read_events(client: GatewayClient, seen: list, last_event_id: str | None = None,
                      until=lambda seen: False, params: dict | None = None) -> None:
    """Read the event stream into `seen` as (id, type, data) until `until(seen)` or the stream breaks."""
    headers = client.headers(csrf=False)
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    fields: dict[str, str] = {}
    async with client.http.stream("GET", "/v1/events", headers=headers, params=params, timeout=None) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        async for line in answer.aiter_lines():
            if line.startswith(":"):
                continue  # a heartbeat
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if "id" in fields:
                seen.append((fields["id"], fields.get("event"), json.loads(fields.get("data", "null"))))
                if until(seen):
                    return
            fields = {}


async def committed_event_ids(deployment) -> list[str]:
    """Every event in the ledger's record, in the order the stream serves them: (txid, id)."""
    from shared.ledger.tables import OutboxRow
    from shared.ledger.event_stream import STREAMED

    found = [r for r in await rows(deployment, OutboxRow) if r.message_type in STREAMED]
    if deployment.store == "postgres":
        return [f"{r.txid or 0}.{r.id}" for r in sorted(found, key=lambda r: (r.txid or 0, r.id))]
    return [f"0.{r.id}" for r in sorted(found, key=lambda r: r.id)]


async def test_the_event_stream_resumes_on_another_replica_after_a_sigkill_with_no_gap_and_no_repeat(gateway, sink):
    gateway.start("gateway#2")
    first, second = url(gateway), url(gateway, "gateway#2")
    async with GatewayClient(first) as ann, GatewayClient(first) as alice, GatewayClient(second) as ann_again:
        await ann.login("ann")  # an operator: every event
        await alice.login("alice")
        ann_again.cookie, ann_again.csrf = ann.cookie, ann.csrf  # the same login, the other replica
        seen: list = []
        reading = asyncio.create_task(read_events(ann, seen))
        sessions = [await start(alice, "reviewed") for _ in range(4)]
        cards = [await pending_card(alice, s) for s in sessions]
        await alice.decide(cards[0]["id"])
        await eventually(lambda: _async(sum(1 for _, kind, _ in seen if kind == "approval.requested") == 4))
        # Mid-stream: the first decision's events are still being committed as the replica dies.
        gateway.kill("gateway")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reading, 10)
        assert reading.done()
        before = len(seen)
        async with GatewayClient(second) as bob:
            await bob.login("bob")
            for card in cards[1:]:
                assert (await bob.decide(card["id"])).status_code == 200
        completed = lambda seen: sum(1 for _, kind, _ in seen if kind == "turn.completed") == 4  # noqa: E731
        await asyncio.wait_for(read_events(ann_again, seen, seen[-1][0], until=completed), 60)
    ids = [event_id for event_id, _, _ in seen]
    assert len(ids) == len(set(ids)), "an event was repeated"
    assert before > 0 and len(ids) > before
    record = await committed_event_ids(gateway)
    assert ids == record[: len(ids)], "the stream skipped or reordered events the ledger committed"
    assert all("response_token" not in data for _, _, data in seen)
    assert sink.counts["/reviewed"] == 4


def _key(event_id: str) -> tuple[int, int]:
    txid, row = event_id.split(".")
    return int(txid), int(row)


async def test_a_stream_from_now_replays_nothing_and_its_first_id_resumes_with_no_gap(gateway, sink):
    async with GatewayClient(url(gateway)) as ann, GatewayClient(url(gateway)) as alice:
        await ann.login("ann")  # an operator: every event
        await alice.login("alice")
        card = await pending_card(alice, await start(alice, "reviewed"))
        history = await committed_event_ids(gateway)
        assert history, "events before the stream opens"
        # From the beginning (no Last-Event-ID, no since): the history first.
        seen: list = []
        await asyncio.wait_for(read_events(ann, seen, until=lambda seen: len(seen) >= 1), 30)
        assert seen[0][0] == history[0]
        # From now: the first block is an id alone, after every event committed so far.
        seen = []
        await asyncio.wait_for(read_events(ann, seen, until=lambda seen: len(seen) >= 1, params={"since": "now"}), 30)
        [(now_id, kind, data)] = seen
        assert (kind, data) == (None, None)
        assert all(_key(event_id) <= _key(now_id) for event_id in history)
        # Closed before any event; what is committed meanwhile comes after that id, none missed.
        decided = await alice.decide(card["id"])
        assert decided.status_code == 200, decided.text
        ended = lambda seen: any(k == "turn.completed" and d["session_id"] == card["session_id"]  # noqa: E731
                                 for _, k, d in seen)
        seen = []
        await asyncio.wait_for(read_events(ann, seen, now_id, until=ended), 60)
    record = await committed_event_ids(gateway)
    assert [event_id for event_id, _, _ in seen] == [i for i in record if _key(i) > _key(now_id)][: len(seen)]
    assert [event_id for event_id, _, _ in seen][0] not in history


@gateway_alone
async def test_login_attempts_are_limited_per_user_across_two_replicas(gateway):
    gateway.start("gateway#2")
    replicas = [url(gateway), url(gateway, "gateway#2")]
    async with GatewayClient(replicas[0]) as one, GatewayClient(replicas[1]) as two:
        answers = [await (one, two)[n % 2].login("alice", "wrong password") for n in range(5)]
        assert [a.status_code for a in answers] == [401] * 5
        for client in (one, two):
            limited = problem(await client.login("alice"), 429, "too-many-logins")  # even the right password
            assert int((await client.login("alice", "x")).headers["Retry-After"]) > 0
            assert limited["status"] == 429
        # Another person is not locked out by alice's attempts.
        assert (await two.login("bob")).status_code == 200


async def test_the_gateway_key_speaks_only_for_the_gateways_users(gateway, sink):
    """A stolen gateway key and broker password still cannot approve as someone who is not
    one of its users: its channel entry lists exactly them, and the ledger refuses the rest."""
    from services.operations.console import Console
    from shared.messages import RespondToApproval

    async with GatewayClient(url(gateway)) as sam:
        await sam.login("sam")
        card = await pending_card(sam, await start(sam, "reviewed"))
    settings = gateway.settings.model_copy(update={"channel": "gateway"})
    async with Console(settings) as thief:
        assert thief.user.endswith(".channel.gateway")
        events = await thief.watch(card["session_id"])
        response = thief.sign(RespondToApproval(session_id=card["session_id"], request_id=card["id"],
                                                decision="approve", args_digest=card["args_digest"],
                                                responder="carol"))  # an approver, but no user of the gateway
        await thief.send(response)
        rejected = await next_event(events, "message.rejected", "approval.decided")
    assert (rejected.type, rejected.reason_code) == ("message.rejected", "wrong_principal")
    await nothing_decided(gateway, card, sink, "/reviewed")


async def test_a_person_sees_the_requests_they_may_approve_and_the_sessions_they_started_and_operators_all(gateway):
    async with GatewayClient(url(gateway)) as mallory, GatewayClient(url(gateway)) as alice, \
            GatewayClient(url(gateway)) as sam, GatewayClient(url(gateway)) as ann:
        for client, name in ((mallory, "mallory"), (alice, "alice"), (sam, "sam"), (ann, "ann")):
            await client.login(name)
        reviewed = await pending_card(mallory, await start(mallory, "reviewed"))  # alice, bob, carol approve
        ids = lambda answer: [c["id"] for c in answer.json()["requests"]]  # noqa: E731
        assert ids(await alice.get("/v1/requests", params={"status": "pending"})) == [reviewed["id"]]
        assert (await alice.get(f"/v1/requests/{reviewed['id']}")).status_code == 200
        assert ids(await sam.get("/v1/requests", params={"status": "pending"})) == []
        assert (await sam.get(f"/v1/requests/{reviewed['id']}")).status_code == 404
        assert ids(await ann.get("/v1/requests", params={"tool": "post_reviewed"})) == [reviewed["id"]]
        # The session: its starter and operators only.
        assert (await mallory.get(f"/v1/sessions/{reviewed['session_id']}")).status_code == 200
        assert (await ann.get(f"/v1/sessions/{reviewed['session_id']}")).status_code == 200
        assert (await alice.get(f"/v1/sessions/{reviewed['session_id']}")).status_code == 404
        # Sam's stream carries none of the session's events; alice's its cards only.
        sams: list = []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(read_events(sam, sams), 1.5)
        assert sams == []
        alices: list = []
        await asyncio.wait_for(read_events(alice, alices, until=lambda seen: len(seen) >= 1), 10)
        assert [(kind, data["request_id"]) for _, kind, data in alices] == [("approval.requested", reviewed["id"])]


async def test_the_decision_names_who_logged_in_whatever_the_request_says(gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        card = await pending_card(alice, await start(alice, "reviewed"))
        answer = await alice.post(f"/v1/requests/{card['id']}/decision", {"decision": "approve"},
                                  headers={"Idempotency-Key": "as-bob", "X-Signoff-As": "bob"})
        assert answer.json()["responder"] == "alice"
    [decision] = await rows(gateway, Decision, request_id=card["id"])
    assert decision.responder == "alice"


async def test_on_postgresql_an_event_committed_late_with_a_smaller_id_is_neither_skipped_nor_served_early(
        pg_deployment):
    """Outbox ids are taken when a row is written, not when it commits: a row with a smaller
    id can commit after a larger one. The stream serves neither before every transaction
    below it has ended, so the late one is not skipped (a stream that served `id > last`
    would have moved past it for good)."""
    from datetime import UTC, datetime

    from sqlalchemy import insert
    from sqlalchemy.ext.asyncio import create_async_engine

    from shared.ledger.tables import OutboxRow
    from tests.harness import POSTGRES_URL

    deployment = pg_deployment
    add_people(deployment)
    # The rows below are written without a NOTIFY: the watcher reads them at its idle
    # poll, which must come round several times in the two seconds the test waits.
    deployment.extra_env["SIGNOFF_GATEWAY_IDLE_POLL_SECONDS"] = "0.1"
    deployment.start("approval-ledger")
    deployment.start("gateway")
    admin = create_async_engine(Settings(database_url=POSTGRES_URL).ledger_url,
                                connect_args={"server_settings": {"search_path": deployment.namespace}})

    def row(name: str) -> dict:
        body = {"type": "turn.completed", "message_id": f"msg_{name}", "session_id": "ses_late", "turn_id": "trn_x",
                "text": name, "schema_version": 1, "occurred_at": datetime.now(UTC).isoformat()}
        return {"message_id": f"msg_{name}", "session_id": "ses_late", "message_type": "turn.completed",
                "exchange": "x", "routing_key": "x", "body": json.dumps(body), "created_at": datetime.now(UTC),
                "sent_at": datetime.now(UTC)}  # sent: the publisher leaves them alone

    try:
        async with GatewayClient(url(deployment)) as ann:
            await ann.login("ann")
            seen: list = []
            reading = asyncio.create_task(read_events(ann, seen, until=lambda seen: len(seen) >= 2))
            async with admin.connect() as early, admin.connect() as late:
                await early.begin()
                await early.execute(insert(OutboxRow), [row("first-id-last-commit")])
                async with late.begin():
                    await late.execute(insert(OutboxRow), [row("second-id-first-commit")])
                await asyncio.sleep(2.0)
                assert seen == [], "an event was served while a transaction below it was still open"
                await early.commit()
            await asyncio.wait_for(reading, 20)
    finally:
        await admin.dispose()
    assert [data["text"] for _, _, data in seen] == ["first-id-last-commit", "second-id-first-commit"]
    assert [event_id for event_id, _, _ in seen] == (await committed_event_ids(deployment))[:2]


async def test_the_gateway_reads_the_ledger_through_a_connection_that_cannot_write_it(deployment):
    """PostgreSQL: its own role, granted SELECT alone (and read-only transactions); SQLite:
    the file opened read-only. It reads what the ledger committed and changes none of it."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from shared.ledger.gateway_reads import read_only_engine
    from services.gateway.settings import GatewaySettings

    deployment.start("approval-ledger")
    engine = read_only_engine(GatewaySettings(**deployment.settings.model_dump()))
    try:
        async with engine.connect() as conn:
            assert await conn.scalar(text("SELECT count(*) FROM approval_requests")) == 0
        for statement in ("DELETE FROM outbox", "UPDATE sessions SET status = 'idle'",
                          "INSERT INTO inbox (message_id, message_type, session_id, received_at) "
                          "VALUES ('m', 't', 's', CURRENT_TIMESTAMP)"):
            with pytest.raises(DBAPIError):
                async with engine.begin() as conn:
                    await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def test_the_starter_cancels_their_session_through_the_gateway_and_probes_answer(gateway, sink):
    async with GatewayClient(url(gateway)) as alice:
        await alice.login("alice")
        card = await pending_card(alice, await start(alice, "reviewed"))
        answer = await alice.post(f"/v1/sessions/{card['session_id']}/cancel", {"reason": "changed my mind"})
        assert answer.status_code == 202, answer.text

        async def cancelled():
            return (await alice.get(f"/v1/requests/{card['id']}")).json()["status"] == "cancelled"

        await eventually(cancelled)
        problem(await alice.decide(card["id"]), 409, "already-decided")
        for path in ("/healthz", "/readyz"):
            assert (await alice.http.get(path)).status_code == 200
        metrics = (await alice.http.get("/metrics")).text
        assert "signoff_gateway_logins_total" in metrics and "signoff_gateway_requests_total" in metrics
    audit = await rows(gateway, AuditEntry, session_id=card["session_id"])
    [ended] = [a for a in audit if a.kind == "turn.ended"]
    assert "alice" in json.dumps(ended.detail), ended.detail
    assert sink.counts["/reviewed"] == 0


async def test_a_decision_the_ledger_has_not_judged_in_time_is_answered_202_with_a_link_to_its_verdict(
        deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SIGNOFF_GATEWAY_DECISION_WAIT_SECONDS="0")
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    async with GatewayClient(url(deployment)) as alice, GatewayClient(url(deployment)) as bob:
        await alice.login("alice")
        await bob.login("bob")
        card = await pending_card(alice, await start(alice, "reviewed"))
        answer = await alice.decide(card["id"], key="later")
        assert answer.status_code == 202, answer.text
        poll = answer.json()["links"]["poll"]

        async def verdict():
            polled = await alice.get(poll)
            return polled.json() if polled.status_code == 200 else None

        decided = await eventually(verdict)
        assert (decided["responder"], decided["decided"]) == ("alice", True)
        # Bob may not read alice's verdict.
        problem(await bob.get(poll), 404, "not-found")
        # The same key again answers the same verdict at once.
        again = await alice.decide(card["id"], key="later")
        assert again.status_code == 200 and again.json() == decided
    assert len(await rows(deployment, Decision, request_id=card["id"])) == 1
