"""The transcript guard heals what a strict provider would reject (invariant 3)."""

import logging
import re

from services.model_step.transcript_guard import NEVER_CLOSED, heal
from shared.messages import TranscriptCall, TranscriptEntry


def user(text):
    return TranscriptEntry(role="user", text=text)


def call(n, provider_id=None):
    return TranscriptCall(call_id=f"call_{n}", provider_call_id=provider_id or f"p{n}", name="post", arguments={"n": n})


def asks(*calls, text=""):
    return TranscriptEntry(role="assistant", text=text, tool_calls=list(calls))


def result(n, text="ok", closure="output", provider_id=None):
    return TranscriptEntry(role="tool", call_id=f"call_{n}", provider_call_id=provider_id or f"p{n}",
                           text=text, closure=closure)


def shape(transcript):
    """role and call id of each entry, and whether a tool result is the guard's own."""
    out = []
    for e in transcript:
        if e.role == "tool":
            out.append(("tool", e.call_id, "healed" if e.text == NEVER_CLOSED else e.closure))
        else:
            out.append((e.role, [c.call_id for c in e.tool_calls]))
    return out


def test_a_healthy_transcript_passes_through_unchanged_and_quietly(caplog):
    transcript = [
        user("post twice"),
        asks(call(1), call(2), text="posting"),
        result(1),
        result(2, closure="denied", text="The user denied this tool call."),
        TranscriptEntry(role="user", text="[ann, with their decision] not that one"),
        TranscriptEntry(role="assistant", text="Done."),
        user("again"),
        asks(call(3)),
        result(3, closure="error", text="Error: boom"),
    ]
    with caplog.at_level(logging.WARNING):
        assert heal(transcript, "ses_1") == transcript
    assert caplog.records == []


def test_a_call_without_a_result_gets_an_error_result_right_after_its_message(caplog):
    transcript = [user("post"), asks(call(1)), user("hello?")]
    with caplog.at_level(logging.WARNING):
        healed = heal(transcript, "ses_1")
    assert shape(healed) == [("user", []), ("assistant", ["call_1"]), ("tool", "call_1", "healed"), ("user", [])]
    closing = healed[2]
    assert closing.closure == "error" and closing.provider_call_id == "p1"
    assert closing.text.startswith("Error: this tool call was never closed;")
    [warning] = caplog.records
    assert "ses_1" in warning.getMessage() and "call_1" in warning.getMessage()


def test_a_trailing_call_without_a_result_is_closed_too():
    healed = heal([user("post"), asks(call(1))], "ses_1")
    assert shape(healed)[-1] == ("tool", "call_1", "healed")


def test_a_result_separated_from_its_call_by_a_user_message_is_moved_next_to_it(caplog):
    transcript = [user("post"), asks(call(1)), user("channel context"), result(1, text="posted")]
    with caplog.at_level(logging.WARNING):
        healed = heal(transcript, "ses_1")
    assert shape(healed) == [("user", []), ("assistant", ["call_1"]), ("tool", "call_1", "output"), ("user", [])]
    assert healed[2].text == "posted"  # the real result, not a made-up error
    assert "moved" in caplog.records[0].getMessage()


def test_several_calls_with_partial_results_get_exactly_one_result_each_in_call_order():
    transcript = [
        user("three things"),
        asks(call(1), call(2), call(3)),
        result(3, text="third"),
        result(1, text="first"),
        user("and then"),
        TranscriptEntry(role="assistant", text="ok"),
    ]
    healed = heal(transcript, "ses_1")
    assert shape(healed) == [
        ("user", []),
        ("assistant", ["call_1", "call_2", "call_3"]),
        ("tool", "call_1", "output"),
        ("tool", "call_2", "healed"),
        ("tool", "call_3", "output"),
        ("user", []),
        ("assistant", []),
    ]
    assert [e.text for e in healed[2:5:2]] == ["first", "third"]


def test_a_result_for_no_call_and_a_second_result_for_one_call_are_dropped(caplog):
    transcript = [
        user("post"),
        result(9, text="orphan before any call"),
        asks(call(1)),
        result(1, text="first"),
        result(1, text="second"),
        result(7, text="orphan"),
    ]
    with caplog.at_level(logging.WARNING):
        healed = heal(transcript, "ses_1")
    assert shape(healed) == [("user", []), ("assistant", ["call_1"]), ("tool", "call_1", "output")]
    assert healed[2].text == "first"
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 3


def test_a_tool_entry_without_a_closure_kind_is_not_a_result():
    transcript = [user("post"), asks(call(1)), result(1, closure=None, text="still running")]
    assert shape(heal(transcript, "ses_1"))[2:] == [("tool", "call_1", "healed")]


