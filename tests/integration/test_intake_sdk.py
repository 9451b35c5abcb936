"""The slim SDK (sdk/signoff_sdk) against the real services, on both stores: `call()`
files, waits and runs a `runs: caller` tool once with the arguments a person approved
(edited ones included), returns a `runs: signoff` tool's output, raises Denied with the
person's reason, re-attaches through a gateway restart, and refuses a verdict the
ledger's key did not sign (nothing runs)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from shared.settings import PROJECT_ROOT
from shared.signatures import new_private_key, public_key_text
from signoff_sdk import AsyncClient, BadSignature, Client, Denied
from tests.gateway_client import GatewayClient
from tests.integration.test_gateway import url
from tests.integration.test_intake import ORIGIN, intake, token  # noqa: F401 (the fixture)


async def approve_when_filed(deployment, match: dict, decision: str = "approve", **body) -> None:
    """Alice decides the call whose card shows these arguments, once it is pending."""
    async with GatewayClient(url(deployment)) as alice:
        await alice.login("alice")
        for _ in range(400):
            page = (await alice.get("/v1/requests", params={"status": "pending"})).json()["requests"]
            mine = [c for c in page if match.items() <= (c.get("arguments") or {}).items()]
            if mine:
                answer = await alice.decide(mine[0]["id"], decision, **body)
                assert answer.status_code == 200, answer.text
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"no card showing {match}")


async def test_call_runs_a_caller_tool_once_with_the_edited_arguments_and_returns_its_output(intake):
    ran: list[dict] = []

    def send_refund(customer: str, amount: float) -> dict:
        ran.append({"customer": customer, "amount": amount})
        return {"refunded": amount}

    async with AsyncClient(url(intake), token=token(intake), origin=ORIGIN) as signoff:
        calling = asyncio.create_task(
            signoff.call("send_refund", {"customer": "c-1", "amount": 50}, call_id="sdk-1", thread="t", run=send_refund)
        )
        await approve_when_filed(intake, {"customer": "c-1"}, arguments={"customer": "c-1", "amount": 20})
        assert await calling == {"refunded": 20}
        # The same call id again: the recorded output, nothing run twice.
        again = await signoff.call("send_refund", {"customer": "c-1", "amount": 50}, call_id="sdk-1",
                                   run=send_refund)
        assert again == {"refunded": 20}
    assert ran == [{"customer": "c-1", "amount": 20}]


async def test_a_denial_raises_denied_with_the_persons_reason_and_a_signoff_tool_returns_its_output(
        intake, sink):
    async with AsyncClient(url(intake), token=token(intake), origin=ORIGIN) as signoff:
        calling = asyncio.create_task(
            signoff.call("send_refund", {"customer": "c-2", "amount": 1}, call_id="sdk-2", run=lambda **_: 1)
        )
        await approve_when_filed(intake, {"customer": "c-2"}, "deny", reason="not on a Friday")
        with pytest.raises(Denied) as denied:
            await calling
        assert denied.value.reason == "not on a Friday"
        posting = asyncio.create_task(signoff.call("post_to_sink", {"message": "hi"}, call_id="sdk-3"))
        await approve_when_filed(intake, {"message": "hi"})
        output = await posting
        assert output is not None and sink.counts["/sink"] == 1


async def test_a_verdict_not_signed_by_the_ledgers_key_is_refused_and_nothing_runs(intake):
    ran = []
    wrong_key = public_key_text(new_private_key())
    async with AsyncClient(url(intake), token=token(intake), origin=ORIGIN, ledger_key=wrong_key) as signoff:
        calling = asyncio.create_task(
            signoff.call("send_refund", {"customer": "c-4", "amount": 3}, call_id="sdk-4", run=lambda **a: ran.append(a))
        )
        await approve_when_filed(intake, {"customer": "c-4"})
        with pytest.raises(BadSignature):
            await calling
    assert ran == []


def test_the_sync_client_retries_through_a_gateway_restart_and_reattaches_by_call_id(intake):
    signoff = Client(url(intake), token=token(intake), origin=ORIGIN, deadline=60)
    first = signoff.file("send_refund", {"customer": "c-5", "amount": 5}, call_id="sdk-5")
    intake.kill("gateway")
    port = intake.gateway_ports["gateway"]
    restarted = threading.Timer(2.0, lambda: intake.start("gateway"))
    restarted.start()
    try:
        again = signoff.file("send_refund", {"customer": "c-5", "amount": 5}, call_id="sdk-5")
    finally:
        restarted.join()
    assert again.id == first.id and intake.gateway_ports["gateway"] == port


@pytest.fixture
def example_deployment(deployment):
    """The four services and a gateway with the shipped catalogue (deploy/tools.yaml), whose
    origin `http:example-agent` the example agent files for."""
    from tests.integration.test_gateway import add_people

    deployment.tools_file = PROJECT_ROOT / "deploy" / "tools.yaml"
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    return deployment


async def test_the_example_agent_runs_its_own_tool_and_signoffs_tool_once_each_after_approval(example_deployment):
    secret = token(example_deployment, "example-agent")
    env = {**os.environ, "SIGNOFF_TOKEN": secret, "PYTHONPATH": str(PROJECT_ROOT / "sdk")}
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "examples/own_agent.py", "--url", url(example_deployment), cwd=PROJECT_ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    await approve_when_filed(example_deployment, {"customer": "c-42"}, arguments={"customer": "c-42", "amount": 10})
    await approve_when_filed(example_deployment, {"title": "Refunded order-42"})
    output, _ = await asyncio.wait_for(agent.communicate(), 60)
    said = output.decode()
    assert agent.returncode == 0, said
    assert "refunding 10 to c-42" in said and "refund: {'customer': 'c-42', 'refunded': 10}" in said
    assert "post: " in said
