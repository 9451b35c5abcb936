"""What is hidden and what is shown (shared/redaction.py, docs/design.md "Secrets"):
secrets by declaration, by a credential's whole name and by a credential's shape;
ordinary fields that merely contain "pass" or "token" are shown."""

import json
import logging
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import logs, redaction
from shared.redaction import (
    REDACTED,
    redact_arguments,
    redact_message_body,
    redact_text,
    secret_values,
)

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1c\n-----END RSA PRIVATE KEY-----"

# (field name, its schema, its value, hidden?) — the table the card, the transcript and every other path follow.
TABLE = [
    # Declared secret by the schema, whatever the name.
    ("pin", {"type": "string", "format": "password"}, "1234", True),
    ("code", {"type": "string", "writeOnly": True}, "9876", True),
    ("chat_id", {"type": "string", "x-signoff-secret": True}, "c-42", True),
    # A credential's whole name (the last word, or the whole name), whatever its case.
    ("password", {}, "hunter2", True),
    ("db_password", {}, "hunter2", True),
    ("Passwd", {}, "hunter2", True),
    ("client_secret", {}, "abc", True),
    ("clientSecret", {}, "abc", True),
    ("token", {}, "abc", True),
    ("ACCESS_TOKEN", {}, "abc", True),
    ("api_key", {}, "abc", True),
    ("api-key", {}, "abc", True),
    ("apiKey", {}, "abc", True),
    ("Authorization", {}, "abc", True),
    ("authorisation", {}, "abc", True),
    ("credentials", {}, "abc", True),
    ("Cookie", {}, "abc", True),
    ("private_key", {}, "abc", True),
    ("privateKey", {}, "abc", True),
    # Ordinary fields that merely contain the letters: shown.
    ("bypass_review", {}, True, False),
    ("max_tokens", {}, 512, False),
    ("passengers", {}, 3, False),
    ("token_count", {}, 7, False),
    ("password_hint", {}, "the dog's name", False),
    ("compass", {}, "north", False),
    ("secretary", {}, "Ann", False),
    ("keyboard", {}, "qwerty", False),
    ("to", {}, "acme", False),
    ("tokens", {}, ["a", "b"], False),
    # An ordinary name with a credential-shaped value: hidden.
    ("note", {}, "Bearer abcdef123456", True),
    ("note", {}, "sk-proj-AbCdEf0123456789", True),
    ("note", {}, "AKIAIOSFODNN7EXAMPLE", True),
    ("note", {}, JWT, True),
    ("note", {}, PEM, True),
    ("link", {}, "https://u:p@host.example.com/x", True),
    ("link", {}, "https://host.example.com/x?token=abc", True),
    # An ordinary value: shown.
    ("link", {}, "https://host.example.com/docs/page", False),
    ("note", {}, "a basic check of the token budget", False),
]


@pytest.mark.parametrize(("name", "schema", "value", "hidden"), TABLE)
def test_a_field_is_hidden_or_shown_as_the_table_says(name, schema, value, hidden):
    declared = {"type": "object", "properties": {name: schema}}
    shown, names = redact_arguments({name: value, "other": "x"}, declared)
    assert (shown[name] != value) is hidden, shown
    assert names == ([name] if hidden else [])
    assert shown["other"] == "x"
    assert not hidden or str(value) not in json.dumps(shown)


def test_a_declared_secret_is_hidden_inside_arrays_and_nested_objects():
    schema = {"type": "object", "properties": {"accounts": {"type": "array", "items": {
        "type": "object", "properties": {"login": {"type": "object", "properties": {
            "pin": {"type": "string", "format": "password"}}}}}}}}
    shown, hidden = redact_arguments({"accounts": [{"login": {"pin": "1", "user": "ann"}}]}, schema)
    assert shown == {"accounts": [{"login": {"pin": REDACTED, "user": "ann"}}]}
    assert hidden == ["accounts/0/login/pin"]


def test_a_credential_named_field_is_hidden_whole_whatever_it_holds():
    shown, _ = redact_arguments({"secret": {"nested": 1}, "password": ["a", "b"]}, {})
    assert shown == {"secret": REDACTED, "password": REDACTED}


def test_a_urls_user_info_and_query_values_are_hidden_and_its_host_path_and_query_names_shown():
    assert redact_text("see https://ann:pw@h.example.com/a/b?token=abc&page=2#top") == (
        f"see https://{REDACTED}@h.example.com/a/b?token={REDACTED}&page={REDACTED}#top")


