"""The Slack channel (signoff/adapters/slack.py) as a process, `signoff channel run slack`,
against a loopback fake of Slack's Web API (tests/fake_slack.py) and signed interaction posts:
cards posted from the bus and caught up on after a SIGKILL, each posted once; clicks verified,
mapped to people and judged by the ledger; every outcome on the message."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from services.operations import channels
from services.gateway import users as gateway_users
from shared.ledger.tables import Approval, Decision
from shared.messages import CancelTurn, StartTurn, mint
from shared.settings import PROJECT_ROOT
from tests.fake_slack import FakeSlack, block_action, deny_submission, post, signed
from tests.gateway_client import PASSWORD, GatewayClient
from tests.harness import eventually, free_port, next_event, rows

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TOKEN = "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy"
CONVERSATION = "C0APPROVALS"
PEOPLE = {"UALICE": "alice", "UBOB": "bob", "UMALLORY": "mallory", "UANN": "ann", "ULEE": "lee"}


async def until(check, timeout: float = 20.0):
    """Poll a plain check until it holds."""

    async def checked():
        return check()

    return await eventually(checked, timeout)


class SlackAdapter:
    """`signoff channel run slack` as a child process of the test."""

    def __init__(self, deployment, fake: FakeSlack) -> None:
        self.deployment = deployment
        self.fake = fake
        self.port = free_port()
        self.folder = deployment.data_dir / "slack"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.users = self.folder / "users.yaml"
        self.users.write_text(
            yaml.safe_dump(
                {
                    "users": [{"team": "T0SIGNOFF", "user": user, "principal": who} for user, who in PEOPLE.items()],
                    # Escalating cards go to their approvers' direct messages.
                    "channels": {"default": CONVERSATION, "post_escalated": "approvers"},
                }
            )
        )
        self.log = self.folder / "adapter.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/slack/events"

    def env(self) -> dict[str, str]:
        return {
            **self.deployment.env(),
            "SIGNOFF_SLACK_BOT_TOKEN": TOKEN,
            "SIGNOFF_SLACK_SIGNING_SECRET": SECRET,
            "SIGNOFF_SLACK_USERS_FILE": str(self.users),
            "SIGNOFF_SLACK_PORT": str(self.port),
            "SIGNOFF_SLACK_HOST": "127.0.0.1",
            "SIGNOFF_SLACK_API_URL": self.fake.api_url,
            "SIGNOFF_SLACK_INBOX_URL": "https://signoff.example",
            "SIGNOFF_LOG_FORMAT": "text",
        }

    async def register(self) -> None:
        """`signoff channel add slack`: for the people the users file maps."""
        os.environ.update({"SIGNOFF_SLACK_USERS_FILE": str(self.users)})
        try:
            await asyncio.to_thread(channels.add, self.deployment.settings, "slack", [])
        finally:
            os.environ.pop("SIGNOFF_SLACK_USERS_FILE")

    async def start(self) -> None:
        with open(self.log, "ab") as log:
            log.write(b"--- start\n")
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.operations.cli", "channel", "run", "slack"],
                env=self.env(),
                cwd=PROJECT_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the Slack adapter exited:\n{self.log.read_text()[-3000:]}")
            return "slack ready" in self.log.read_text().split("--- start")[-1]

        await until(ready, timeout=30)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    async def click(self, user: str, action: str, request_id: str, channel: str = CONVERSATION, **extra):
        message = self.fake.messages_of(request_id)[channel]
        body = block_action(user, action, request_id, channel=channel, ts=message["ts"], **extra)
        return body, await post(self.url, body, signed(SECRET, body))

    def message(self, request_id: str) -> dict:
        return self.fake.message_of(request_id)


@pytest.fixture
async def slack(sqlite_deployment, sink):
    sqlite_deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    sqlite_deployment.start()
    fake = FakeSlack()
    await fake.start()
    adapter = SlackAdapter(sqlite_deployment, fake)
    await adapter.register()
    await adapter.start()
    try:
        yield adapter
    finally:
        adapter.kill()
        await fake.stop()


async def card_posted(adapter: SlackAdapter, console, prefix: str = "ses"):
    """A session started; its card's request id once its message is in Slack."""
    session_id = f"{prefix}-{mint('x')}" if prefix != "ses" else mint("ses")
    events = await console.watch(session_id)
    await console.send(StartTurn(session_id=session_id, text="go", started_by="sam"))
    requested = await next_event(events, "approval.requested", timeout=30)

    def posted():
        return any(
            (m.get("metadata") or {}).get("event_payload", {}).get("request_id") == requested.request_id
            for m in adapter.fake.messages.values()
        )

    await until(posted, timeout=20)
    return requested, events


