"""The Slack channel: every card posted to Slack with Approve and Deny buttons, answered
as the person who clicked (`signoff channel run slack`, extra `slack`; docs/channels.md).

- A card is posted (`chat.postMessage`) to the conversation its tool maps to, or (`approvers`)
  to each mapped approver's direct messages, drawn from `card_face` (shared/on_screen.py)
  in Block Kit, each text in Slack's escaping.
- An interaction is verified by Bolt (`X-Slack-Signature` over the raw body with the
  signing secret, at most 5 minutes old) and acknowledged at once (Slack waits 3 s);
  the clicking (team, user) is mapped to a Signoff principal by the operator's file,
  and the response is signed as that person, never as the bot. The ledger judges it;
  a refusal (unmapped, not an approver, already decided) reaches the person as an
  ephemeral message. A click's response id is derived from the click, so the same
  click delivered again is the ledger's replay, counted once.
- Deny opens a modal that asks for the reason; the reason reaches the model.
- Every decision, count, expiry or cancellation seen on the bus updates the message
  (`chat.update`): the outcome and who decided, the buttons gone.
- On start it binds its events queue, then posts every pending card it has not posted
  (`backlog.py`) and updates the ones closed while it was down. It never posts a card
  twice: before posting it writes that it is posting (`book.py`), posts with the request
  id in the message's metadata, then writes the message's ts; a card left "posting" by
  a crash is looked up in the conversation's history by that metadata before it is
  posted again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.messages import (
    ApprovalCounted,
    ApprovalDecided,
    ApprovalEscalated,
    ApprovalExpired,
    ApprovalRequested,
    Envelope,
    ToolCallClosed,
)
from shared.on_screen import FIELD_CHARS, TEXT_CHARS, CardFace, card_face, visible
from signoff.adapters.backlog import PendingCard
from signoff.adapters.book import CardBook
from signoff.channel import CardEvent, ChannelAdapter, Refused

log = logging.getLogger("signoff.slack")

APPROVE, DENY, INBOX = "signoff_approve", "signoff_deny", "signoff_inbox"
DENY_VIEW = "signoff_deny_reason"
# The message metadata that names a card's request: how a crashed post is found again.
METADATA_EVENT = "signoff_card"
# A tool mapped to this posts its cards to each mapped approver's direct messages.
APPROVERS = "approvers"
# Events the adapter follows: cards, counts and every way a card closes.
BINDINGS = (
    "approval.requested.*",
    "approval.escalated.*",
    "approval.counted.*",
    "approval.decided.*",
    "approval.expired.*",
    "tool.closed.*",
)
# A section's text may hold 3,000 characters; the arguments are cut to fit, with a pointer to the inbox.
SECTION_CHARS = 2900
VERDICT_SECONDS = 15.0


class SlackSettings(BaseSettings):
    """The Slack channel's settings (`SIGNOFF_SLACK_*`); the bot token and signing secret
    come from the Slack app (docs/channels.md) and are never logged."""

    model_config = SettingsConfigDict(env_prefix="SIGNOFF_SLACK_", extra="ignore")

    bot_token: str = ""
    signing_secret: str = ""
    # Who each Slack user is in Signoff, and where each tool's cards go (docs/channels.md).
    users_file: Path = Path("slack.yaml")
    # The adapter's own record of the cards it posted (default: <data dir>/slack/cards.json).
    state_file: Path | None = None
    # Where Slack sends interactions: http://HOST:PORT/slack/events.
    host: str = "0.0.0.0"
    port: int = 3000
    # Slack's Web API (a test's loopback fake replaces it).
    api_url: str = "https://slack.com/api/"
    # The inbox's public address, for the "Edit in inbox" link (the gateway's public URL).
    inbox_url: str = "http://127.0.0.1:8080"
    # How often it catches up again while running: a post Slack refused is retried, and a
    # change it missed (its events queue is private: a broker restart loses what was in it) shown.
    catch_up_seconds: float = 60.0


# --- the operator's mapping ------------------------------------------------------------------


@dataclass(frozen=True)
class SlackMapping:
    """Slack (team, user) → Signoff principal, and tool → conversation (`default` for the rest)."""

    people: dict[tuple[str, str], str]
    conversations: dict[str, str]

    @classmethod
    def load(cls, path: Path) -> SlackMapping:
        data = yaml.safe_load(path.read_text()) or {}
        people = {(str(u["team"]), str(u["user"])): str(u["principal"]) for u in data.get("users") or []}
        return cls(people, {str(k): str(v) for k, v in (data.get("channels") or {}).items()})

    def principal(self, team: str, user: str) -> str | None:
        return self.people.get((team, user))

    def conversation(self, tool: str) -> str | None:
        return self.conversations.get(tool) or self.conversations.get("default")

    @property
    def principals(self) -> list[str]:
        return sorted(set(self.people.values()))


# --- the card in Block Kit -------------------------------------------------------------------


def escaped(shown: str) -> str:
    """Text already made visible (`visible`), in Slack's escaping: `&`, `<` and `>` as
    entities, so no text can become a link, a mention or an `@channel`."""
    return shown.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code(shown: str) -> str:
    """Visible text inside a code span or block: a backtick cannot end it. It is shown as
    its escape (`visible` shows a backslash as two, so the escape is never the text's own)."""
    return escaped(shown).replace("`", "\\u0060")


@dataclass
class CardState:
    """What the message shows beyond the card: progress, escalation, outcome."""

    required: int = 1
    approvers: list[str] = field(default_factory=list)
    expires_at: datetime | None = None
    escalated_to: list[str] | None = None
    # Set once the card is closed ("Approved by alice"): the buttons go.
    outcome: str | None = None


def card_blocks(face: CardFace, state: CardState, inbox_link: str) -> list[dict[str, Any]]:
    """The card as a Slack message: what it is, its target, why it needs a person, its
    expiry, approvals so far, the arguments, then the buttons or, once closed, its outcome."""
    fields = [
        _mrkdwn(f"*Tool*\n`{code(face.tool)}` (effect: {escaped(face.effect)})"),
        _mrkdwn(f"*Target*\n`{code(face.target)}`" if face.target else "*Target*\n(none)"),
        _mrkdwn(f"*Expires*\n{_when(state.expires_at)}"),
        _mrkdwn(f"*Approvals*\n{_progress(state)}"),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": _mrkdwn(f"*Approval needed:* {escaped(face.label)}")},
        {"type": "section", "fields": fields},
    ]
    if face.reason:
        blocks.append({"type": "section", "text": _mrkdwn(f"*Why a person:* {escaped(face.reason)}")})
    if face.filed:
        blocks.append({"type": "section", "text": _mrkdwn(f"*Filed by:* {escaped(face.filed)}")})
    for warning in face.warnings:
        blocks.append({"type": "section", "text": _mrkdwn(f":warning: *WARNING:* {escaped(visible(warning))}")})
    blocks.append({"type": "section", "text": _mrkdwn(_arguments(face.arguments))})
    context = [f"request `{code(face.request)}`", f"digest `{code(face.digest)}`"]
    if face.hidden:
        context.insert(0, f"hidden: {escaped(', '.join(face.hidden))} (withheld from everyone but the executor)")
    if state.escalated_to is not None:
        whom = ", ".join(escaped(visible(n, FIELD_CHARS)) for n in state.escalated_to) or "nobody"
        context.append(f"escalated to {whom}, who may approve it as well")
    blocks.append({"type": "context", "elements": [_mrkdwn(" · ".join(context))]})
    if state.outcome is None:
        blocks.append(
            {
                "type": "actions",
                "block_id": "signoff_decide",
                "elements": [
                    _button("Approve", APPROVE, face, style="primary"),
                    _button("Deny", DENY, face, style="danger"),
                    {
                        "type": "button",
                        "action_id": INBOX,
                        "text": {"type": "plain_text", "text": "Edit in inbox"},
                        "url": inbox_link,
                    },
                ],
            }
        )
    else:
        outcome = escaped(visible(state.outcome, TEXT_CHARS))
        blocks.append({"type": "section", "text": _mrkdwn(f"*{outcome}* · <{inbox_link}|Open in inbox>")})
    return blocks


def summary(face: CardFace, state: CardState) -> str:
    """The message's plain text (notifications, screen readers)."""
    head = f"Approval needed: {face.label} ({face.tool} on {face.target})"
    return escaped(head if state.outcome is None else f"{state.outcome}: {face.label}")


def _mrkdwn(text: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": text}


def _button(text: str, action: str, face: CardFace, style: str) -> dict[str, Any]:
    return {
        "type": "button",
        "action_id": action,
        "text": {"type": "plain_text", "text": text},
        "style": style,
        "value": face.request,
    }


def _with(**news: Any) -> Callable[[dict[str, Any]], None]:
    """A change to a card's entry: these fields set."""
    return lambda entry: entry.update(news)


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _when(at: datetime | None) -> str:
    if at is None:
        return "never"
    stamp = int(at.timestamp())
    shown = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{stamp}^{{date_short_pretty}} {{time}}|{shown}>"


def _progress(state: CardState) -> str:
    names = ", ".join(escaped(visible(n, FIELD_CHARS)) for n in state.approvers)
    count = f"{len(state.approvers)} of {state.required}"
    return f"{count} ({names})" if names else count


def _arguments(lines: list[str]) -> str:
    shown: list[str] = []
    size = len("*Arguments*\n``````") + 60
    for n, line in enumerate(lines):
        text = code(line)
        if size + len(text) + 1 > SECTION_CHARS:
            shown.append(f"… ({len(lines) - n} more lines: see the inbox)")
            break
        shown.append(text)
        size += len(text) + 1
    return "*Arguments*\n```" + "\n".join(shown) + "```"


def deny_modal(request_id: str, label: str, metadata: dict[str, str]) -> dict[str, Any]:
    """The modal Deny opens: the reason, which reaches the model."""
    return {
        "type": "modal",
        "callback_id": DENY_VIEW,
        "private_metadata": json.dumps({**metadata, "request_id": request_id}),
        "title": {"type": "plain_text", "text": "Deny"},
        "submit": {"type": "plain_text", "text": "Deny"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {"type": "section", "text": _mrkdwn(f"Deny *{escaped(label)}*? Say why: the agent reads it.")},
            {
                "type": "input",
                "block_id": "reason",
                "label": {"type": "plain_text", "text": "Reason"},
                "element": {"type": "plain_text_input", "action_id": "reason", "multiline": True, "max_length": 2000},
            },
        ],
    }


def click_response_id(team: str, user: str, request_id: str, decision: str, click: str) -> str:
    """The response id of one click: the same click delivered twice names the same
    response, which the ledger counts once."""
    digest = hashlib.sha256(json.dumps([team, user, request_id, decision, click]).encode()).hexdigest()
    return f"rsp_slack_{digest[:40]}"


# --- the channel -----------------------------------------------------------------------------


Say = Callable[[str], Awaitable[None]]


class SlackChannel:
    """The cards in Slack and the clicks back: `on_event` for the bus, `answer` for a click.
    `client` is slack_sdk's AsyncWebClient (or anything with its methods)."""

    def __init__(
        self,
        adapter: ChannelAdapter,
        client: Any,
        book: CardBook,
        mapping: SlackMapping,
        inbox_url: str,
        approvers_of: Callable[[str, list[str] | None], frozenset[str] | None] = lambda _tool, _escalated: None,
    ) -> None:
        self.adapter = adapter
        # Who may approve a tool's card (None: anyone), with its escalation group once escalated,
        # as the catalogue says: whose direct messages an `approvers` tool's cards go to. The
        # ledger still judges every answer.
        self.approvers_of = approvers_of
        self.client = client
        self.book = book
        self.mapping = mapping
        self.inbox_url = inbox_url.rstrip("/")
        # One card at a time: a card caught up on and the same card from the bus never race.
        self._lock = asyncio.Lock()

    # --- posting and updating ---

    def inbox_link(self, request_id: str) -> str:
        return f"{self.inbox_url}/inbox/requests/{request_id}"

    def _render(self, entry: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        event = CardBook.event_of(entry)
        face = card_face(event.request_id, event.card.model_dump(mode="json"), event.args_digest)
        state = CardState(
            required=entry.get("required", 1),
            approvers=entry.get("approvers", []),
            expires_at=datetime.fromisoformat(entry["expires_at"]) if entry.get("expires_at") else None,
            escalated_to=entry.get("escalated_to"),
            outcome=entry.get("outcome"),
        )
        return card_blocks(face, state, self.inbox_link(event.request_id)), summary(face, state)

    async def show(self, card: CardEvent, approvers: list[str] | None = None, escalated_to: list[str] | None = None):
        """Post the card where it goes, unless posted there; a card announced again (edited,
        escalated) updates its messages, and an escalated one goes to its new approvers too."""
        async with self._lock:
            entry = self.book.get(card.request_id)
            again = entry is not None
            if entry is None:
                entry = {
                    "event": card.model_dump(mode="json"),
                    "required": getattr(card, "approvals_required", 1),
                    "approvers": approvers or [],
                    "expires_at": _iso(getattr(card, "expires_at", None)),
                    "escalated_to": escalated_to
                    if escalated_to is not None
                    else (card.escalated_to if isinstance(card, ApprovalEscalated) else None),
                    "posts": [],
                }
            elif isinstance(card, ApprovalEscalated):
                entry["escalated_to"] = card.escalated_to
            elif escalated_to is not None and escalated_to != entry.get("escalated_to"):
                entry["escalated_to"] = escalated_to  # escalated while the adapter was down
            elif entry["event"]["args_digest"] != card.args_digest:  # edited: new arguments, the count restarts
                entry["event"] = card.model_dump(mode="json")
                entry["approvers"] = approvers or []
            else:
                again = False  # the same card seen again (the bus and the catch-up): nothing changed
            posted_to = {post["to"] for post in entry["posts"]}
            entry["posts"] += [
                {"to": to, "conversation": None, "ts": None}
                for to in self.targets(card, entry.get("escalated_to"))
                if to not in posted_to
            ]
            self.book.put(card.request_id, entry)
            for post in entry["posts"]:
                if post["ts"] is None:
                    await self._post(card.request_id, entry, post)
                elif again:
                    await self._update_post(entry, post)

    def targets(self, card: CardEvent, escalated_to: list[str] | None) -> list[str]:
        """Where the card goes: its tool's conversation, or (`approvers`) each mapped approver's direct messages."""
        where = self.mapping.conversation(card.card.tool)
        if where is None:
            log.warning(
                "no conversation for tool %s in the users file: card %s not posted", card.card.tool, card.request_id
            )
            return []
        if where != APPROVERS:
            return [where]
        allowed = self.approvers_of(card.card.tool, escalated_to)
        return [user for (_, user), who in sorted(self.mapping.people.items()) if allowed is None or who in allowed]

    async def _post(self, request_id: str, entry: dict[str, Any], post: dict[str, Any]) -> None:
        if post["conversation"] is None:
            post["conversation"] = await self._conversation(post["to"])
        elif post.get("since") is not None and (ts := await self._posted_before(post, request_id)) is not None:
            # Posted, then the adapter died before it wrote the ts: that message is the card's.
            post["ts"] = ts
            self.book.put(request_id, entry)
            await self._update_post(entry, post)
            return
        # Written before the post: a crash from here on is reconciled by the message's metadata.
        post["since"] = time.time()
        self.book.put(request_id, entry)
        blocks, text = self._render(entry)
        posted = await self.client.chat_postMessage(
            channel=post["conversation"],
            text=text,
            blocks=blocks,
            metadata={"event_type": METADATA_EVENT, "event_payload": {"request_id": request_id}},
            unfurl_links=False,
            unfurl_media=False,
        )
        post["ts"] = posted["ts"]
        post["conversation"] = posted.get("channel") or post["conversation"]
        self.book.put(request_id, entry)
        log.info("posted card %s to %s", request_id, post["conversation"])

    async def _conversation(self, to: str) -> str:
        """A conversation id as it is; a person's id: the app's direct messages with them."""
        if not to.startswith(("U", "W")):
            return to
        opened = await self.client.conversations_open(users=to)
        return str(opened["channel"]["id"])

    async def _posted_before(self, post: dict[str, Any], request_id: str) -> str | None:
        """The ts of a message the adapter posted for this card before it died, found by its metadata."""
        history = await self.client.conversations_history(
            channel=post["conversation"], oldest=str(post["since"] - 60), include_all_metadata=True, limit=200
        )
        for message in history.get("messages") or []:
            metadata = message.get("metadata") or {}
            if (
                metadata.get("event_type") == METADATA_EVENT
                and (metadata.get("event_payload") or {}).get("request_id") == request_id
            ):
                return str(message["ts"])
        return None

    async def _update(self, entry: dict[str, Any]) -> None:
        for post in entry["posts"]:
            if post["ts"]:
                await self._update_post(entry, post)

    async def _update_post(self, entry: dict[str, Any], post: dict[str, Any]) -> None:
        blocks, text = self._render(entry)
        await self.client.chat_update(channel=post["conversation"], ts=post["ts"], text=text, blocks=blocks)

    async def _changed(self, request_id: str, change: Callable[[dict[str, Any]], None]) -> None:
        async with self._lock:
            entry = self.book.get(request_id)
            if entry is None or entry.get("outcome"):
                return
            change(entry)
            self.book.put(request_id, entry)
            await self._update(entry)

    async def close(self, request_id: str, outcome: str) -> None:
        await self._changed(request_id, lambda entry: entry.update(outcome=outcome))

    async def on_event(self, event: Envelope) -> None:
        """What the bus said, on the card's message."""
        if isinstance(event, ApprovalRequested | ApprovalEscalated):
            await self.show(event)
        elif isinstance(event, ApprovalCounted):
            entry = self.book.get(event.request_id) or {}
            approvers = list(dict.fromkeys([*entry.get("approvers", []), event.responder]))
            await self._changed(event.request_id, _with(approvers=approvers, required=event.required))
        elif isinstance(event, ApprovalDecided):
            said = f"{'Approved' if event.decision == 'approve' else 'Denied'} by {event.responder}"
            await self.close(event.request_id, said + (f": {event.reason}" if event.reason else ""))
        elif isinstance(event, ApprovalExpired):
            await self.close(event.request_id, "Expired: nobody decided in time")
        elif isinstance(event, ToolCallClosed) and (request_id := self.book.by_call(event.call_id)):
            # A decided card is closed already (`close` keeps the first outcome): this is a cancellation.
            await self.close(
                request_id, f"Closed: {event.kind}" + (f" ({event.reason_text})" if event.reason_text else "")
            )

    async def catch_up(self, pending: list[PendingCard], outcome: Callable[[str], Awaitable[str | None]]) -> None:
        """Post every pending card not posted yet; bring the ones posted up to date (approvals,
        escalation, a new digest after an edit); close the ones closed while the adapter was down."""
        still = {card.event.request_id for card in pending}
        for card in pending:
            entry = self.book.get(card.event.request_id)
            if (
                entry is None
                or any(post["ts"] is None for post in entry["posts"])
                or entry["event"]["args_digest"] != card.event.args_digest
                or entry.get("escalated_to") != card.escalated_to
            ):
                await self.show(card.event, card.approvers, card.escalated_to)
            elif entry.get("approvers", []) != card.approvers:
                await self._changed(card.event.request_id, _with(approvers=card.approvers))
        for request_id in self.book.open_ids():
            if request_id not in still and (said := await outcome(request_id)):
                await self.close(request_id, said)

    # --- clicks ---

    async def answer(
        self,
        team: str,
        user: str,
        request_id: str,
        decision: Literal["approve", "deny"],
        click: str,
        say: Say,
        reason: str = "",
    ) -> None:
        """A person's click, sent to the ledger as that person; what the ledger refused is said
        to them alone (`say`: a message only they see, where they clicked)."""
        entry = self.book.get(request_id)
        principal = self.mapping.principal(team, user)
        if principal is None:
            await say(
                "Your Slack account is not mapped to a Signoff person, so you cannot "
                "decide here; an operator adds you to the Slack users file. Nothing was decided.",
            )
            return
        if entry is None:
            await say("Signoff does not know this card. Nothing was decided.")
            return
        if entry.get("outcome"):
            await say(f"This card is closed already ({entry['outcome']}). Nothing changed.")
            return
        try:
            await self.adapter.respond(
                CardBook.event_of(entry),
                decision,
                principal,
                reason=reason,
                response_id=click_response_id(team, user, request_id, decision, click),
                verdict_within=VERDICT_SECONDS,
            )
        except Refused as refused:
            await say(f"Signoff did not take your {decision}: {refused.reason_text}")
        except TimeoutError:
            await say("Signoff has not answered yet; the card changes when it does.")

    def principal_of(self, team: str, user: str) -> str | None:
        return self.mapping.principal(team, user)


# --- the process -----------------------------------------------------------------------------


def bolt_app(channel: SlackChannel, settings: SlackSettings, client: Any) -> Any:
    """Bolt's app: it verifies each request's signature and age, then these handlers ack first."""
    from slack_bolt.async_app import AsyncApp

    app = AsyncApp(
        token=settings.bot_token,
        signing_secret=settings.signing_secret,
        client=client,
    )

    def say_to(conversation: str, user: str) -> Say:
        async def say(text: str) -> None:
            if conversation:
                await client.chat_postEphemeral(channel=conversation, user=user, text=escaped(text))

        return say

    def who(body: dict[str, Any]) -> tuple[str, str]:
        team = (body.get("user") or {}).get("team_id") or (body.get("team") or {}).get("id") or ""
        return str(team), str((body.get("user") or {}).get("id") or "")

    def clicked(body: dict[str, Any]) -> tuple[str, str, str]:
        """The card's request, the click's own time and the conversation it was made in."""
        action = (body.get("actions") or [{}])[0]
        where = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id") or ""
        return str(action.get("value") or ""), str(action.get("action_ts") or ""), str(where)

    @app.action(APPROVE)
    async def approve(ack, body):
        await ack()
        team, user = who(body)
        request_id, click, where = clicked(body)
        await channel.answer(team, user, request_id, "approve", click, say_to(where, user))

    @app.action(DENY)
    async def deny(ack, body):
        await ack()
        team, user = who(body)
        request_id, _, where = clicked(body)
        entry = channel.book.get(request_id)
        if channel.principal_of(team, user) is None or entry is None or entry.get("outcome"):
            await channel.answer(team, user, request_id, "deny", "", say_to(where, user))  # says why, decides nothing
            return
        label = visible(entry["event"]["card"].get("label", ""), FIELD_CHARS)
        modal = deny_modal(request_id, label, {"conversation": where})
        await client.views_open(trigger_id=body["trigger_id"], view=modal)

    @app.view(DENY_VIEW)
    async def deny_reason(ack, body, view):
        await ack()
        team, user = who(body)
        metadata = json.loads(view.get("private_metadata") or "{}")
        reason = ((view.get("state") or {}).get("values") or {}).get("reason", {}).get("reason", {}).get("value") or ""
        click = str(view.get("id") or "")
        say = say_to(str(metadata.get("conversation", "")), user)
        await channel.answer(team, user, str(metadata.get("request_id", "")), "deny", click, say, reason=reason)

    @app.action(INBOX)
    async def link(ack):
        await ack()  # a link button: Slack opens the inbox; nothing to decide here

    return app


async def run(settings: Any, slack: SlackSettings) -> None:
    """The Slack channel's process: the bus, the catch-up, then Slack's interactions over HTTP."""
    try:
        from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler
        from slack_sdk.web.async_client import AsyncWebClient
    except ImportError as missing:
        raise SystemExit(
            f"signoff channel run slack: the Slack adapter needs the `slack` extra ({missing.name} is missing): "
            "pip install 'signoff[slack]'"
        ) from None
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from shared import keyring
    from shared.catalogue import load_catalogue
    from shared.ledger.console_reads import ConsoleLedger
    from signoff.adapters.backlog import outcome, pending_cards

    if not slack.bot_token or not slack.signing_secret:
        raise SystemExit("signoff channel run slack: set SIGNOFF_SLACK_BOT_TOKEN and SIGNOFF_SLACK_SIGNING_SECRET")
    mapping = SlackMapping.load(slack.users_file)
    book = CardBook(slack.state_file or settings.data_dir / "slack" / "cards.json")
    client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
    url, _ = settings.amqp_login("channel.slack")
    key = keyring.channel_private_key(settings.keys_path, "slack")
    async with ChannelAdapter(url, settings.namespace, key, "slack") as adapter, ConsoleLedger(settings) as ledger:
        events = await adapter.events(*BINDINGS)  # bound first: nothing announced from now on is missed
        catalogue = load_catalogue(settings.tools_file)

        def approvers_of(tool: str, escalated_to: list[str] | None) -> frozenset[str] | None:
            spec = catalogue.get(tool)
            if spec is None:
                return frozenset()
            approvers = catalogue.approvers_of(spec)
            if approvers is not None and escalated_to:
                approvers = approvers | catalogue.principals(escalated_to)
            return approvers

        channel = SlackChannel(adapter, client, book, mapping, slack.inbox_url, approvers_of)
        handler = AsyncSlackRequestHandler(bolt_app(channel, slack, client))

        async def interactions(request: Request):
            return await handler.handle(request)

        async def healthz(_request: Request):
            return PlainTextResponse("ok")

        http = Starlette(routes=[Route("/slack/events", interactions, methods=["POST"]), Route("/healthz", healthz)])
        server = uvicorn.Server(uvicorn.Config(http, host=slack.host, port=slack.port, log_level="warning"))
        serving = asyncio.create_task(server.serve())

        async def closed(request_id: str) -> str | None:
            return await outcome(ledger, request_id)

        async def catch_up() -> None:
            await channel.catch_up(await pending_cards(ledger), closed)

        async def catching_up() -> None:
            while True:
                await asyncio.sleep(slack.catch_up_seconds)
                try:
                    await catch_up()
                except Exception:
                    log.exception("catching up failed; trying again in %.0f s", slack.catch_up_seconds)

        await catch_up()
        log.info("slack ready: %d cards posted, listening on %s:%d", len(book.entries), slack.host, slack.port)
        again = asyncio.create_task(catching_up())
        try:
            async for event in events:
                try:
                    await channel.on_event(event)
                except Exception:  # Slack down or refusing: the next start catches up
                    log.exception("could not show %s %s in Slack", event.type, getattr(event, "request_id", ""))
        finally:
            again.cancel()
            server.should_exit = True
            await serving
