"""Who may approve (docs/design.md, "Trust boundaries"): a tool names its approvers,
may forbid the session's starter from approving, and may need several distinct
people; a response token from a card counts once, for its own request. A response
from someone not allowed is answered with a reason and changes nothing."""

from shared.ledger.tables import Approval, ApprovalRequest, Decision, Session, Turn
from shared.messages import RespondToApproval, StartTurn, mint
from tests.harness import next_event, rows


async def start(console, session_id: str, started_by: str | None = None):
    """Start a turn as `started_by`; (the session's event queue, its approval.requested)."""
    events = await console.watch(session_id)
    await console.send(StartTurn(session_id=session_id, text="go", started_by=started_by))
    return events, await next_event(events, "approval.requested")


def answer(console, requested, responder: str, decision: str = "approve", **fields) -> RespondToApproval:
    """A response to the card, signed by the console's channel (the CLI's, registered for the tests' people)."""
    return console.sign(RespondToApproval(session_id=requested.session_id, request_id=requested.request_id,
                                          decision=decision, args_digest=requested.args_digest,
                                          responder=responder, **fields))


async def refused_as(console, events, response: RespondToApproval) -> str:
    await console.send(response)
    rejected = await next_event(events, "message.rejected", "approval.counted", "approval.decided")
    assert rejected.type == "message.rejected", f"{response.responder}'s response was accepted: {rejected}"
    assert rejected.rejected_message_id == response.message_id
    return rejected.reason_code


async def test_the_sessions_starter_may_not_approve_a_tool_that_forbids_it_and_another_person_may(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start()
    session_id = f"separated-{mint('ses')}"
    async with deployment.console() as console:
        events, requested = await start(console, session_id, started_by="sam")
        assert await refused_as(console, events, answer(console, requested, "sam")) == "starter_may_not_approve"
        [request] = await rows(deployment, ApprovalRequest, id=requested.request_id)
        assert request.status == "pending" and sink.counts["/separated"] == 0

        await console.send(answer(console, requested, "ann"))
        decided = await next_event(events, "approval.decided")
        assert (decided.decision, decided.responder) == ("approve", "ann")
        await next_event(events, "turn.completed", timeout=30)
    assert sink.counts["/separated"] == 1
    [session] = await rows(deployment, Session, id=session_id)
    [turn] = await rows(deployment, Turn, session_id=session_id)
    assert (session.started_by, turn.started_by) == ("sam", "sam")


async def test_with_two_approvals_required_the_first_is_counted_and_one_denial_then_denies_and_nothing_runs(
        deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start()
    session_id = f"four-eyes-{mint('ses')}"
    async with deployment.console() as console:
        events, requested = await start(console, session_id, started_by="sam")
        assert requested.approvals_required == 2

        await console.send(answer(console, requested, "alice"))
        counted = await next_event(events, "approval.counted", "approval.decided", "message.rejected")
        assert (counted.type, counted.responder, counted.count, counted.required) == (
            "approval.counted", "alice", 1, 2)
        [session] = await rows(deployment, Session, id=session_id)
        assert session.status == "waiting"
        # The same person again does not count twice.
        assert await refused_as(console, events, answer(console, requested, "alice")) == "already_approved"

        await console.send(answer(console, requested, "bob", decision="deny", reason="not today"))
        decided = await next_event(events, "approval.decided")
        assert (decided.decision, decided.responder) == ("deny", "bob")
        closed = await next_event(events, "tool.closed")
        assert (closed.kind, closed.reason_text) == ("denied", "not today")
        await next_event(events, "turn.completed", timeout=30)
    assert sink.counts["/four-eyes"] == 0
    assert [a.responder for a in await rows(deployment, Approval, request_id=requested.request_id)] == ["alice"]
    [decision] = await rows(deployment, Decision, request_id=requested.request_id)
    assert (decision.decision, decision.responder) == ("deny", "bob")


async def test_with_two_approvals_required_two_distinct_people_run_the_call_once_across_a_ledger_restart(
        deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start()
    session_id = f"four-eyes-{mint('ses')}"
    async with deployment.console() as console:
        events, requested = await start(console, session_id, started_by="sam")
        await console.send(answer(console, requested, "alice"))
        counted = await next_event(events, "approval.counted")
        assert (counted.count, counted.required) == (1, 2)
        # The count is the ledger's rows, not its memory.
        deployment.kill("approval-ledger")
        deployment.start("approval-ledger")
        assert await refused_as(console, events, answer(console, requested, "alice")) == "already_approved"
        assert sink.counts["/four-eyes"] == 0

        second = answer(console, requested, "bob")
        await console.send(second)
        decided = await next_event(events, "approval.decided")
        assert (decided.decision, decided.responder) == ("approve", "bob")
        await next_event(events, "turn.completed", timeout=30)
        # Bob's response once more, under a new message id: it counts once.
        assert await refused_as(console, events, second.model_copy(update={"message_id": mint("msg")})) == "replayed"
    assert sink.counts["/four-eyes"] == 1
    approvals = await rows(deployment, Approval, request_id=requested.request_id)
    assert sorted(a.responder for a in approvals) == ["alice", "bob"]


async def test_a_response_token_counts_once_for_its_own_request_and_is_kept_only_as_a_hash(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start(console, session_id)
        token = requested.response_token
        assert token and len(token) >= 40
        [request] = await rows(deployment, ApprovalRequest, id=requested.request_id)
        assert token not in str(request.card) and token not in request.response_token_hash

        def by_token(value: str) -> RespondToApproval:
            return answer(console, requested, "token:cli", response_token=value)

        assert await refused_as(console, events, by_token(token[:-1] + "x")) == "bad_token"
        await console.send(by_token(token))
        decided = await next_event(events, "approval.decided")
        assert (decided.decision, decided.responder) == ("approve", "token:cli")
        await next_event(events, "turn.completed", timeout=30)
        assert await refused_as(console, events, by_token(token)) == "token_used"
    assert sink.counts["/sink"] == 1


async def test_only_a_tools_approvers_may_approve_it(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start()
    session_id = f"reviewed-{mint('ses')}"
    async with deployment.console() as console:
        events, requested = await start(console, session_id, started_by="sam")
        assert await refused_as(console, events, answer(console, requested, "mallory")) == "not_an_approver"
        # A token names no person, and the tool names none of its channels.
        token = answer(console, requested, "token:cli", response_token=requested.response_token)
        assert await refused_as(console, events, token) == "not_an_approver"
        [request] = await rows(deployment, ApprovalRequest, id=requested.request_id)
        assert (request.status, request.token_used_at) == ("pending", None)
        assert sink.counts["/reviewed"] == 0

        await console.send(answer(console, requested, "bob"))  # a reviewer, by the group
        decided = await next_event(events, "approval.decided")
        assert (decided.decision, decided.responder) == ("approve", "bob")
        await next_event(events, "turn.completed", timeout=30)
    assert sink.counts["/reviewed"] == 1
