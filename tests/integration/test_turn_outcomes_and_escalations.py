"""What a person sees of how a turn ended and of an escalation, through the command
line, against running services on both stores:

- `signoff session show` and `signoff audit show` say how the session's last turn
  ended and why: a failure's code and text (a provider's error, the bound it
  reached), who cancelled it and why, or that it completed; the text shown by
  `visible` (an escape in a provider's error is shown, never obeyed);
- `signoff pending` and `signoff session show` say that a request was escalated,
  when and to whom, and `signoff_approval_escalations_total` counts it once."""

import asyncio
import re

import httpx

from shared.ledger.tables import ApprovalRequest, Turn
from shared.messages import StartTurn, mint
from tests.fake_providers import FakeOpenAI, FakeReply
from tests.harness import eventually, free_port, next_event, rows, start_and_wait_for_approval
from tests.integration.test_command_line import signoff_here

KEY = "sk-test-outcomes-0123456789"
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def signoff(deployment, *args: str) -> str:
    """What `signoff …` shows a person (its main, in this process); it must succeed."""
    return signoff_here(deployment, *args)


def line_with(text: str, pattern: str) -> str:
    """The one line of `text` that matches `pattern` (a regular expression, anchored at the line's start)."""
    found = [line for line in text.splitlines() if re.match(pattern, line)]
    assert len(found) == 1, f"{pattern!r} in:\n{text}"
    return found[0]


async def test_a_turn_the_provider_failed_says_its_code_and_the_providers_words_in_session_show_and_audit_show(
    deployment,
):
    """The provider answers HTTP 500 with a message holding an escape sequence: the turn
    fails as provider_failed, the session is idle, and both commands name the code and
    the text (the escape shown as `\\x1b[2J`, never sent to the terminal)."""
    with FakeOpenAI([FakeReply("never seen")], api_key=KEY) as fake:
        fake.fail_next(20, 500, message="upstream exploded \x1b[2J while thinking")
        deployment.extra_env.update(
            SIGNOFF_PROVIDER="openai", SIGNOFF_OPENAI_BASE_URL=fake.base_url,
            SIGNOFF_OPENAI_MODEL="fake-gpt", SIGNOFF_OPENAI_API_KEY=KEY,
        )
        deployment.start()
        session_id = mint("ses")
        async with deployment.console() as console:
            events = await console.watch(session_id)
            await console.send(StartTurn(session_id=session_id, text="hello"))
            failed = await next_event(events, "turn.failed", "turn.completed", timeout=40)
    assert (failed.type, failed.reason_code) == ("turn.failed", "provider_failed")
    assert "HTTP 500" in failed.reason_text and "\x1b[2J" in failed.reason_text
    [turn] = await rows(deployment, Turn, session_id=session_id)
    assert (turn.status, turn.reason_code, turn.reason_text, turn.ended_by) == (
        "failed", "provider_failed", failed.reason_text, None), "the ledger keeps the event's reason"

    shown = await asyncio.to_thread(signoff, deployment, "session", "show", session_id)
    assert shown.startswith(f"session {session_id}: idle\n"), shown
    last = line_with(shown, "  last turn ")
    assert re.fullmatch(rf"  last turn {turn.id}: failed at {WHEN}: provider_failed: .*HTTP 500.*", last), last
    assert "upstream exploded \\x1b[2J while thinking" in last, "the escape is shown, not obeyed"
    assert "\x1b" not in shown and KEY not in shown

    story = await asyncio.to_thread(signoff, deployment, "audit", "show", session_id)
    assert "\x1b" not in story and KEY not in story
    assert story.splitlines()[-1] == last, "audit show ends with the same of the last turn"
    ended = line_with(story, r"  \S+ \S+  +#\d+  turn ")
    as_shown = failed.reason_text.replace("\x1b", "\\x1b")
    assert ended.endswith(f"turn {turn.id} failed (provider_failed): {as_shown}"), ended


