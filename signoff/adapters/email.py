"""The email channel: each card mailed to each of its tool's approvers, with two links
(`signoff channel run email`, extra `email`; docs/channels.md).

- One message per approver (the people its users file maps, who may approve the tool),
  with the card as `card_face` (shared/on_screen.py) draws it, sent over SMTP with
  aiosmtplib: STARTTLS when the server offers it, a login when one is configured.
- Each link is signed (HMAC-SHA256 with a key of the adapter's own), names the request,
  the recipient and the decision, expires with the request, and is used once.
- Opening a link only shows a confirmation page (mail scanners open links); its POST
  decides, as the recipient. A tool that needs separation of duties or several approvers
  asks the recipient's password on that page (the gateway's users file): a forwarded
  mail is not enough there.
- The POST's response id is derived from the link, so the same link posted twice is the
  ledger's replay, counted once, even if two tabs race past the adapter's own check.
- On start it mails every pending card to every approver it has not mailed yet. A mail
  is marked sent after the SMTP server took it: a crash in between may send that one
  mail again (SMTP has no way to ask), never skip it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import html
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs

import yaml
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.catalogue import ToolCatalogue
from shared.keyring import replace_private
from shared.messages import ApprovalEscalated, ApprovalRequested, Envelope
from shared.on_screen import CardFace, card_face, card_headline, card_rows
from signoff.adapters.backlog import PendingCard
from signoff.adapters.book import CardBook
from signoff.channel import CardEvent, ChannelAdapter, Refused

log = logging.getLogger("signoff.email")

# A request with no deadline: its links still expire.
LINK_DAYS_WITHOUT_DEADLINE = 7
VERDICT_SECONDS = 15.0
# The page's form: a reason and a password, url-encoded.
FORM_BYTES = 16_384
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


class EmailSettings(BaseSettings):
    """The email channel's settings (`SIGNOFF_EMAIL_*`); the SMTP password is never logged."""

    model_config = SettingsConfigDict(env_prefix="SIGNOFF_EMAIL_", extra="ignore")

    smtp_host: str = "localhost"
    smtp_port: int = 587
    smtp_username: str = ""
    smtp_password: str = ""
    # `auto`: STARTTLS when the server offers it; `always`: refuse a server that does not;
    # `tls`: TLS from the first byte (port 465).
    smtp_security: Literal["auto", "always", "tls"] = "auto"
    # The CA bundle the server's certificate is checked against (a private CA); unset: the system's.
    smtp_ca_file: Path | None = None
    sender: str = "signoff@localhost"
    # Who each person is: `people: {alice: alice@example.com}` (docs/channels.md).
    users_file: Path = Path("email.yaml")
    # The adapter's own record (default: <data dir>/email/cards.json) and link key (beside it).
    state_file: Path | None = None
    # The confirmation pages: served here, linked as <public_url>/email/<link>.
    host: str = "0.0.0.0"
    port: int = 8025
    public_url: str = "http://127.0.0.1:8025"


@dataclass(frozen=True)
class Recipients:
    addresses: dict[str, str]

    @classmethod
    def load(cls, path: Path) -> Recipients:
        data = yaml.safe_load(path.read_text()) or {}
        return cls({str(k): str(v) for k, v in (data.get("people") or {}).items()})

    @property
    def principals(self) -> list[str]:
        return sorted(self.addresses)


# --- links ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    request_id: str
    principal: str
    decision: Literal["approve", "deny"]
    expires: float
    nonce: str

    def response_id(self) -> str:
        return "rsp_mail_" + hashlib.sha256(self.nonce.encode()).hexdigest()[:40]


class BadLink(Exception):
    def __init__(self, status: int, title: str, text: str) -> None:
        super().__init__(title)
        self.status, self.title, self.text = status, title, text


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def sign_link(key: bytes, link: Link) -> str:
    body = _b64(json.dumps([link.request_id, link.principal, link.decision, link.expires, link.nonce]).encode())
    return body + "." + _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())


