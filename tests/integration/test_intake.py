"""The intake against the real services, on both stores: a program (an API token) files
calls through a real gateway, a person decides them, Signoff's executor runs a `runs:
signoff` call once, a `runs: caller` call is claimed and reported once; the same call
filed again (at once, and across SIGKILLs of the gateway and the ledger) is one request,
one card, one run; a caller SIGKILLed between claim and report closes as outcome unknown;
bad input is answered with problem documents and nothing stored."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
import yaml

from services.gateway import programs
from shared.ledger.tables import ApprovalRequest, AuditEntry, FiledCall, OutboxRow, Session
from shared.signatures import load_public_key, unseal
from tests.gateway_client import GatewayClient
from tests.harness import eventually, rows
from tests.integration.test_gateway import add_people, problem, url

ORIGIN = "http:agent"
PROGRAM = "agent"
OTHER = "other-agent"


def intake_tools(deployment) -> Path:
    """The tests' tools, with a `runs: caller` tool and the intake's origins."""
    catalogue = yaml.safe_load(deployment.tools_file.read_text())
    catalogue["tools"].append(
        {
            "name": "send_refund",
            "label": "Refund a customer",
            "runs": "caller",
            "approval": "always",
            "effect": "outward",
            "approvers": ["alice"],
            "editable": True,
            "parameters": {
                "type": "object",
                "required": ["customer", "amount"],
                "properties": {"customer": {"type": "string"}, "amount": {"type": "number"}},
            },
        }
    )
    catalogue["origins"] = {
        ORIGIN: {"programs": [f"bot:{PROGRAM}", f"bot:{OTHER}"], "tools": ["send_refund", "post_to_sink"]},
        "mcp:desktop": {"programs": [f"bot:{PROGRAM}"], "unknown_tools": {"approvers": ["alice"]}},
        "http:elsewhere": {"programs": [f"bot:{OTHER}"], "tools": ["send_refund"]},
    }
    path = deployment.data_dir.parent / "tools-with-origins.yaml"
    path.write_text(yaml.safe_dump(catalogue))
    return path


@pytest.fixture
def intake(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.tools_file = intake_tools(deployment)
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    return deployment


def token(deployment, name: str = PROGRAM, scopes: str = "calls:file") -> str:
    keys = deployment.data_dir / "keys"
    made, _ = programs.create(keys, keys / "gateway" / "users.yaml", name, programs.parse_scopes(scopes))
    return made


def program(deployment, name: str = PROGRAM) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url(deployment), timeout=60,
                             headers={"Authorization": f"Bearer {token(deployment, name)}"})


def refund(call_id: str, **arguments) -> dict:
    return {"tool": "send_refund", "origin": ORIGIN, "call_id": call_id, "thread": "thread-1",
            "summary": "Refund order 42", "arguments": arguments or {"customer": "c-42", "amount": 12.5}}


async def decided_by_alice(deployment, request_id: str, decision: str = "approve", **body) -> dict:
    async with GatewayClient(url(deployment)) as alice:
        await alice.login("alice")
        answer = await alice.decide(request_id, decision, **body)
        assert answer.status_code == 200, answer.text
        return answer.json()


async def test_the_same_call_filed_five_times_at_once_and_after_sigkills_is_one_request_one_card_one_run(
        intake, sink):
    body = {"tool": "post_to_sink", "origin": ORIGIN, "call_id": "toolu_01", "arguments": {"message": "hi"}}
    async with program(intake) as bot:
        answers = await asyncio.gather(*(bot.post("/v1/calls", json=body) for _ in range(5)))
        assert {a.status_code for a in answers} <= {200, 201}, [a.text for a in answers]
        [call_id] = {a.json()["id"] for a in answers}
        first = answers[0].json()
        assert first["status"] == "pending" and first["args_digest"].startswith("hmac-sha256:")
        assert first["card"]["filed"]["caller_call_id"] == "toolu_01" and first["expires_at"]
        intake.kill("gateway")
        intake.start("gateway")
    async with program(intake) as bot:
        again = await bot.post("/v1/calls", json=body)
        assert (again.status_code, again.json()["id"]) == (200, call_id)
        # A second gateway that waits on the ledger 2 s at most: filings sent while the
        # ledger is down are answered 202 (nothing committed yet), and filed again after its
        # restart they are one call.
        intake.extra_env["SIGNOFF_GATEWAY_DECISION_WAIT_SECONDS"] = "2"
        intake.start("gateway#2")
        intake.kill("approval-ledger")
        again = await bot.post("/v1/calls", json=body)
        assert (again.status_code, again.json()["id"]) == (200, call_id)
        later = {"tool": "post_to_sink", "origin": ORIGIN, "call_id": "toolu_02", "arguments": {"message": "later"}}
        async with httpx.AsyncClient(base_url=url(intake, "gateway#2"), timeout=60, headers=bot.headers) as second:
            held = await asyncio.gather(*(second.post("/v1/calls", json=later) for _ in range(3)))
            assert [a.status_code for a in held] == [202, 202, 202], [a.text for a in held]
            intake.start("approval-ledger")
            filed_later = await second.post("/v1/calls", json=later)
            while filed_later.status_code == 202:
                filed_later = await second.post("/v1/calls", json=later)
            assert filed_later.status_code in (200, 201), filed_later.text
        later_session = filed_later.json()["card"]["session_id"]
        assert len(await rows(intake, ApprovalRequest, session_id=later_session)) == 1
        other = await bot.post("/v1/calls", json={**body, "arguments": {"message": "other"}})
        assert problem(other, 409, "call-id-reused")["reason_code"] == "call_id_reused"
        await decided_by_alice(intake, first["request_id"])
        done = (await bot.get(f"/v1/calls/{call_id}", params={"wait": 30})).json()
        while done["status"] != "closed":
            done = (await bot.get(f"/v1/calls/{call_id}", params={"wait": 30})).json()
        assert done["closure"]["kind"] == "output"
        assert unseal(await ledger_key(bot), done["verdict"])["decision"] == "approve"
    assert sink.counts["/sink"] == 1
    session_id = first["card"]["session_id"]
    assert len(await rows(intake, ApprovalRequest, session_id=session_id)) == 1
    cards = [r for r in await rows(intake, OutboxRow, session_id=session_id) if r.message_type == "approval.requested"]
    assert len(cards) == 1
    [filed] = await rows(intake, FiledCall, id=call_id)
    assert (filed.origin, filed.program, filed.caller_call_id) == (ORIGIN, "bot:agent", "toolu_01")


async def ledger_key(client: httpx.AsyncClient):
    keys = (await client.get("/v1/keys")).json()["keys"]
    return load_public_key(keys[0]["public_key"])


async def test_a_caller_claims_once_gets_the_edited_arguments_and_reports_once(intake):
    async with program(intake) as bot, program(intake, OTHER) as other:
        filed = (await bot.post("/v1/calls", json=refund("call-a"))).json()
        call = filed["id"]
        problem(await bot.post(f"/v1/calls/{call}/claim", json={}), 409, "not-approved")
        await decided_by_alice(intake, filed["request_id"], arguments={"customer": "c-42", "amount": 10})
        approved = (await bot.get(f"/v1/calls/{call}", params={"wait": 30})).json()
        assert approved["status"] == "approved" and approved["card"]["filed"]["caller_call_id"] == "call-a"
        mine = secrets.token_urlsafe(32)
        claim = await bot.post(f"/v1/calls/{call}/claim", json={"claim_token": mine, "holder": "worker-1"})
        assert claim.status_code == 200, claim.text
        assert claim.json()["arguments"] == {"customer": "c-42", "amount": 10}
        verdict = unseal(await ledger_key(bot), claim.json()["verdict"])
        assert verdict["arguments"] == {"customer": "c-42", "amount": 10} and verdict["edited_by"] == "alice"
        # The same token again: the same claim (a retry after a lost answer re-attaches).
        assert (await bot.post(f"/v1/calls/{call}/claim", json={"claim_token": mine})).status_code == 200
        held = problem(await bot.post(f"/v1/calls/{call}/claim", json={"holder": "worker-2"}), 409, "claim-held")
        assert "worker-1" in held["detail"]
        problem(await other.post(f"/v1/calls/{call}/claim", json={}), 404, "not-found")
        forged = {"claim_token": secrets.token_urlsafe(32), "outcome": "output", "output": 1}
        problem(await bot.post(f"/v1/calls/{call}/result", json=forged), 409, "wrong-claim-token")
        result = {"claim_token": mine, "outcome": "output", "output": {"refunded": 10}}
        closed = await bot.post(f"/v1/calls/{call}/result", json=result)
        assert closed.status_code == 200, closed.text
        assert closed.json()["closure"] == {"kind": "output", "reason_code": None, "reason_text": None,
                                            "output": {"refunded": 10}}
        # The same report again is the same answer; another one with the same token is refused.
        assert (await bot.post(f"/v1/calls/{call}/result", json=result)).json()["closure"]["output"] == {"refunded": 10}
        replayed = result | {"output": {"refunded": 1000}}
        problem(await bot.post(f"/v1/calls/{call}/result", json=replayed), 409, "already-reported")
        # A result without a claim.
        unclaimed = (await bot.post("/v1/calls", json=refund("call-b"))).json()
        await decided_by_alice(intake, unclaimed["request_id"])
        problem(await bot.post(f"/v1/calls/{unclaimed['id']}/result", json=result), 409, "not-claimed")
        # A denial: the person's reason, signed.
        denied = (await bot.post("/v1/calls", json=refund("call-c"))).json()
        await decided_by_alice(intake, denied["request_id"], "deny", reason="not on a Friday")
        shown = (await bot.get(f"/v1/calls/{denied['id']}", params={"wait": 30})).json()
        assert (shown["closure"]["kind"], shown["closure"]["reason_text"]) == ("denied", "not on a Friday")
        assert unseal(await ledger_key(bot), shown["verdict"])["reason"] == "not on a Friday"


CALLER = textwrap.dedent(
    """
    import sys, time, httpx
    base, token, call, ran = sys.argv[1:5]
    http = httpx.Client(base_url=base, headers={"Authorization": "Bearer " + token}, timeout=30)
    answer = http.post(f"/v1/calls/{call}/claim", json={"lease_seconds": 5, "holder": "doomed"})
    assert answer.status_code == 200, answer.text
    open(ran, "a").write("ran\\n")  # the tool's body
    print("claimed", flush=True)
    time.sleep(600)  # killed here, before it reports
    """
)


async def test_a_caller_killed_between_claim_and_report_closes_as_outcome_unknown_and_a_person_is_asked(
        intake, tmp_path):
    secret = token(intake)
    async with httpx.AsyncClient(base_url=url(intake), timeout=60,
                                 headers={"Authorization": f"Bearer {secret}"}) as bot:
        filed = (await bot.post("/v1/calls", json=refund("doomed-1"))).json()
        await decided_by_alice(intake, filed["request_id"])
        ran = tmp_path / "ran"
        caller = subprocess.Popen([sys.executable, "-c", CALLER, url(intake), secret, filed["id"], str(ran)],
                                  stdout=subprocess.PIPE, text=True)
        assert caller.stdout is not None and caller.stdout.readline().strip() == "claimed"
        caller.kill()
        caller.wait(10)

        async def closed():
            shown = (await bot.get(f"/v1/calls/{filed['id']}", params={"wait": 20})).json()
            return shown if shown["status"] == "closed" else None

        shown = await eventually(closed, timeout=40)
        assert (shown["closure"]["kind"], shown["closure"]["reason_code"]) == ("outcome_unknown", "claim_lapsed")
        assert "doomed" in shown["closure"]["reason_text"]
        problem(await bot.post(f"/v1/calls/{filed['id']}/claim", json={}), 409, "call-closed")
    assert ran.read_text() == "ran\n"
    session_id = filed["card"]["session_id"]
    alerts = [json.loads(r.body) for r in await rows(intake, OutboxRow, session_id=session_id)
              if r.message_type == "operator.alerted"]
    assert [a["reason_code"] for a in alerts] == ["claim_lapsed"]


async def test_an_unknown_tool_of_an_origin_with_a_default_asks_and_the_card_says_the_caller_declared_it(intake):
    async with program(intake) as bot:
        body = {"tool": "delete_file", "origin": "mcp:desktop", "call_id": "mcp-1", "arguments": {"path": "/tmp/x"}}
        filed = await bot.post("/v1/calls", json=body)
        assert filed.status_code == 201, filed.text
        card = filed.json()["card"]
        assert card["tool"] == "mcp:desktop/delete_file" and card["filed"]["declared_by_caller"] is True
        assert "declared by the caller" in card["label"] and filed.json()["runs"] == "caller"


async def test_bad_input_is_answered_with_a_problem_document_and_nothing_is_stored(intake):
    async with program(intake) as bot:
        cases = [
            (refund("u1") | {"tool": "no_such_tool"}, 422, "unknown-tool"),
            (refund("u2", customer=42, amount="lots"), 422, "invalid-arguments"),
            ({k: v for k, v in refund("u3").items() if k != "call_id"}, 422, "invalid"),
            (refund("u4" * 5000), 422, "invalid"),
            (refund("u5") | {"summary": "Refund\u202e24 redro"}, 422, "invalid"),
            (refund("u6") | {"summary": "line\nbreak"}, 422, "invalid"),
            (refund("u7") | {"origin": "http:elsewhere"}, 403, "origin-not-allowed"),
            (refund("u8") | {"tool": "count", "arguments": {}}, 403, "tool-not-declared-for-origin"),
            (refund("u9") | {"origin": "http:nowhere"}, 403, "unknown-origin"),
        ]
        for body, status, kind in cases:
            problem(await bot.post("/v1/calls", json=body), status, kind)
        huge = refund("u10", customer="x" * 10_000_000, amount=1)
        problem(await bot.post("/v1/calls", json=huge), 413, "too-large")
        assert (await bot.post("/v1/calls", content=b"{not json", headers={"content-type": "application/json"})
                ).status_code == 400
    assert await rows(intake, FiledCall) == []
    assert [s for s in await rows(intake, Session)] == []
    assert [e for e in await rows(intake, AuditEntry) if e.kind in ("call.filed", "message.rejected")] == []


async def test_a_program_follows_its_own_calls_events_on_the_event_stream(intake):
    secret = token(intake, scopes="calls:file,requests:read")
    async with httpx.AsyncClient(base_url=url(intake), timeout=60,
                                 headers={"Authorization": f"Bearer {secret}"}) as bot:
        filed = (await bot.post("/v1/calls", json=refund("events-1"))).json()
        await decided_by_alice(intake, filed["request_id"])
        seen: list[tuple[str, dict]] = []
        async with bot.stream("GET", "/v1/events", timeout=None) as answer:
            assert answer.status_code == 200
            event = ""
            async for line in answer.aiter_lines():
                if line.startswith("event:"):
                    event = line.partition(":")[2].strip()
                elif line.startswith("data:"):
                    data = json.loads(line.partition(":")[2])
                    if data.get("session_id") == filed["card"]["session_id"]:
                        seen.append((event, data))
                    if event == "approval.decided" and seen:
                        break
    assert [e for e, _ in seen] == ["approval.requested", "approval.decided"]
    assert all(data["call_id"] == filed["id"] for _, data in seen)


async def test_a_program_on_the_bus_files_a_call_once_as_its_channel_and_may_not_file_as_another(deployment, sink):
    """The intake's AMQP door: a registered channel (its own broker user) files for the
    program it is registered for; the same call id again is the same one request; filing
    in another program's name, or outside the call's own session, is rejected with a
    reason, and nothing of it is stored."""
    from shared import keyring
    from shared.messages import FileCall, filed_session_id, mint
    from signoff.channel import ChannelAdapter

    deployment.extra_env["SINK_URL"] = sink.url
    deployment.tools_file = intake_tools(deployment)
    keys = deployment.data_dir / "keys"
    keyring.create(keys, {"agents": [f"bot:{PROGRAM}"]})
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")

    def filing(program: str, call_id: str, session_id: str | None = None) -> FileCall:
        return FileCall(
            message_id=mint("msg"), session_id=session_id or filed_session_id(program, call_id), program=program,
            origin=ORIGIN, tool="post_to_sink", arguments={"message": "from the bus"}, caller_call_id=call_id,
        )

    url_, _ = deployment.settings.amqp_login("channel.agents")
    async with ChannelAdapter(url_, deployment.namespace, keys / "channels" / "agents.key", "agents") as agent:
        rejections = await agent.events("message.rejected.*")
        for _ in range(3):
            await agent.publish(filing(f"bot:{PROGRAM}", "bus-1"))
        for refused, reason in ((filing(f"bot:{OTHER}", "bus-2"), "wrong_principal"),
                                (filing(f"bot:{PROGRAM}", "bus-3", session_id=mint("ses")), "wrong_session")):
            await agent.publish(refused)
            rejected = await asyncio.wait_for(anext(rejections), 30)
            assert (rejected.reason_code, rejected.rejected_message_id) == (reason, refused.message_id)

    async def filed_by_the_program():
        return await rows(deployment, FiledCall, program=f"bot:{PROGRAM}")

    [filed] = await eventually(filed_by_the_program)
    assert (filed.origin, filed.caller_call_id) == (ORIGIN, "bus-1")
    assert await rows(deployment, FiledCall, program=f"bot:{OTHER}") == []
    [request] = await rows(deployment, ApprovalRequest, session_id=filed.session_id)
    await decided_by_alice(deployment, request.id)

    async def ran():
        return sink.counts["/sink"] == 1

    await eventually(ran)
    assert len(await rows(deployment, ApprovalRequest, session_id=filed.session_id)) == 1