def test_results_from_before_call_ids_are_matched_by_provider_id_preferring_the_adjacent_one():
    # An old transcript: a provider that reused `Bash_0`, results without Signoff's call ids.
    legacy = dict(call_id=None, closure="output")
    transcript = [
        user("go"),
        asks(call(1, "Bash_0")),
        TranscriptEntry(role="tool", provider_call_id="Bash_0", text="one", **legacy),
        asks(call(2, "Bash_0")),
        TranscriptEntry(role="tool", provider_call_id="Bash_0", text="two", **legacy),
    ]
    healed = heal(transcript, "ses_1")
    assert [e.text for e in healed] == ["go", "", "one", "", "two"]


def test_healing_is_pure_and_the_same_every_time():
    transcript = [user("post"), asks(call(1), call(2)), user("hm"), result(2)]
    stored = [entry.model_dump() for entry in transcript]
    healed = heal(transcript, "s")
    assert shape(healed) == [
        ("user", []), ("assistant", ["call_1", "call_2"]), ("tool", "call_1", "healed"), ("tool", "call_2", "output"),
        ("user", [])]
    assert heal(transcript, "s") == healed  # the same broken transcript heals the same way on every request
    assert [entry.model_dump() for entry in transcript] == stored  # the stored transcript is untouched
    assert heal(healed, "s") == healed  # and what it gives is healthy


def legacy_result(provider_id, text):
    """A result stored before Signoff minted call ids: only the provider's id ties it to a call."""
    return TranscriptEntry(role="tool", call_id=None, provider_call_id=provider_id, text=text, closure="output")


def test_a_result_without_a_call_id_closes_only_a_call_with_the_same_provider_id():
    transcript = [
        user("go"),
        asks(call(1, "Bash_0")),
        legacy_result("Bash_1", "someone else's"),
        TranscriptEntry(role="tool", text="no ids at all", closure="output"),
    ]
    assert [e.text for e in heal(transcript, "ses_1")] == ["go", "", NEVER_CLOSED]


def test_a_result_with_a_call_id_closes_that_call_whatever_provider_id_it_carries():
    # A provider that reused `Bash_0` for both calls; the results carry Signoff's call ids.
    transcript = [
        user("go"),
        asks(call(1, "Bash_0"), call(2, "Bash_0")),
        result(2, text="second", provider_id="Bash_0"),
        result(1, text="first", provider_id="Bash_0"),
    ]
    healed = heal(transcript, "ses_1")
    assert [(e.call_id, e.text) for e in healed[2:]] == [("call_1", "first"), ("call_2", "second")]


def test_a_result_without_a_call_id_next_to_a_later_call_with_the_same_provider_id_stays_with_it():
    transcript = [
        user("go"),
        asks(call(1, "Bash_0")),  # never closed
        user("hm"),
        asks(call(2, "Bash_0")),
        legacy_result("Bash_0", "two"),
    ]
    assert [e.text for e in heal(transcript, "ses_1")] == ["go", "", NEVER_CLOSED, "hm", "", "two"]


def test_a_result_in_a_later_calls_run_that_names_an_earlier_call_is_moved_back_to_it_and_the_later_keeps_its_own():
    transcript = [
        user("go"),
        asks(call(1)),
        user("hm"),
        asks(call(2)),
        result(1, text="one"),
        result(2, text="two"),
    ]
    assert [e.text for e in heal(transcript, "ses_1")] == ["go", "", "one", "hm", "", "two"]


def words(message):
    return set(re.findall(r"\w+", message))


def test_every_insertion_move_and_drop_is_logged_with_the_session_and_what_it_concerns(caplog):
    transcript = [
        user("post"),
        asks(call(1), call(2)),
        user("channel context"),
        result(2),  # moved next to its call
        result(9, closure="denied"),  # closes no call: dropped
    ]  # and call_1 has no result: one is inserted
    with caplog.at_level(logging.WARNING):
        heal(transcript, "ses_7")
    messages = {kind: [r.getMessage() for r in caplog.records if kind in r.getMessage()]
                for kind in ("no result", "moved", "dropped")}
    assert len(caplog.records) == 3 and all(len(found) == 1 for found in messages.values())
    assert words(messages["no result"][0]) >= {"ses_7", "call_1", "p1", "post"}
    assert words(messages["moved"][0]) >= {"ses_7", "call_2", "p2"}
    assert words(messages["dropped"][0]) >= {"ses_7", "4", "call_9", "p9", "denied"}
