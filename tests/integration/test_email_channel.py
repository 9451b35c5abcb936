"""The email channel (signoff/adapters/email.py) as a process, `signoff channel run email`,
mailing to an aiosmtpd server on loopback: the card and two links per approver; opening a
link decides nothing; its POST decides once, as the recipient; a reused, expired or altered
link is refused; a tool with separation of duties asks the recipient's password."""

from __future__ import annotations

import asyncio
import email as email_parser
import email.policy
import signal
import subprocess
import sys
import time

import httpx
import pytest
import yaml
from aiosmtpd.controller import Controller

from services.operations import channels
from services.gateway import users as gateway_users
from shared.ledger.tables import Decision
from shared.messages import StartTurn, mint
from shared.settings import PROJECT_ROOT
from signoff.adapters.email import Link, sign_link
from tests.harness import eventually, free_port, next_event, rows

PEOPLE = {"alice": "alice@example.com", "bob": "bob@example.com"}


class Inbox:
    """aiosmtpd's handler: every message it is given."""

    def __init__(self) -> None:
        self.messages: list[email_parser.message.Message] = []

    async def handle_DATA(self, server, session, envelope):
        assert session.ssl is not None, "mail only over STARTTLS"
        self.messages.append(email_parser.message_from_bytes(envelope.content, policy=email.policy.default))
        return "250 OK"

    def to(self, address: str, request_id: str):
        return [m for m in self.messages if m["To"] == address and m["X-Signoff-Request"] == request_id]


def server_tls(folder):
    """A certificate for 127.0.0.1, its own CA (the adapter is given it as its CA bundle)."""
    import datetime
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    (folder / "smtp.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (folder / "smtp.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(folder / "smtp.crt", folder / "smtp.key")
    return context


async def until(check, timeout: float = 20.0):
    async def checked():
        return check()

    return await eventually(checked, timeout)


@pytest.fixture
async def mailer(sqlite_deployment, sink):
    deployment = sqlite_deployment
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    inbox = Inbox()
    folder = deployment.data_dir / "email"
    folder.mkdir(parents=True, exist_ok=True)
    # The server offers STARTTLS and takes no mail before it: the adapter must upgrade.
    smtp = Controller(
        inbox, hostname="127.0.0.1", port=free_port(), tls_context=server_tls(folder), require_starttls=True
    )
    smtp.start()
    (folder / "people.yaml").write_text(yaml.safe_dump({"people": PEOPLE}))
    await asyncio.to_thread(channels.add, deployment.settings, "email", list(PEOPLE))
    port = free_port()
    env = {
        **deployment.env(),
        "SIGNOFF_EMAIL_SMTP_HOST": "127.0.0.1",
        "SIGNOFF_EMAIL_SMTP_PORT": str(smtp.port),
        "SIGNOFF_EMAIL_SMTP_CA_FILE": str(folder / "smtp.crt"),
        "SIGNOFF_EMAIL_USERS_FILE": str(folder / "people.yaml"),
        "SIGNOFF_EMAIL_SENDER": "signoff@example.com",
        "SIGNOFF_EMAIL_HOST": "127.0.0.1",
        "SIGNOFF_EMAIL_PORT": str(port),
        "SIGNOFF_EMAIL_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "SIGNOFF_LOG_FORMAT": "text",
    }
    log = folder / "adapter.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.operations.cli", "channel", "run", "email"],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def ready():
        assert process.poll() is None, log.read_text()[-3000:]
        return "email ready" in log.read_text()

    await until(ready, timeout=30)
    try:
        yield deployment, inbox
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        smtp.stop()


def links(message) -> dict[str, str]:
    return {
        line.split(":", 1)[0]: line.split(":", 1)[1].strip()
        for line in text_of(message).splitlines()
        if line.startswith(("Approve:", "Deny:"))
    }


def text_of(message) -> str:
    return next(part for part in message.walk() if part.get_content_type() == "text/plain").get_content()


async def mailed(deployment, inbox: Inbox, prefix: str | None = None):
    session_id = f"{prefix}-{mint('x')}" if prefix else mint("ses")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="go", started_by="sam"))
        card = await next_event(events, "approval.requested", timeout=30)
    await until(lambda: all(inbox.to(address, card.request_id) for address in PEOPLE.values()), timeout=20)
    return card, session_id


