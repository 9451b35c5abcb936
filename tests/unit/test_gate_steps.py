"""The steps every framework adapter takes for one gated call (sdk/signoff_sdk/gate.py),
driven by hand without I/O: it pauses for as long as the call waits on a person,
whatever the framework is resumed with; an approved `runs: caller` call is claimed, run
with the approved arguments and reported; an edit the agent does not allow runs nothing;
a gateway answering for another call is refused."""

from __future__ import annotations

from typing import Any

import pytest

from signoff_sdk import BadSignature
from signoff_sdk.gate import Check, Claim, Fetch, File, Pause, Ran, Report, Run, Settled, settle
from signoff_sdk.models import ClaimShown, Closed, FiledShown, Verdict

CALL = File("send_refund", {"customer": "c-1", "amount": 50}, "tc-1", "thread-1", None)


def filed(status: str, closure: Closed | None = None, caller_call_id: str = "tc-1") -> FiledShown:
    return FiledShown(
        id="call_1", status=status, tool="send_refund", origin="langgraph:a", caller_call_id=caller_call_id,
        thread="thread-1", runs="caller", request_id="apr_1", args_digest=None, expires_at=None, card=None,
        closure=closure, claim=None, verdict="sealed", links={},
    )  # fmt: skip


def verdict(
    decision: str = "approve", arguments: dict | None = None, reason: str = "", edited_by=None, message: str = ""
) -> Verdict:
    return Verdict(
        kind="signoff.verdict", call_id="call_1", program="bot:a", caller_call_id="tc-1", tool="send_refund",
        decision=decision, arguments=arguments or CALL.arguments, args_fingerprint="x", reason=reason,
        edited_by=edited_by, decided_at="now", message=message,
    )  # fmt: skip


def test_the_call_pauses_again_for_every_resume_while_it_waits_on_a_person():
    steps = settle(CALL)
    assert next(steps) == CALL
    for _ in range(3):  # three resumes nobody decided in Signoff
        assert isinstance(steps.send(filed("pending")), Pause)
        assert isinstance(steps.send("anything the framework was resumed with"), Fetch)
    assert isinstance(steps.send(filed("closed", Closed(kind="denied"))), Check)
    with pytest.raises(StopIteration) as done:
        steps.send(verdict("deny", reason="not today"))
    assert (done.value.value.decision, done.value.value.reason, done.value.value.ran) == ("deny", "not today", False)


def test_an_approved_caller_call_is_claimed_run_with_the_edited_arguments_and_reported():
    edited = {"customer": "c-1", "amount": 20}
    steps = settle(CALL, {"approve", "edit", "deny"})
    next(steps)
    assert isinstance(steps.send(filed("approved")), Check)
    assert isinstance(steps.send(verdict(arguments=edited, edited_by="alice")), Claim)
    claim = ClaimShown(call_id="call_1", claim_token="t" * 32, tool="send_refund", arguments=edited,
                       lease_expires_at=None, holder=None, verdict="sealed")  # fmt: skip
    assert steps.send(claim) == Run(edited)
    report: Any = steps.send(Ran(result="ok", output="ok"))
    assert isinstance(report, Report) and report.claim == claim
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    assert (done.value.value.decision, done.value.value.arguments, done.value.value.ran) == ("edit", edited, True)


def test_an_edit_the_agent_does_not_allow_is_not_claimed_and_nothing_runs():
    steps = settle(CALL, {"approve", "deny"})
    next(steps)
    steps.send(filed("approved"))
    with pytest.raises(StopIteration) as done:
        steps.send(verdict(arguments={"customer": "c-1", "amount": 20}, edited_by="alice"))
    assert done.value.value.refused and not done.value.value.ran


def test_an_answer_in_the_tools_place_settles_with_the_signed_message_and_nothing_is_claimed_or_run():
    steps = settle(CALL, {"approve", "respond"})
    next(steps)
    assert isinstance(steps.send(filed("closed", Closed(kind="answered", reason_text="redacted?"))), Check)
    with pytest.raises(StopIteration) as done:
        steps.send(verdict("respond", message="done by hand"))
    settled = done.value.value
    assert (settled.decision, settled.message, settled.ran, settled.closure) == ("respond", "done by hand", False, "answered")


def test_a_gateway_answering_for_another_call_or_a_verdict_for_another_call_is_refused():
    steps = settle(CALL)
    next(steps)
    with pytest.raises(BadSignature):
        steps.send(filed("pending", caller_call_id="tc-other"))
    steps = settle(CALL)
    next(steps)
    steps.send(filed("approved"))
    with pytest.raises(BadSignature):
        steps.send(verdict().model_copy(update={"caller_call_id": "tc-other"}))


def answer_of(settled: Settled, allowed: list[str]):
    from langchain.agents.middleware import ToolCallRequest

    from signoff_sdk.langchain import SignoffToolGate

    middleware = SignoffToolGate(interrupt_on={"send_refund": {"allowed_decisions": allowed}}, url="http://unused")
    request = ToolCallRequest(
        tool_call={"name": "send_refund", "args": CALL.arguments, "id": "tc-1"}, tool=None, state={}, runtime=None
    )  # type: ignore[arg-type]
    return middleware._answer(request, middleware.interrupt_on["send_refund"], settled)


def test_a_denial_is_a_rejection_and_an_answer_is_the_tools_result_or_a_rejection_where_respond_is_not_allowed():
    denied = Settled(filed("closed", Closed(kind="denied")), "deny", reason="not on a Friday", closure="denied")
    rejected = answer_of(denied, ["approve", "reject"])
    assert rejected.status == "error" and rejected.content.endswith("with reason: not on a Friday")
    # A denial is never passed off as the tool's answer, even where only respond is allowed.
    assert answer_of(denied, ["approve", "respond"]).status == "error"
    answer = Settled(filed("closed", Closed(kind="answered")), "respond", message="done by hand", closure="answered")
    answered = answer_of(answer, ["approve", "respond"])
    assert (answered.status, answered.content) == ("success", "done by hand")
    refused = answer_of(answer, ["approve", "reject"])
    assert refused.status == "error" and refused.content.endswith("with reason: done by hand")
    expired = Settled(filed("closed", Closed(kind="expired")), "expired", closure="expired")
    assert answer_of(expired, ["approve"]).status == "error" and "expired" in answer_of(expired, ["approve"]).content
    ran_by_signoff = Settled(filed("closed", Closed(kind="output")), "approve", output={"ok": 1}, closure="output")
    assert answer_of(ran_by_signoff, ["approve"]).content == '{"ok": 1}'