async def test_a_bounded_a_cancelled_and_a_completed_turn_each_say_how_they_ended_in_session_show_and_audit_show(
    deployment,
):
    deployment.extra_env.update(SIGNOFF_TURN_MAX_STEPS="3")
    deployment.start()
    bounded, completed = "loop-" + mint("ses")[4:], "read-" + mint("ses")[4:]
    async with deployment.console() as console:
        loop_events = await console.watch(bounded)
        await console.send(StartTurn(session_id=bounded, text="do the impossible"))
        read_events = await console.watch(completed)
        await console.send(StartTurn(session_id=completed, text="what time is it?"))
        limit = await next_event(loop_events, "turn.failed", timeout=60)
        await next_event(read_events, "turn.completed", timeout=30)
    assert limit.reason_code == "step_limit"

    # A step bound: the code and the bound's own words, with the model's last ones.
    shown = await asyncio.to_thread(signoff, deployment, "session", "show", bounded)
    [turn] = await rows(deployment, Turn, session_id=bounded)
    last = line_with(shown, "  last turn ")
    assert re.fullmatch(rf"  last turn {turn.id}: failed at {WHEN}: step_limit: The turn reached its bound of 3 model "
                        r"steps \(3 model steps, 3 provider calls.*", last), last
    story = await asyncio.to_thread(signoff, deployment, "audit", "show", bounded)
    assert story.splitlines()[-1] == last
    ended = line_with(story, r"  \S+ \S+  +#\d+  turn ")
    assert re.search(rf"turn {turn.id} failed \(step_limit\): The turn reached its bound of 3 model steps", ended)

    # Completed: said so, with no reason.
    shown = await asyncio.to_thread(signoff, deployment, "session", "show", completed)
    [turn] = await rows(deployment, Turn, session_id=completed)
    assert re.fullmatch(rf"  last turn {turn.id}: completed at {WHEN}", line_with(shown, "  last turn ")), shown
    story = await asyncio.to_thread(signoff, deployment, "audit", "show", completed)
    assert story.splitlines()[-1] == line_with(shown, "  last turn ")
    assert line_with(story, r"  \S+ \S+  +#\d+  turn ").endswith(f"turn {turn.id} completed")

    # Running while it waits on a person; then cancelled: by whom, and why (a person's words, shown by `visible`).
    started = await asyncio.to_thread(signoff, deployment, "session", "start", "post it", "--wait", "--as", "alice")
    waiting = started.splitlines()[0]
    [turn] = await rows(deployment, Turn, session_id=waiting)
    shown = await asyncio.to_thread(signoff, deployment, "session", "show", waiting)
    assert re.fullmatch(rf"  last turn {turn.id}: running since {WHEN}", line_with(shown, "  last turn ")), shown
    cancelled = await asyncio.to_thread(signoff, deployment, "cancel", waiting, "--as", "alice", "--reason",
                                        "changed my mind \x1b[31m")
    assert f"cancelled turn {turn.id}" in cancelled
    [turn] = await rows(deployment, Turn, session_id=waiting)
    assert (turn.status, turn.ended_by, turn.reason_text, turn.reason_code) == (
        "cancelled", "alice", "changed my mind \x1b[31m", None)
    shown = await asyncio.to_thread(signoff, deployment, "session", "show", waiting)
    assert shown.startswith(f"session {waiting}: cancelled\n"), shown
    last = line_with(shown, "  last turn ")
    assert re.fullmatch(rf"  last turn {turn.id}: cancelled at {WHEN} by alice: changed my mind \\x1b\[31m", last), last
    story = await asyncio.to_thread(signoff, deployment, "audit", "show", waiting)
    assert story.splitlines()[-1] == last and "\x1b" not in story
    assert line_with(story, r"  \S+ \S+  +#\d+  turn ").endswith(
        f"turn {turn.id} cancelled by alice: changed my mind \\x1b[31m")


async def test_an_escalated_request_says_when_and_to_whom_in_pending_and_session_show_and_is_counted_once(
    deployment, sink
):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t", SIGNOFF_EXPIRY_SWEEP_SECONDS="0.2")
    deployment.metrics_ports = {"approval-ledger": free_port()}
    deployment.start()
    session_id = "escalated-" + mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        await next_event(events, "approval.escalated", timeout=10)
        [request] = await rows(deployment, ApprovalRequest, id=requested.request_id)
        assert request.escalated_to == ["lee"]
        when = request.escalated_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        said = f"  │ escalated: {when} to lee, who may approve it as well"

        pending = await asyncio.to_thread(signoff, deployment, "pending", "--session", session_id)
        assert said in pending.splitlines(), pending
        card = pending.splitlines()
        assert card.index(said) == len(card) - 2, "on the card, above its digest"
        shown = await asyncio.to_thread(signoff, deployment, "session", "show", session_id)
        assert said in shown.splitlines(), shown

        port = deployment.metrics_ports["approval-ledger"]
        metrics = await eventually(lambda: _metrics(port, 'signoff_approval_escalations_total{tool="post_escalated"}'))
        assert 'signoff_approval_escalations_total{tool="post_escalated"} 1.0' in metrics

        await console.respond(requested.request_id, "approve", "", "", "lee")
        await next_event(events, "turn.completed", timeout=30)
    shown = await asyncio.to_thread(signoff, deployment, "session", "show", session_id)
    assert f"  request {requested.request_id} (approved) was escalated {when} to lee, who may approve it as well" in (
        shown.splitlines()), shown
    assert "│ escalated:" not in shown, "no card: nothing waits"
    metrics = await _metrics(port, "signoff_approval_escalations_total")
    assert 'signoff_approval_escalations_total{tool="post_escalated"} 1.0' in metrics, "once, however many sweeps"
    assert sink.counts["/escalated"] == 1


async def _metrics(port: int, needle: str) -> str | None:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    return text if needle in text else None