async def test_a_tool_mapped_to_its_approvers_goes_to_their_direct_messages_and_its_escalation_group_too(slack, sink):
    """post_escalated: ann approves; unanswered for a second, the leads (lee) may too."""
    async with slack.deployment.console() as console:
        card, events = await card_posted(slack, console, "escalated")
        assert set(slack.fake.messages_of(card.request_id)) == {"DUANN"}  # ann alone, not the channel
        await next_event(events, "approval.escalated", timeout=30)
        await until(lambda: set(slack.fake.messages_of(card.request_id)) == {"DUANN", "DULEE"}, timeout=20)
        await slack.click("ULEE", "signoff_approve", card.request_id, channel="DULEE")
        decided = await next_event(events, "approval.decided", timeout=30)
        assert decided.responder == "lee"
        await next_event(events, "turn.completed", timeout=30)
    # Both copies say so, neither has buttons; each was posted once.
    await until(lambda: all(not actions_of(m) for m in slack.fake.messages_of(card.request_id).values()), timeout=20)
    assert all("Approved by lee" in text_of(m) for m in slack.fake.messages_of(card.request_id).values())
    assert len(slack.fake.called("chat.postMessage")) == 2
    assert sink.counts["/escalated"] == 1


def actions_of(message: dict) -> list[str]:
    return [e["action_id"] for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]]


def text_of(message: dict) -> str:
    return json.dumps(message["blocks"])


async def test_approving_in_slack_runs_the_tool_once_as_that_person_and_a_replayed_click_counts_once(slack, sink):
    async with slack.deployment.console() as console:
        card, events = await card_posted(slack, console)
        message = slack.message(card.request_id)
        # The card: what runs, why, until when, the buttons and the inbox link.
        assert "Post a message to the sink" in text_of(message) and "*Arguments*" in text_of(message)
        assert actions_of(message) == ["signoff_approve", "signoff_deny", "signoff_inbox"]
        [link] = [e["url"] for b in message["blocks"] if b["type"] == "actions" for e in b["elements"] if "url" in e]
        assert link == f"https://signoff.example/inbox/requests/{card.request_id}"
        body, answer = await slack.click("UALICE", "signoff_approve", card.request_id)
        # Acknowledged before the ledger's verdict: Slack waits 3 s at most.
        assert answer.status_code == 200 and answer.elapsed.total_seconds() < 3
        decided = await next_event(events, "approval.decided", timeout=30)
        assert (decided.decision, decided.responder) == ("approve", "alice")
        await next_event(events, "turn.completed", timeout=30)
        # The same signed click again, inside the window: the ledger's replay, nothing more.
        again = await post(slack.url, body, signed(SECRET, body))
        assert again.status_code == 200
        await until(lambda: slack.fake.ephemerals("UALICE"), timeout=20)
    [decision] = await rows(slack.deployment, Decision, request_id=card.request_id)
    assert (decision.responder, decision.channel) == ("alice", "slack")
    assert sink.counts["/sink"] == 1
    # The message says who decided, and its buttons are gone.
    await until(lambda: not actions_of(slack.message(card.request_id)), timeout=20)
    assert "Approved by alice" in text_of(slack.message(card.request_id))


async def test_deny_in_slack_asks_a_reason_in_a_modal_and_the_reason_reaches_the_model(slack, sink):
    async with slack.deployment.console() as console:
        card, events = await card_posted(slack, console)
        _, answer = await slack.click("UBOB", "signoff_deny", card.request_id)
        assert answer.status_code == 200
        await until(lambda: slack.fake.called("views.open"), timeout=20)
        [opened] = slack.fake.called("views.open")
        view = opened["view"]
        assert view["callback_id"] == "signoff_deny_reason"
        body = deny_submission("UBOB", view["private_metadata"], "not on a Friday")
        assert (await post(slack.url, body, signed(SECRET, body))).status_code == 200
        decided = await next_event(events, "approval.decided", timeout=30)
        assert (decided.decision, decided.responder, decided.reason) == ("deny", "bob", "not on a Friday")
        await next_event(events, "turn.completed", timeout=30)
    assert sink.counts["/sink"] == 0
    await until(lambda: "Denied by bob: not on a Friday" in text_of(slack.message(card.request_id)), timeout=20)
    assert not actions_of(slack.message(card.request_id))