def read_link(key: bytes, token: str, now: float) -> Link:
    """The link a token names, if this adapter signed it and it has not expired."""
    body, _, mac = token.partition(".")
    wanted = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    if not mac or not hmac.compare_digest(mac, wanted):
        raise BadLink(
            403, "This link is not valid", "It was not made by Signoff, or it was changed. Nothing was decided."
        )
    request_id, principal, decision, expires, nonce = json.loads(
        base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    )
    if now > float(expires):
        raise BadLink(410, "This link expired", "The request it was for is past its deadline. Nothing was decided.")
    return Link(request_id, principal, decision, float(expires), nonce)


def link_key(path: Path) -> bytes:
    """The adapter's own link key, made once (0600) beside its record."""
    if not path.exists():
        replace_private(path, secrets.token_bytes(32))
    return path.read_bytes()


# --- what a mail and a page show ------------------------------------------------------------


def card_text(face: CardFace, event: CardEvent) -> list[str]:
    """The card as lines of plain text (the mail's text part; the page's `<pre>`): the
    card's own lines (`card_rows`), with when it expires and how many must approve."""
    expires = getattr(event, "expires_at", None)
    details = [("expires", expires.isoformat(timespec="seconds") if expires else "never")]
    required = getattr(event, "approvals_required", 1)
    if required > 1:
        details.append(("approvals", f"{required} people must approve"))
    return [card_headline(face), *card_rows(face, details=details)]


def mail(event: CardEvent, face: CardFace, sender: str, to: str, approve: str, deny: str) -> EmailMessage:
    message = EmailMessage()
    # The subject is a header: only the card's visible text, no line break can reach it.
    message["Subject"] = f"Approval needed: {face.label}"[:200]
    message["From"] = sender
    message["To"] = to
    message["X-Signoff-Request"] = event.request_id
    body = card_text(face, event)
    text = "\n".join(
        [*body, "", f"Approve: {approve}", f"Deny:    {deny}", "", "Each link opens a page that asks you to confirm."]
    )
    message.set_content(text)
    message.add_alternative(
        "<!doctype html><html><body>"
        f"<pre>{html.escape(chr(10).join(body))}</pre>"
        f'<p><a href="{html.escape(approve)}">Approve</a> · <a href="{html.escape(deny)}">Deny</a></p>'
        "<p>Each link opens a page that asks you to confirm.</p></body></html>",
        subtype="html",
    )
    return message


def page(title: str, text: str, body: str = "") -> str:
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>'
        f"{html.escape(title)}</title></head><body><h1>{html.escape(title)}</h1>"
        f"<p>{html.escape(text)}</p>{body}</body></html>"
    )


# --- the channel ----------------------------------------------------------------------------


Verify = Callable[[str, str], bool]