async def test_a_mailed_card_is_decided_only_by_its_links_post_once_as_the_recipient(mailer, sink):
    deployment, inbox = mailer
    card, session_id = await mailed(deployment, inbox)
    [to_alice] = inbox.to("alice@example.com", card.request_id)
    [to_bob] = inbox.to("bob@example.com", card.request_id)
    assert "Post a message to the sink" in text_of(to_alice) and card.request_id in text_of(to_alice)
    alice, bob = links(to_alice), links(to_bob)
    assert set(alice) == {"Approve", "Deny"} and alice["Approve"] != bob["Approve"]
    async with httpx.AsyncClient(timeout=30) as http:
        # Opening (a person, or a mail scanner) decides nothing.
        for _ in range(2):
            shown = await http.get(alice["Approve"])
            assert shown.status_code == 200 and "Nothing is decided" in shown.text and "<form" in shown.text
        await asyncio.sleep(0.5)
        assert await rows(deployment, Decision, request_id=card.request_id) == []
        # A link changed by one character, and one past its deadline: refused.
        body, _, _mac = alice["Approve"].rpartition("/")[2].partition(".")
        altered = alice["Approve"].replace(body, body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1])
        assert (await http.post(altered)).status_code == 403
        key = (deployment.data_dir / "email" / "links.key").read_bytes()
        base = alice["Approve"].rpartition("/")[0]
        late = sign_link(key, Link(card.request_id, "alice", "approve", time.time() - 1, "n0"))
        assert (await http.post(f"{base}/{late}")).status_code == 410
        # A well-formed link for a real recipient, signed with any other key: refused.
        forged = sign_link(b"k" * 32, Link(card.request_id, "alice", "approve", time.time() + 600, "forged"))
        assert (await http.get(f"{base}/{forged}")).status_code == 403
        assert (await http.post(f"{base}/{forged}")).status_code == 403
        # The POST decides, as the recipient; the same link again does nothing more.
        async with deployment.console() as console:
            events = await console.watch(session_id)
            decided = await http.post(alice["Approve"])
            assert decided.status_code == 200, decided.text
            said = await next_event(events, "approval.decided", timeout=30)
            assert (said.decision, said.responder) == ("approve", "alice")
            await next_event(events, "turn.completed", timeout=30)
        assert (await http.post(alice["Approve"])).status_code == 410
        assert (await http.post(bob["Deny"])).status_code == 409  # decided already: the ledger says so
    [decision] = await rows(deployment, Decision, request_id=card.request_id)
    assert (decision.responder, decision.channel) == ("alice", "email")
    assert sink.counts["/sink"] == 1


async def test_a_tool_with_separation_of_duties_asks_the_recipients_password_on_the_page(mailer, sink):
    deployment, inbox = mailer
    users_path = deployment.data_dir / "keys" / "gateway" / "users.yaml"
    await asyncio.to_thread(
        gateway_users.add, deployment.data_dir / "keys", users_path, "bob", "bob-pass-1234", [], False
    )
    card, session_id = await mailed(deployment, inbox, "separated")
    [to_bob] = inbox.to("bob@example.com", card.request_id)
    link = links(to_bob)["Deny"]
    async with httpx.AsyncClient(timeout=30) as http:
        shown = await http.get(link)
        assert 'type="password"' in shown.text and "<textarea" in shown.text
        assert (await http.post(link, data={"reason": "no"})).status_code == 401
        assert (await http.post(link, data={"reason": "no", "password": "wrong"})).status_code == 401
        assert await rows(deployment, Decision, request_id=card.request_id) == []
        async with deployment.console() as console:
            events = await console.watch(session_id)
            answer = await http.post(link, data={"reason": "not this week", "password": "bob-pass-1234"})
            assert answer.status_code == 200, answer.text
            said = await next_event(events, "approval.decided", timeout=30)
            assert (said.decision, said.responder, said.reason) == ("deny", "bob", "not this week")
    assert sink.counts["/separated"] == 0