async def test_forged_stale_unmapped_and_non_approver_clicks_decide_nothing_and_two_approvers_count_once_each(
    slack, sink
):
    async with slack.deployment.console() as console:
        reviewed, _ = await card_posted(slack, console, "reviewed")
        message = slack.message(reviewed.request_id)
        body = block_action("UALICE", "signoff_approve", reviewed.request_id, channel=CONVERSATION, ts=message["ts"])
        # A bad signature, and a good one 6 minutes old: refused before anything is read.
        forged = {**signed(SECRET, body), "X-Slack-Signature": "v0=" + "0" * 64}
        assert (await post(slack.url, body, forged)).status_code == 401
        stale = signed(SECRET, body, timestamp=int(__import__("time").time()) - 360)
        assert (await post(slack.url, body, stale)).status_code == 401
        # Someone the users file does not map, and a mapped person who is not a reviewer.
        await slack.click("USTRANGER", "signoff_approve", reviewed.request_id)
        await until(lambda: slack.fake.ephemerals("USTRANGER"), timeout=20)
        assert "not mapped" in slack.fake.ephemerals("USTRANGER")[0]
        await slack.click("UMALLORY", "signoff_approve", reviewed.request_id)
        await until(lambda: slack.fake.ephemerals("UMALLORY"), timeout=30)
        assert "did not take your approve" in slack.fake.ephemerals("UMALLORY")[0]
        assert await rows(slack.deployment, Decision, request_id=reviewed.request_id) == []
        assert await rows(slack.deployment, Approval, request_id=reviewed.request_id) == []
        assert actions_of(slack.message(reviewed.request_id))  # still open

        # Two approvers for a tool that needs two: each counted, on the message, one execution.
        four, events = await card_posted(slack, console, "four-eyes")
        await slack.click("UALICE", "signoff_approve", four.request_id)
        await next_event(events, "approval.counted", timeout=30)
        await until(lambda: "1 of 2 (alice)" in text_of(slack.message(four.request_id)), timeout=20)
        assert actions_of(slack.message(four.request_id))
        await slack.click("UBOB", "signoff_approve", four.request_id)
        decided = await next_event(events, "approval.decided", timeout=30)
        assert decided.responder == "bob"
        await next_event(events, "turn.completed", timeout=30)
    assert sorted(a.responder for a in await rows(slack.deployment, Approval, request_id=four.request_id)) == [
        "alice",
        "bob",
    ]
    assert sink.counts["/four-eyes"] == 1
    await until(lambda: not actions_of(slack.message(four.request_id)), timeout=20)


async def test_a_decision_in_the_inbox_or_a_cancellation_updates_the_slack_message_and_removes_its_buttons(slack, sink):
    deployment = slack.deployment
    keys = deployment.data_dir / "keys"
    await asyncio.to_thread(gateway_users.add, keys, keys / "gateway" / "users.yaml", "alice", PASSWORD, [], False)
    await asyncio.to_thread(deployment.start, "gateway")
    async with deployment.console() as console:
        card, events = await card_posted(slack, console)
        async with GatewayClient(f"http://127.0.0.1:{deployment.gateway_ports['gateway']}") as inbox:
            assert (await inbox.login("alice")).status_code == 200
            assert (await inbox.decide(card.request_id, "approve")).status_code in (200, 202)
        decided = await next_event(events, "approval.decided", timeout=30)
        assert decided.responder == "alice"
        # And a card whose session is cancelled (from the CLI): its message says so.
        cancelled, cancelled_events = await card_posted(slack, console)
        await console.send(CancelTurn(session_id=cancelled.session_id, reason="not today", cancelled_by="alice"))
        await next_event(cancelled_events, "turn.cancelled", timeout=30)
    await until(lambda: not actions_of(slack.message(card.request_id)), timeout=20)
    assert "Approved by alice" in text_of(slack.message(card.request_id))
    await until(lambda: not actions_of(slack.message(cancelled.request_id)), timeout=20)
    assert "Closed: cancelled" in text_of(slack.message(cancelled.request_id))
    assert len(slack.fake.called("chat.postMessage")) == 2


@pytest.mark.crash
async def test_after_a_sigkill_every_pending_card_is_posted_once_even_one_killed_mid_post(slack, sink):
    async with slack.deployment.console() as console:
        # Killed while Slack holds its post: the message exists, the adapter never heard its ts.
        slack.fake.hold_posts = True
        first, _ = await card_posted(slack, console)
        slack.kill()
        slack.fake.hold_posts = False
        requested = []
        for _ in range(5):  # five cards while it is down
            session_id = mint("ses")
            events = await console.watch(session_id)
            await console.send(StartTurn(session_id=session_id, text="go"))
            requested.append((await next_event(events, "approval.requested", timeout=30)).request_id)
    await slack.start()
    await until(lambda: len(slack.fake.called("chat.postMessage")) == 6, timeout=30)
    slack.kill()
    await slack.start()  # and again: nothing posted twice
    await asyncio.sleep(1)
    posted = [p["metadata"]["event_payload"]["request_id"] for p in slack.fake.called("chat.postMessage")]
    assert sorted(posted) == sorted([first.request_id, *requested])
    book = json.loads((Path(slack.deployment.data_dir) / "slack" / "cards.json").read_text())
    assert all(post["ts"] for rid in posted for post in book[rid]["posts"])