def test_credential_shapes_are_hidden_inside_longer_texts():
    text = f"HTTP 401: Authorization: Bearer abc.def-123 rejected; key sk-live_0123456789ab; {JWT}; {PEM} end"
    shown = redact_text(text)
    for secret in ("abc.def-123", "sk-live_0123456789ab", JWT, "MIIEpAIBAAKCAQEA1c"):
        assert secret not in shown
    assert shown.startswith("HTTP 401: Authorization: Bearer ***redacted*** rejected") and shown.endswith(" end")


SHAPES_ALONE = [JWT, PEM, "Bearer abc.def-123", "basic dXNlcjpwYXNzMQ==", "sk-live_0123456789ab", "rk_test_0123456789",
                "ghp_" + "a" * 24, "github_pat_" + "b" * 24, "xoxb-0123456789ab", "AKIAABCDEFGHIJKLMNOP"]


@pytest.mark.parametrize("shape", SHAPES_ALONE)
def test_each_credential_shape_alone_in_an_ordinary_line_is_hidden(shape):
    shown = redact_text(f"call call_1: post_to_sink failed: {shape} (attempt 2)")
    assert REDACTED in shown and shape not in shown
    assert shown.startswith("call call_1: post_to_sink failed: ") and shown.endswith(" (attempt 2)")


# Texts made of the shapes' own pieces, so that hypothesis reaches near-misses of each.
_PIECES = st.sampled_from(
    ["-----BEGIN ", "RSA KEY", "-----", "-----END ", "://", "https", "Bearer", "BASIC", "baſic", "bEaReR", " ", "\t",
     "sk", "rk", "pk", "-", "_", "live", "gh", "p", "github_pat", "xox", "b", "AKIA", "ASIA", "AIDA", "AROA", "eyJ",
     ".", "=", "@", "?", "&", "abcdefgh", "0123456789ABCDEF", "ZZZZ", "é", "ß", "K", *SHAPES_ALONE]
)


@given(st.lists(st.one_of(_PIECES, st.text(max_size=3)), max_size=25).map("".join))
def test_a_text_without_a_credential_shapes_clue_holds_no_credential_shape(text):
    """The fast path of redact_text (no clue: nothing to substitute) never skips a shape."""
    if redaction._SHAPE_CLUES.search(text) is None:
        assert not any(shape.search(text) for shape in redaction._SHAPES), text


def test_a_known_secret_is_hidden_wherever_it_appears_in_a_text():
    assert redact_text("echo: plainvalue42 and plainvalue42", ["plainvalue42"]) == f"echo: {REDACTED} and {REDACTED}"


def test_the_values_of_declared_and_credential_named_fields_are_what_a_call_must_not_repeat():
    schema = {"type": "object", "properties": {"chat": {"x-signoff-secret": True}}}
    assert sorted(secret_values({"chat": "c1", "auth": {"password": "p", "n": 2}, "to": "x"}, schema)) == ["c1", "p"]
    assert sorted(secret_values({"chat": "c1", "password": {"a": "p", "n": 2}, "to": "x"}, schema)) == ["2", "c1", "p"]


def test_a_parked_body_keeps_its_envelope_and_hides_every_argument_and_credential():
    body = json.dumps({"type": "tool.execute", "message_id": "msg_1", "session_id": "ses_1",
                       "arguments": {"message": "plain", "note": "x"}, "authorization": "sealed",
                       "other": "Bearer abcdef123456"}).encode()
    parked = json.loads(redact_message_body(body))
    assert parked == {"type": "tool.execute", "message_id": "msg_1", "session_id": "ses_1",
                      "arguments": {"message": REDACTED, "note": REDACTED}, "authorization": REDACTED,
                      "other": f"Bearer {REDACTED}"}
    assert redact_message_body(b"not json Bearer abcdef123456") == f"not json Bearer {REDACTED}".encode()


def test_log_lines_and_their_tracebacks_hide_remembered_secrets_and_credential_shapes():
    redaction.remember("remembered-secret-value")
    formatter = logs.Text("test")
    try:
        raise ValueError("failed with remembered-secret-value")
    except ValueError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "token %s", ("Bearer abcdef123456",), True)
        record.exc_info = sys.exc_info()
    line = formatter.format(record)
    assert "remembered-secret-value" not in line and "abcdef123456" not in line
    assert "ValueError" in line


def test_an_empty_credential_field_stays_empty_so_a_parked_response_can_be_replayed():
    body = json.dumps({"type": "approval.respond", "message_id": "msg_1", "response_token": None,
                       "api_key": None, "signature": "c2lnbmVk"}).encode()
    assert json.loads(redact_message_body(body)) == json.loads(body)
