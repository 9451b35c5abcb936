"""One way to do each thing at the edges: one AMQP client path in the running code (aio-pika's
`Bus`; FastStream only writes the AsyncAPI document), one builder and signer of a response
(shared/responses.py), one drawing of a card's lines (shared.on_screen.card_rows)."""

import ast
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.operations.cards import card_lines
from shared.messages import ApprovalCard, ApprovalRequested, FiledBy
from shared.on_screen import card_face, card_headline, card_rows
from shared.responses import ResponseSigner
from shared.signatures import load_public_key, new_private_key, public_key_text, verify
from signoff.adapters.email import card_text
from signoff.channel import ChannelAdapter, describe

ROOT = Path(__file__).resolve().parents[2]
RUNNING = ("services", "shared", "signoff")
# The one module that may describe the topology to FastStream: the AsyncAPI document's writer.
DOCUMENTATION_ONLY = {"shared/contract.py"}


def modules():
    for package in RUNNING:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_nothing_that_runs_imports_faststream_only_the_asyncapi_writer_does():
    users = {path for path, tree in modules() if "faststream" in imported(tree)}
    assert users == DOCUMENTATION_ONLY, "publish and consume through shared/bus.py's Bus, not FastStream"


def test_a_response_is_signed_in_one_place():
    # `signed_part()` is what a response's signature covers: made into a signature in
    # shared/responses.py only, checked by the ledger only.
    signing = {path for path, tree in modules() for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr == "signed_part"
               and isinstance(getattr(node, "ctx", None), ast.Load)}
    assert signing == {"shared/responses.py", "services/approval_ledger/domain.py"}


def test_a_signed_response_verifies_with_the_channels_public_key_and_names_the_channel():
    key = new_private_key()
    signed = ResponseSigner("inbox", key).respond(session_id="ses_1", request_id="apr_1", decision="approve",
                                                  args_digest="d", responder="alice", response_id="rsp_click")
    assert (signed.key_id, signed.response_id, signed.responder) == ("inbox", "rsp_click", "alice")
    assert verify(load_public_key(public_key_text(key)), signed.signed_part(), signed.signature)
    forged = signed.model_copy(update={"decision": "deny"})
    assert not verify(load_public_key(public_key_text(key)), forged.signed_part(), signed.signature)


def test_a_channel_adapters_responses_come_from_the_one_signer():
    key = new_private_key()
    adapter = ChannelAdapter("amqp://u:p@localhost/", "ns", key, "inbox")
    card = requested()
    mine = adapter.response(card, "approve", "alice", response_id="rsp_x")
    token = adapter.token_response(card, "deny", reason="no")
    for response in (mine, token):
        assert response.key_id == "inbox"
        assert verify(load_public_key(public_key_text(key)), response.signed_part(), response.signature)
    assert (token.responder, token.response_token) == ("token:inbox", "tok_1")


def requested() -> ApprovalRequested:
    card = ApprovalCard(tool="post_to_sink", label="Post a message", description="posts", effect="outward",
                        target="POST https://exаmple.com/sink", arguments={"message": "two\nlines", "n": 1},
                        hidden=["api_token"], reason="always asks: one approver",
                        filed=FiledBy(program="bot:agent", origin="http:agent", caller_call_id="c1",
                                      summary="post it"))
    return ApprovalRequested(session_id="ses_1", request_id="apr_1", call_id="call_1", step_id="stp_1",
                             args_digest="hmac:1", card=card, pending_request_ids=["apr_1"], response_token="tok_1",
                             expires_at=datetime(2026, 12, 1, tzinfo=UTC))


def test_the_console_an_email_and_the_sdk_draw_a_card_with_the_same_lines():
    event = requested()
    face = card_face(event.request_id, event.card.model_dump(mode="json"), event.args_digest)
    rows = card_rows(face)
    console = [line[4:] for line in card_lines(event.request_id, event.card.model_dump(mode="json"),
                                               event.args_digest)[1:]]
    email = [line for line in card_text(face, event) if not line.startswith("expires:")]
    assert console == rows
    assert email == [card_headline(face), *rows]
    assert describe(event).splitlines() == [card_headline(face), *rows]
    # What the one drawing says: who filed it, the look-alike host, the hidden argument.
    assert "filed by:  bot:agent for http:agent: post it" in rows
    assert any(row.startswith("WARNING:   the host xn--") for row in rows)
    assert "hidden:    api_token (secret: withheld from everyone but the executor)" in rows


@pytest.mark.parametrize("medium", ["console", "sdk"])
def test_a_line_break_in_an_argument_cannot_fake_a_line_of_the_card(medium):
    event = requested()
    event = event.model_copy(update={"card": event.card.model_copy(
        update={"arguments": {"message": "ok\ndigest:    hmac:forged"}})})
    if medium == "console":
        lines = card_lines(event.request_id, event.card.model_dump(mode="json"), event.args_digest)
    else:
        lines = describe(event).splitlines()
    assert [line for line in lines if "digest:" in line and "forged" not in line] == [lines[-1]]
    assert not any(line.lstrip("└│ ").startswith("digest:    hmac:forged") for line in lines)