class EmailChannel:
    def __init__(
        self,
        adapter: ChannelAdapter,
        settings: EmailSettings,
        book: CardBook,
        recipients: Recipients,
        catalogue: ToolCatalogue,
        key: bytes,
        verify_login: Verify,
    ) -> None:
        self.adapter = adapter
        self.settings = settings
        self.book = book
        self.recipients = recipients
        self.catalogue = catalogue
        self.key = key
        self.verify_login = verify_login
        self._lock = asyncio.Lock()

    def approvers(self, card: CardEvent) -> list[str]:
        """The mapped people who may approve the card's tool (an escalated card: its group too)."""
        spec = self.catalogue.get(card.card.tool)
        if spec is None:
            return []
        allowed = self.catalogue.approvers_of(spec)
        if allowed is not None and isinstance(card, ApprovalEscalated):
            allowed = allowed | self.catalogue.principals(card.escalated_to)
        return [p for p in self.recipients.principals if allowed is None or p in allowed]

    def needs_login(self, card: CardEvent) -> bool:
        """Separation of duties, or several approvers: a forwarded mail must not be enough."""
        spec = self.catalogue.get(card.card.tool)
        required = getattr(card, "approvals_required", 1)
        return spec is None or not spec.starter_may_approve or spec.approvals_required > 1 or required > 1

    def links(self, card: CardEvent, principal: str) -> tuple[str, str]:
        expires_at: datetime | None = getattr(card, "expires_at", None)
        expires = expires_at.timestamp() if expires_at else time.time() + LINK_DAYS_WITHOUT_DEADLINE * 86400
        base = self.settings.public_url.rstrip("/")
        made = []
        for decision in ("approve", "deny"):
            link = Link(card.request_id, principal, decision, expires, secrets.token_urlsafe(16))  # type: ignore[arg-type]
            made.append(f"{base}/email/{sign_link(self.key, link)}")
        return made[0], made[1]

    async def show(self, card: CardEvent) -> None:
        """Mail the card to each approver not mailed yet."""
        async with self._lock:
            entry = self.book.get(card.request_id) or {"event": card.model_dump(mode="json"), "sent": [], "used": []}
            if isinstance(card, ApprovalRequested):
                entry["event"] = card.model_dump(mode="json")
            face = card_face(card.request_id, card.card.model_dump(mode="json"), card.args_digest)
            for principal in self.approvers(card):
                if principal in entry["sent"]:
                    continue
                approve, deny = self.links(card, principal)
                await self._send(
                    mail(card, face, self.settings.sender, self.recipients.addresses[principal], approve, deny)
                )
                entry["sent"].append(principal)
                self.book.put(card.request_id, entry)
                log.info("mailed card %s to %s", card.request_id, principal)
            self.book.put(card.request_id, entry)

    async def _send(self, message: EmailMessage) -> None:
        import aiosmtplib

        security = self.settings.smtp_security
        await aiosmtplib.send(
            message,
            hostname=self.settings.smtp_host,
            port=self.settings.smtp_port,
            username=self.settings.smtp_username or None,
            password=self.settings.smtp_password or None,
            use_tls=security == "tls",
            # None: STARTTLS if the server offers it.
            start_tls=True if security == "always" else (False if security == "tls" else None),
            cert_bundle=str(self.settings.smtp_ca_file) if self.settings.smtp_ca_file else None,
            timeout=30,
        )

    async def on_event(self, event: Envelope) -> None:
        if isinstance(event, ApprovalRequested | ApprovalEscalated):
            await self.show(event)

    async def catch_up(self, pending: list[PendingCard]) -> None:
        for card in pending:
            await self.show(card.event)

    # --- the links ---

    def opened(self, token: str) -> tuple[Link, dict[str, Any]]:
        link = read_link(self.key, token, time.time())
        entry = self.book.get(link.request_id)
        if entry is None or link.principal not in entry.get("sent", []):
            raise BadLink(404, "Unknown request", "Signoff did not mail this request. Nothing was decided.")
        if link.nonce in entry.get("used", []):
            raise BadLink(410, "This link was used", "It decides once; it was used already. Nothing changed.")
        return link, entry

    def confirmation(self, token: str) -> str:
        """GET: the card and a form; nothing is decided."""
        link, entry = self.opened(token)
        event = CardBook.event_of(entry)
        face = card_face(event.request_id, event.card.model_dump(mode="json"), event.args_digest)
        login = (
            f"<p><label>Your Signoff password ({html.escape(link.principal)}): "
            '<input type="password" name="password" autocomplete="current-password" required></label></p>'
            if self.needs_login(event)
            else ""
        )
        reason = (
            '<p><label>Why (the agent reads it): <textarea name="reason" maxlength="2000"></textarea></label></p>'
            if link.decision == "deny"
            else ""
        )
        verb = "Approve" if link.decision == "approve" else "Deny"
        form = (
            f"<pre>{html.escape(chr(10).join(card_text(face, event)))}</pre>"
            f'<form method="post">{reason}{login}<button type="submit">{verb} as {html.escape(link.principal)}'
            "</button></form>"
        )
        return page(f"{verb} {face.label}?", "Nothing is decided until you press the button.", form)

    async def decide(self, token: str, form: dict[str, str]) -> tuple[int, str]:
        """POST: decides once, as the recipient (with their password when the tool asks one)."""
        link, entry = self.opened(token)
        event = CardBook.event_of(entry)
        if self.needs_login(event) and not self.verify_login(link.principal, form.get("password", "")):
            return 401, page(
                "Not signed in", "This tool needs your Signoff password; it did not match. Nothing was decided."
            )
        try:
            await self.adapter.respond(
                event,
                link.decision,
                link.principal,
                reason=form.get("reason", "")[:2000],
                response_id=link.response_id(),
                verdict_within=VERDICT_SECONDS,
            )
        except Refused as refused:
            self._use(link)
            return 409, page("Signoff did not take it", refused.reason_text)
        except TimeoutError:
            return 202, page("Sent", "Signoff has not answered yet; your answer may still count.")
        self._use(link)
        verb = "approval" if link.decision == "approve" else "denial"
        return 200, page("Thank you", f"Your {verb} is recorded as {link.principal}.")

    def _use(self, link: Link) -> None:
        entry = self.book.get(link.request_id)
        if entry is not None:
            entry["used"] = [*entry.get("used", []), link.nonce]
            self.book.put(link.request_id, entry)


