"""Redaction rules that mutation testing showed no test stated: which
remembered values are scrubbed, where a URL's query and fragment begin, and how a parked
body that is not plain JSON, or is too deep, or nests objects, is kept. Pure."""

import json

from shared import redaction
from shared.redaction import REDACTED, redact_message_body, redact_url, redact_value


def test_a_remembered_value_of_four_characters_or_more_is_hidden_and_a_shorter_one_is_not():
    redaction.remember("q7z", "q7z9", "")
    assert "q7z9" in redaction.known()
    assert "q7z" not in redaction.known(), "shorter than four: too likely an ordinary word"
    assert "" not in redaction.known()
    assert redaction.redact_text("q7z and q7z9") == f"q7z and {REDACTED}"


def test_a_query_value_that_holds_a_question_mark_is_hidden_whole():
    assert redact_url("https://h.example/x?a=s3cret?b=2") == f"https://h.example/x?a={REDACTED}"


def test_a_urls_fragment_is_kept_as_written_even_when_it_looks_like_a_query():
    assert redact_url("https://h.example/p?k=v#sec&x=y") == f"https://h.example/p?k={REDACTED}#sec&x=y"


def test_a_url_without_a_query_keeps_its_fragment_and_hides_its_user_info():
    assert redact_url("https://ann:pw@h.example/p#x=1") == f"https://{REDACTED}@h.example/p#x=1"


def test_a_parked_body_that_is_not_json_hides_the_calls_known_secrets():
    assert redact_message_body(b"not json: plainsecret77", ["plainsecret77"]) == f"not json: {REDACTED}".encode()


def test_a_parked_body_that_is_not_utf8_is_kept_as_redacted_text_never_an_error():
    assert redact_message_body(b"\xff\xfe not json Bearer abcdef123456") == (
        f"\ufffd\ufffd not json Bearer {REDACTED}".encode())


def test_a_parked_json_body_hides_the_calls_known_secrets_outside_the_arguments_too():
    body = json.dumps({"type": "tool.failed", "error": "rejected plainsecret78"}).encode()
    assert json.loads(redact_message_body(body, ["plainsecret78"])) == {
        "type": "tool.failed", "error": f"rejected {REDACTED}"}


def test_a_parked_body_too_deep_to_redact_is_replaced_by_a_note_saying_so():
    depth = 600  # json reads it; walking it for secrets exceeds the recursion limit
    assert redact_message_body(b"[" * depth + b"]" * depth) == b'"(too deep to redact)"'


def test_a_parked_body_keeps_ordinary_values_of_nested_objects_and_lists_and_hides_arguments_anywhere():
    body = json.dumps({"type": "step.reported", "meta": {"note": "plain"},
                       "calls": [{"name": "post", "arguments": {"to": "ops"}}, "plain", ["x"]]}).encode()
    assert json.loads(redact_message_body(body)) == {
        "type": "step.reported", "meta": {"note": "plain"},
        "calls": [{"name": "post", "arguments": {"to": REDACTED}}, "plain", ["x"]]}


def test_a_parked_body_that_is_a_json_list_is_redacted_as_a_list():
    assert json.loads(redact_message_body(b'["Bearer abcdef123456", {"arguments": {"a": 1}}]')) == [
        f"Bearer {REDACTED}", {"arguments": {"a": REDACTED}}]


def test_a_value_redacted_without_a_schema_hides_the_secrets_it_is_given():
    assert redact_value({"note": ["plainsecret79"]}, ["plainsecret79"]) == {"note": [REDACTED]}


def test_of_two_known_secrets_one_inside_the_other_the_longer_is_hidden_first_so_no_part_of_it_shows():
    assert redaction.redact_text("id aaaazzzz", ["zzzz", "aaaazzzz"]) == f"id {REDACTED}"


def test_a_secret_given_for_the_call_is_hidden_from_four_characters_and_a_shorter_one_is_not():
    assert redaction.redact_text("abc abcd", ["abc", "abcd", ""]) == f"abc {REDACTED}"


def test_a_credential_shaped_text_deep_in_the_arguments_is_listed_by_its_slash_joined_path():
    shown, hidden = redaction.redact_arguments({"a": {"note": "Bearer abcdef123456"}}, {})
    assert (shown, hidden) == ({"a": {"note": f"Bearer {REDACTED}"}}, ["a/note"])


def test_every_item_of_a_credential_named_list_is_a_secret_value_but_no_null_or_boolean():
    assert redaction.secret_values({"password": ["p1", None, True, {"k": "p2"}]}, {}) == ["p1", "p2"]
    assert redaction.secret_values({"token": None, "api_key": False}, {}) == []


def test_a_declared_secret_nested_in_objects_and_lists_is_a_secret_value():
    pin = {"type": "string", "format": "password"}
    schema = {"type": "object", "properties": {
        "auth": {"type": "object", "properties": {"pin": pin}},
        "accounts": {"type": "array", "items": {"type": "object", "properties": {"pin": pin}}}}}
    arguments = {"auth": {"pin": "1111", "user": "ann"}, "accounts": [{"pin": "2222", "user": "bob"}], "to": "x"}
    assert redaction.secret_values(arguments, schema) == ["1111", "2222"]


def test_a_field_name_with_no_word_in_it_is_not_a_credentials_name():
    assert not redaction.is_credential_name("__")
    assert redaction.redact_arguments({"-": "shown"}, {}) == ({"-": "shown"}, [])


def test_a_basic_or_bearer_token_keeps_its_scheme_word_and_spacing_and_loses_only_the_token():
    assert redaction.redact_text("Authorization: Basic  dXNlcjpwYXNzMQ==") == f"Authorization: Basic  {REDACTED}"
    assert redaction.redact_text("Authorization: bearer\tabcdef123456") == f"Authorization: bearer\t{REDACTED}"


def test_fields_a_schema_takes_through_additional_properties_follow_its_secret_declaration():
    schema = {"type": "object", "properties": {"to": {}}, "additionalProperties": {"writeOnly": True}}
    assert redaction.redact_arguments({"to": "ops", "chat": "c-1"}, schema) == (
        {"to": "ops", "chat": REDACTED}, ["chat"])
    assert redaction.secret_values({"to": "ops", "chat": "c-1"}, schema) == ["c-1"]
