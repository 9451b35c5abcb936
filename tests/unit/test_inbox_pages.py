"""The inbox's page rules (services/gateway/inbox.py), pure: what a card shows of text from
outside, whose cards wait for whom, where a login may send the browser next, which
arguments the edit form offers and what it sends, and how a turn and a transcript read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.gateway.problems import Problem
from services.gateway.inbox import (
    _identifier,
    _shown_entry,
    duration,
    edit_fields,
    edited_arguments,
    safe_next,
    shown_card,
    sorted_for,
    turn_said,
)
from services.gateway.users import User
from shared.catalogue import ToolSpec
from shared.ledger.tables import Turn
from shared.on_screen import FIELD_CHARS, TARGET_CHARS, TEXT_CHARS, host_warnings, json_lines, visible

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def card(**changes) -> dict:
    base = {
        "id": "apr_1", "session_id": "ses_1", "status": "pending", "tool": "post", "label": "Post",
        "description": "", "effect": "outward", "target": "https://example.com/x",
        "arguments": {"message": "hi"}, "hidden": [], "args_digest": "hmac-sha256:ab",
        "created_at": NOW - timedelta(seconds=75), "expires_at": NOW + timedelta(hours=2, minutes=5),
        "approvers": ["alice", "bob"], "approvals": 0, "approvals_required": 1, "starter_may_approve": True,
    }
    return {**base, **changes}


def person(name: str) -> User:
    return User(name, "", (), False)


def test_a_card_shows_bidi_overrides_and_zero_width_characters_as_escapes_and_warns_of_look_alike_hosts():
    shown = shown_card(card(target="https://exаmple.com/\u202epay", label="Po\u200bst",
                            arguments={"to": "evil\u202e.com", "note": "a\nb"}), NOW)
    assert "\u202e" not in shown["target_shown"] and "\\u202e" in shown["target_shown"]
    assert "\u200b" not in shown["label_shown"]
    assert all("\u202e" not in line and "\n" not in line for line in shown["argument_lines"])
    assert any("xn--" in warning for warning in shown["warnings"]), shown["warnings"]


def test_a_card_counts_its_age_and_time_left_and_marks_an_outward_call():
    shown = shown_card(card(), NOW)
    assert (shown["age_seconds"], shown["left_seconds"], shown["outward"]) == (75, 2 * 3600 + 300, True)
    assert not shown_card(card(effect="idempotent"), NOW)["outward"]
    assert shown_card(card(approvers=None), NOW)["approvers_shown"] == "anyone the gateway vouches for"
    assert shown_card(card(expires_at=None), NOW)["left_seconds"] is None
    assert shown_card(card(hidden=["password", "x\u202ey"]), NOW)["hidden_shown"] == ["password", "x\\u202ey"]


def test_durations_read_at_a_glance():
    assert [duration(s) for s in (None, -1, 0, 9, 61, 3600 + 59)] == [
        "no expiry", "expired", "expired", "9 s", "1 min 01 s", "1 h 00 min"]


def test_a_card_waits_for_its_approvers_but_not_for_a_starter_it_forbids_nor_for_one_who_approved_already():
    cards = [card(id="apr_mine"), card(id="apr_theirs", approvers=["carol"]),
             card(id="apr_separated", starter_may_approve=False), card(id="apr_counted", approvals_required=2),
             card(id="apr_anyone", approvers=None)]
    split = sorted_for(person("alice"), cards, {"ses_1": {"alice"}}, {"apr_counted"})
    assert [c["id"] for c in split["mine"]] == ["apr_mine", "apr_anyone"]
    why = {c["id"]: c["why_not_yours"] for c in split["others"]}
    assert why == {"apr_theirs": "you are not among its approvers",
                   "apr_separated": "you started this session and this tool needs someone else to approve it",
                   "apr_counted": "you approved it; it waits for more approvers"}
    # Someone who did not start the session may approve the separated one.
    split = sorted_for(person("bob"), [card(id="apr_separated", starter_may_approve=False)], {"ses_1": {"alice"}},
                       set())
    assert [c["id"] for c in split["mine"]] == ["apr_separated"]


def test_after_logging_in_the_browser_goes_only_to_a_page_of_the_inbox():
    assert safe_next("/inbox/requests/apr_1") == "/inbox/requests/apr_1"
    for elsewhere in (None, "", "https://evil.test/inbox", "//evil.test", "/inbox//evil.test", "/inbox\\@evil.test",
                      "/v1/requests", "javascript:alert(1)", "/inboxes"):
        assert safe_next(elsewhere) == "/inbox", elsewhere


def test_a_card_says_why_it_needs_approval_and_who_edited_it_how():
    shown = shown_card(card(reason="amount 5,000 > 1,000: two approvers", edited_by="alice",
                            edit="amount: 5000 → 4000"), NOW)
    assert shown["reason_shown"] == "amount 5,000 > 1,000: two approvers"
    assert shown["edit_shown"] == "alice changed them: amount: 5000 → 4000"
    plain = shown_card(card(), NOW)
    assert (plain["reason_shown"], plain["edit_shown"]) == ("", "")
    assert shown_card(card(created_at=NOW + timedelta(seconds=5)), NOW)["age_seconds"] == 0
    assert shown_card(card(approvers=[]), NOW)["approvers_shown"] == "nobody"
    assert shown_card(card(created_at=datetime(2026, 12, 1, 11, 0)), NOW)["created_iso"] == "2026-12-01T11:00:00+00:00"


REFUND = ToolSpec.model_validate({
    "name": "refund", "label": "Refund", "editable": ["amount", "memo", "token", "tags"],
    "implementation": {"kind": "python", "function": "services.tool_executor.builtin:read_clock"},
    "parameters": {"type": "object", "properties": {
        "amount": {"type": "number"}, "customer": {"type": "string"}, "memo": {"type": "string"},
        "token": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}},
})
REFUND_CARD = card(tool="refund", hidden=["token"],
                   arguments={"amount": 5000, "customer": "c-2", "token": "***redacted***", "tags": ["a"]})


def test_the_edit_form_offers_the_tools_editable_fields_that_are_not_hidden_each_as_shown():
    assert edit_fields(REFUND, REFUND_CARD) == [
        {"name": "amount", "label": "amount", "value": "5000", "text": False},
        {"name": "memo", "label": "memo", "value": "", "text": True},
        {"name": "tags", "label": "tags", "value": '["a"]', "text": False},
    ]
    assert edit_fields(None, REFUND_CARD) == []
    assert edit_fields(REFUND.model_copy(update={"editable": False}), REFUND_CARD) == []
    assert edit_fields(REFUND, card(tool="refund", arguments={"memo": "as typed"}))[1]["value"] == "as typed"


def test_the_edit_form_sends_the_whole_object_with_only_the_fields_a_person_changed():
    form = {"arg.amount": "4000", "arg.memo": "late", "arg.tags": '["a"]', "arg.customer": "mallory"}
    assert edited_arguments(REFUND, REFUND_CARD, form) == {
        "amount": 4000, "customer": "c-2", "token": "***redacted***", "tags": ["a"], "memo": "late"}
    # A non-text field that is not JSON goes as typed (the ledger's schema check refuses it).
    assert edited_arguments(REFUND, REFUND_CARD, {"arg.amount": "lots"})["amount"] == "lots"
    assert edited_arguments(REFUND, REFUND_CARD, {"arg.memo": "[1]"})["memo"] == "[1]"
    assert edited_arguments(REFUND, REFUND_CARD, {}) == REFUND_CARD["arguments"]
    assert edited_arguments(None, REFUND_CARD, form) == REFUND_CARD["arguments"]


def turn(**changes) -> Turn:
    fields = {"status": "running", "reason_code": None, "reason_text": None, "ended_by": None}
    return Turn(**{**fields, **changes})


def test_a_turn_reads_as_its_status_what_it_waits_on_who_ended_it_and_why():
    assert turn_said(None, 0) == "none yet"
    assert turn_said(turn(), 0) == "running"
    assert turn_said(turn(), 1) == "running, waiting on 1 card"
    assert turn_said(turn(), 2) == "running, waiting on 2 cards"
    assert turn_said(turn(status="completed"), 2) == "completed"
    assert turn_said(turn(status="failed", reason_code="provider_failed", reason_text="HTTP 500"), 0) == (
        "failed (provider_failed): HTTP 500")
    assert turn_said(turn(status="cancelled", reason_code="cancelled", ended_by="alice", reason_text="No."), 0) == (
        "cancelled by alice: No.")
    assert "sk-" not in turn_said(turn(status="failed", reason_text="key sk-abcdefghijklmnopqrstuvwx1234"), 0)


def test_a_transcript_entry_shows_its_text_and_calls_through_the_screens_rules():
    entry = {"role": "assistant", "text": "ok\u202e", "call_id": None, "closure": None,
             "tool_calls": [{"name": "refund", "arguments": {"amount": 1}}, {"arguments": {}}]}
    assert _shown_entry(entry) == {"role": "assistant", "text": "ok\\u202e", "closure": None, "call_id": None,
                                   "calls": ['refund {   "amount": 1 }', " {}"]}
    tool = {"role": "tool", "text": "", "call_id": "call_1", "closure": "output", "tool_calls": []}
    assert _shown_entry(tool) == {"role": "tool", "text": "", "closure": "output", "call_id": "call_1", "calls": []}


def test_a_page_id_is_short_ascii_letters_digits_underscores_and_hyphens_or_no_such_page():
    assert _identifier("apr_1-x") == "apr_1-x" and _identifier("a" * 64) == "a" * 64
    for bad in ("", "a" * 65, "apr 1", "apr/1", "aprü", "apr.1"):
        with pytest.raises(Problem) as refused:
            _identifier(bad)
        assert refused.value.status == 404, bad


def test_every_text_a_card_shows_is_cut_to_its_screens_limit_and_a_missing_one_shows_as_nothing():
    long = "x" * 5000
    shown = shown_card(card(tool="t" + long, label="l" + long, description="d" + long, reason="r" + long,
                            target="https://example.com/" + long, hidden=["h" + long], approvers=["a" + long, "b"],
                            edited_by="e", edit="z" + long, arguments={"k": "https://exаmple.com"}), NOW)
    expected = {
        "tool_shown": visible("t" + long, FIELD_CHARS), "label_shown": visible("l" + long, FIELD_CHARS),
        "description_shown": visible("d" + long, TEXT_CHARS), "reason_shown": visible("r" + long, TEXT_CHARS),
        "edit_shown": visible("e changed them: z" + long, TEXT_CHARS),
        "target_shown": visible("https://example.com/" + long, TARGET_CHARS),
        "hidden_shown": [visible("h" + long, FIELD_CHARS)],
        "approvers_shown": visible("a" + long, FIELD_CHARS) + ", b",
        "argument_lines": json_lines({"k": "https://exаmple.com"}),
        "expires_iso": "2026-12-01T14:05:00+00:00", "created_iso": "2026-12-01T11:58:45+00:00",
    }
    assert {key: shown[key] for key in expected} == expected
    assert all(len(text) < 1100 for text in (shown["tool_shown"], shown["description_shown"], shown["target_shown"]))
    # A look-alike host in an argument is warned of, as on every channel's card (`card_face`).
    assert shown["warnings"] == host_warnings("https://exаmple.com")
    looks_alike = shown_card(card(target="https://exаmple.com/pay"), NOW)["warnings"]
    assert looks_alike == host_warnings("https://exаmple.com/pay") and len(looks_alike) == 1
    bare = shown_card({"id": "apr_2", "session_id": "s", "arguments": {}, "created_at": NOW, "approvers": ["ann"]},
                      NOW)
    assert [bare[k] for k in ("tool_shown", "label_shown", "description_shown", "target_shown", "hidden_shown",
                              "expires_iso", "warnings", "argument_lines")] == ["", "", "", "", [], None, [], ["{}"]]


def test_the_edges_of_the_page_rules():
    assert [duration(s) for s in (1, 3600, 59)] == ["1 s", "1 h 00 min", "59 s"]
    assert safe_next("/inbox?decided=apr_1") == "/inbox?decided=apr_1"
    assert safe_next("/inbox/requests/a\\b") == "/inbox"
    # A session with no starter on record, and a card that does not say whether its starter may approve.
    split = sorted_for(person("alice"), [card(id="apr_x", session_id="ses_other")], {}, set())
    assert [c["id"] for c in split["mine"]] == ["apr_x"]
    unsaid = card(id="apr_y")
    del unsaid["starter_may_approve"]
    assert [c["id"] for c in sorted_for(person("alice"), [unsaid], {"ses_1": {"alice"}}, set())["mine"]] == ["apr_y"]


def test_the_edit_form_reads_a_card_without_hidden_fields_or_arguments_and_shows_a_non_text_value_as_json():
    long_name = "n" * 130
    tool = ToolSpec.model_validate({
        "name": "t", "label": "T", "editable": True,
        "implementation": {"kind": "python", "function": "services.tool_executor.builtin:read_clock"},
        "parameters": {"type": "object", "properties": {"memo": {"type": "string"}, long_name: {"type": "number"}}}})
    bare = {"id": "apr_1", "tool": "t"}
    assert edit_fields(tool, bare) == [
        {"name": "memo", "label": "memo", "value": "", "text": True},
        {"name": long_name, "label": visible(long_name, FIELD_CHARS), "value": "", "text": False}]
    assert edit_fields(tool, bare)[1]["label"] != long_name
    assert edit_fields(tool, {**bare, "arguments": {"memo": 5}})[0]["value"] == "5"
    assert edited_arguments(tool, bare, {"arg.memo": "hi"}) == {"memo": "hi"}
    no_parameters = ToolSpec.model_validate({
        "name": "t", "label": "T", "editable": True,
        "implementation": {"kind": "python", "function": "services.tool_executor.builtin:read_clock"}})
    assert edit_fields(no_parameters, bare) == []


def test_a_turn_and_a_transcript_entry_are_cut_to_the_screens_limits():
    long = "x" * 5000
    said = turn_said(turn(status="failed", ended_by="b" + long, reason_code="c" + long, reason_text="t" + long), 0)
    assert said == (f"failed by {visible('b' + long, FIELD_CHARS)} ({visible('c' + long, FIELD_CHARS)}): "
                    f"{visible('t' + long, TEXT_CHARS)}")
    entry = {"role": "assistant", "text": "t" + long, "call_id": None, "closure": None,
             "tool_calls": [{"name": "n" + long, "arguments": {f"k{i}": i for i in range(30)}}]}
    shown = _shown_entry(entry)
    assert shown["text"] == visible("t" + long, TEXT_CHARS)
    assert shown["calls"] == [visible("n" + long, FIELD_CHARS) + " " + " ".join(
        json_lines({f"k{i}": i for i in range(30)}, max_lines=20))]
    assert _shown_entry({**entry, "text": None, "tool_calls": [{"name": "x"}]}) == {
        "role": "assistant", "text": "", "closure": None, "call_id": None, "calls": ["x {}"]}


def test_a_page_that_is_not_there_says_so():
    with pytest.raises(Problem) as refused:
        _identifier("no such")
    problem = refused.value
    assert (problem.status, problem.kind, problem.title, problem.detail) == (
        404, "not-found", "No such page", "No card or session with that id.")