def pages_app(channel: EmailChannel) -> Any:
    """The confirmation pages: GET shows, POST decides."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, PlainTextResponse
    from starlette.routing import Route

    async def link_page(request: Request):
        token = request.path_params["token"]
        try:
            if request.method == "GET":
                return HTMLResponse(channel.confirmation(token), headers=HEADERS)
            body = await request.body()
            if len(body) > FORM_BYTES:
                return HTMLResponse(page("Too long", "Nothing was decided."), status_code=413, headers=HEADERS)
            form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), max_num_fields=8).items()}
            status, shown = await channel.decide(token, form)
            return HTMLResponse(shown, status_code=status, headers=HEADERS)
        except BadLink as bad:
            return HTMLResponse(page(bad.title, bad.text), status_code=bad.status, headers=HEADERS)
        except (ValueError, KeyError):
            return HTMLResponse(
                page("This link is not valid", "Nothing was decided."), status_code=400, headers=HEADERS
            )

    async def healthz(_request: Request):
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/email/{token}", link_page, methods=["GET", "POST"]), Route("/healthz", healthz)])


async def run(settings: Any, email: EmailSettings, verify_login: Verify) -> None:
    """The email channel's process: the bus, the catch-up, then the confirmation pages over HTTP."""
    try:
        import aiosmtplib  # noqa: F401
    except ImportError:
        raise SystemExit(
            "signoff channel run email: the email adapter needs the `email` extra (aiosmtplib is missing): "
            "pip install 'signoff[email]'"
        ) from None
    import uvicorn

    from shared import keyring
    from shared.catalogue import load_catalogue
    from shared.ledger.console_reads import ConsoleLedger
    from signoff.adapters.backlog import pending_cards

    state = email.state_file or settings.data_dir / "email" / "cards.json"
    book = CardBook(state)
    key = link_key(state.with_name("links.key"))
    url, _ = settings.amqp_login("channel.email")
    channel_key = keyring.channel_private_key(settings.keys_path, "email")
    async with (
        ChannelAdapter(url, settings.namespace, channel_key, "email") as adapter,
        ConsoleLedger(settings) as ledger,
    ):
        events = await adapter.events("approval.requested.*", "approval.escalated.*")
        channel = EmailChannel(
            adapter,
            email,
            book,
            Recipients.load(email.users_file),
            load_catalogue(settings.tools_file),
            key,
            verify_login,
        )
        server = uvicorn.Server(
            uvicorn.Config(pages_app(channel), host=email.host, port=email.port, log_level="warning")
        )
        serving = asyncio.create_task(server.serve())
        await channel.catch_up(await pending_cards(ledger))
        log.info("email ready: %d cards mailed, pages on %s:%d", len(book.entries), email.host, email.port)
        try:
            async for event in events:
                try:
                    await channel.on_event(event)
                except Exception:  # the SMTP server down: the next start mails what is missing
                    log.exception("could not mail %s %s", event.type, getattr(event, "request_id", ""))
        finally:
            server.should_exit = True
            await serving
