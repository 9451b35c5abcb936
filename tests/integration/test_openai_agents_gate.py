"""`SignoffApprovals` (the OpenAI Agents SDK, `signoff_sdk.openai_agents`) with the real
SDK and a fake `Model`, against the real services: each gated call is filed once by the
model's call id; approving an interruption by hand runs nothing; Signoff's decisions are
applied to the saved `RunState` (an edit runs the edited arguments, a denial reaches the
model with the person's reason); two calls in one turn are two cards decided apart; a
process SIGKILLed while it waits is picked up from its saved state with the same
requests, and each tool runs once."""

from __future__ import annotations

from pathlib import Path

import pytest
from agents import Runner, RunState
from agents.exceptions import UserError
from signoff_sdk.openai_agents import SignoffApprovals

from shared.ledger.tables import ApprovalRequest, FiledCall
from tests.framework_agents import lines, openai_agent
from tests.harness import rows
from tests.integration.test_intake import decided_by_alice
from tests.integration.test_langchain_gate import (
    calls,
    example_decided_by_alice,
    killed_while_waiting_then_restarted,
    signoff,  # noqa: F401 (the fixture)
)

ORIGIN = "openai-agents:agent"
PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("store", ["sqlite"])
async def test_a_hand_approval_runs_nothing_an_edit_runs_the_edited_arguments_and_a_denial_reaches_the_model(
    signoff, tmp_path, monkeypatch
):
    monkeypatch.setenv(
        "FAKE_TOOL_CALLS",
        calls(
            ("send_refund", {"customer": "c-1", "amount": 50}, "call_a"),
            ("send_refund", {"customer": "c-2", "amount": 70}, "call_b"),
        ),
    )
    runs, seen = tmp_path / "runs", tmp_path / "seen"
    approvals = SignoffApprovals(thread="run-mem")
    agent = openai_agent(str(runs), str(seen), approvals)
    result = await Runner.run(agent, "Refund both")
    assert sorted(i.call_id for i in result.interruptions) == ["call_a", "call_b"]
    saved = result.to_state().to_json()

    # Approving by hand, without Signoff: the SDK calls the body, which refuses; nothing runs.
    forged = await RunState.from_json(agent, saved)
    for item in forged.get_interruptions():
        forged.approve(item)
    with pytest.raises(UserError, match="Signoff has no decision"):
        await Runner.run(agent, forged)
    assert not runs.exists()

    requests = {f.caller_call_id: f.request_id for f in await rows(signoff, FiledCall)}
    assert len(requests) == 2 and len(await rows(signoff, ApprovalRequest)) == 2
    await decided_by_alice(signoff, requests["call_a"], arguments={"customer": "c-1", "amount": 20})
    await decided_by_alice(signoff, requests["call_b"], "deny", reason="not on a Friday")
    final = await approvals.resume(agent, saved, timeout=60)

    assert lines(runs) == [{"tool": "send_refund", "customer": "c-1", "amount": 20}]
    outputs = [i for i in lines(seen)[-1] if i.get("type") == "function_call_output"]
    assert any("not on a Friday" in str(o["output"]) for o in outputs)
    assert any("refunded 20" in str(o["output"]) for o in outputs)
    assert "refunded 20" in final.final_output
    filed = await rows(signoff, FiledCall)
    assert sorted((f.caller_call_id, f.thread, f.origin) for f in filed) == [
        ("call_a", "run-mem", ORIGIN),
        ("call_b", "run-mem", ORIGIN),
    ]

    # The example, as a newcomer runs it (two settings in the environment).
    printed = await example_decided_by_alice(
        signoff,
        "openai_agents_refund.py",
        "--state",
        "run-42.json",
        cwd=tmp_path,
        arguments={"customer": "c-42", "amount": 5},
    )
    assert "refunding 5.0 to c-42" in printed and printed.rstrip().endswith("refunded 5.0 to c-42")


@pytest.mark.parametrize("store", ["sqlite"])
async def test_a_run_sigkilled_while_it_waits_resumes_from_its_saved_state_with_the_same_requests_and_runs_once(
    signoff, tmp_path, sink
):
    runs, seen, state = tmp_path / "runs", tmp_path / "seen", tmp_path / "state.json"
    printed = await killed_while_waiting_then_restarted(signoff, "openai-agents", [str(state), str(runs), str(seen)])
    assert "refunded 12.5 to c-42" in printed
    assert lines(runs) == [{"tool": "send_refund", "customer": "c-42", "amount": 12.5}]
    assert sink.counts["/sink"] == 1


@pytest.mark.parametrize("store", ["sqlite"])
async def test_a_persons_answer_in_the_tools_place_reaches_the_model_as_the_tools_output_and_the_body_never_runs(
    signoff, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_TOOL_CALLS", calls(("send_refund", {"customer": "c-1", "amount": 50}, "call_r")))
    runs, seen = tmp_path / "runs", tmp_path / "seen"
    approvals = SignoffApprovals(thread="run-respond")
    agent = openai_agent(str(runs), str(seen), approvals)
    result = await Runner.run(agent, "Refund c-1")
    [request] = await rows(signoff, ApprovalRequest)
    answer = "Refunded by phone already; tell the customer it is done."
    await decided_by_alice(signoff, request.id, "respond", message=answer)
    final = await approvals.resume(agent, result.to_state().to_json(), timeout=60)

    assert not runs.exists()  # the body never ran
    [output] = [i for i in lines(seen)[-1] if i.get("type") == "function_call_output"]
    assert output["output"] == answer
    assert final.final_output == answer
