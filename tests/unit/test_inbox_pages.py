"""The inbox's page rules (services/gateway/inbox.py), pure: what a card shows of text from
outside, whose cards wait for whom, and where a login may send the browser next."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.gateway.inbox import duration, safe_next, shown_card, sorted_for
from services.gateway.users import User

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
