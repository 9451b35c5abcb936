"""How the command line tells a turn's end and a request's escalation (items
3 and 4): pure rendering, every outside word redacted and shown by `visible`."""

from datetime import UTC, datetime, timedelta, timezone

from services.operations.cards import card_lines, ended_story, escalation_line, turn_outcome
from shared.audit import digest_of, story
from shared.ledger.tables import Turn

STARTED = datetime(2026, 12, 1, 18, 0, 0, 250000, tzinfo=UTC)
ENDED = datetime(2026, 12, 1, 18, 0, 7, 900000, tzinfo=UTC)


def turn(status: str, **fields) -> Turn:
    return Turn(id="trn_1", session_id="ses_1", status=status, created_at=STARTED,
                completed_at=None if status == "running" else ENDED, **fields)


def test_a_session_without_a_turn_says_so():
    assert turn_outcome(None) == "no turn yet"


def test_a_running_turn_says_since_when_and_a_completed_one_when_it_ended_without_a_reason():
    assert turn_outcome(turn("running")) == "last turn trn_1: running since 2026-12-01 18:00:00 UTC"
    assert turn_outcome(turn("completed")) == "last turn trn_1: completed at 2026-12-01 18:00:07 UTC"


def test_a_failed_turn_says_its_code_and_its_text():
    failed = turn("failed", reason_code="provider_failed", reason_text="openai: HTTP 500: upstream exploded")
    assert turn_outcome(failed) == (
        "last turn trn_1: failed at 2026-12-01 18:00:07 UTC: provider_failed: openai: HTTP 500: upstream exploded"
    )
    bounded = turn("failed", reason_code="step_limit", reason_text="The turn reached its bound of 5 model steps")
    assert turn_outcome(bounded).endswith(": step_limit: The turn reached its bound of 5 model steps")


def test_a_failure_text_is_redacted_then_shown_without_its_escapes_and_cut():
    said = "HTTP 500: \x1b[2J\u202egone; Authorization: Bearer abcdef0123456789 " + "x" * 5000
    line = turn_outcome(turn("failed", reason_code="provider_failed\x1b[31m", reason_text=said))
    assert "\x1b" not in line and "\u202e" not in line
    assert "provider_failed\\x1b[31m: HTTP 500: \\x1b[2J\\u202egone" in line
    assert "abcdef0123456789" not in line and "***redacted***" in line
    assert "more characters)" in line and len(line) < 1200


def test_a_cancelled_turn_says_who_cancelled_it_and_why():
    cancelled = turn("cancelled", ended_by="alice", reason_text="changed my mind \x1b[31m")
    assert turn_outcome(cancelled) == (
        "last turn trn_1: cancelled at 2026-12-01 18:00:07 UTC by alice: changed my mind \\x1b[31m"
    )
    assert turn_outcome(turn("cancelled", ended_by="bob")).endswith(" by bob")


def test_a_failed_turn_from_before_reasons_were_kept_says_so_instead_of_an_empty_reason():
    assert turn_outcome(turn("failed")) == (
        "last turn trn_1: failed at 2026-12-01 18:00:07 UTC (its reason was not recorded: the turn ended "
        "before the ledger kept reasons)"
    )


def ended_entry(**detail) -> dict:
    return {"kind": "turn.ended", "subject": "trn_1", "actor": None, "message_id": None, "detail": detail}


def test_audit_show_adds_a_failures_text_only_when_it_is_the_one_the_entry_digested():
    text = "openai: HTTP 500: upstream \x1b[2J exploded"
    entry = ended_entry(status="failed", reason_code="provider_failed", reason_digest=digest_of(text))
    failed = turn("failed", reason_code="provider_failed", reason_text=text)
    assert ended_story(entry, failed) == (
        "turn trn_1 failed (provider_failed): openai: HTTP 500: upstream \\x1b[2J exploded"
    )
    altered = turn("failed", reason_code="provider_failed", reason_text="all is well")
    assert ended_story(entry, altered) == (
        "turn trn_1 failed (provider_failed) (the turn's reason text on record does not match this entry's digest)"
    )
    assert ended_story(entry, None) == "turn trn_1 failed (provider_failed)"
    assert ended_story(entry, turn("failed")) == "turn trn_1 failed (provider_failed)"


def test_audit_tells_a_cancellation_by_whom_and_why_and_a_completion_plainly():
    assert story(ended_entry(status="cancelled", by="alice", reason="changed my mind")) == (
        "turn trn_1 cancelled by alice: changed my mind"
    )
    assert story(ended_entry(status="cancelled", by="alice", reason="")) == "turn trn_1 cancelled by alice"
    completed = ended_entry(status="completed", text_digest=digest_of("Done."))
    assert ended_story(completed, turn("completed")) == "turn trn_1 completed"


def test_a_cancellation_reason_in_audit_show_is_redacted_and_shown_by_visible():
    entry = ended_entry(status="cancelled", by="alice", reason="token Bearer abcdef0123456789 \x1b[31m")
    shown = ended_story(entry, turn("cancelled", ended_by="alice"))
    assert "abcdef0123456789" not in shown and "\x1b" not in shown and "\\x1b[31m" in shown


def test_an_escalation_says_when_in_utc_and_to_whom_by_visible_names():
    at = datetime(2026, 12, 1, 19, 30, 5, 999, tzinfo=timezone(timedelta(hours=1)))
    assert escalation_line(at, ["lee", "sam"]) == "2026-12-01 18:30:05 UTC to lee, sam, who may approve it as well"
    assert escalation_line(at, ["l\x1b[2Jee"]).startswith("2026-12-01 18:30:05 UTC to l\\x1b[2Jee,")
    assert escalation_line(at, None) == "2026-12-01 18:30:05 UTC to (not recorded), who may approve it as well"


CARD = {"label": "Post", "tool": "post_escalated", "effect": "outward", "target": "POST /escalated",
        "arguments": {"message": "hi"}}


def test_a_card_says_it_was_escalated_above_its_digest_and_only_when_it_was():
    plain = card_lines("apr_1", CARD, "hmac-sha256:ab")
    assert not any("escalated:" in line for line in plain)
    escalated = card_lines("apr_1", CARD, "hmac-sha256:ab", (ENDED, ["lee"]))
    assert escalated[:-1] == [*plain[:-1], "  │ escalated: 2026-12-01 18:00:07 UTC to lee, who may approve it as well"]
    assert escalated[-1] == plain[-1] == "  └ digest:    hmac-sha256:ab"
