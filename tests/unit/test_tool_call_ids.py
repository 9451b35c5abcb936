"""Provider tool-call ids are unique within a session after normalization (invariant 2)."""

import logging
import re

from services.model_step.tool_call_ids import ToolCallIdNormalizer, unique_wire_ids
from shared.messages import ProposedToolCall, TranscriptCall, TranscriptEntry


def proposed(*ids):
    return [ProposedToolCall(provider_call_id=i, name="Bash", arguments={"n": n}) for n, i in enumerate(ids)]


def ids(calls):
    return [c.provider_call_id for c in calls]


def reply(normalizer, *raw):
    calls = normalizer.normalize(proposed(*raw))
    normalizer.commit()
    return ids(calls)


def test_unique_ids_pass_through_unchanged():
    normalizer = ToolCallIdNormalizer()
    calls = proposed("call_a", "call_b")
    assert normalizer.normalize(calls) == calls
    normalizer.commit()
    assert reply(normalizer, "call_c") == ["call_c"]


def test_an_id_repeated_across_responses_gets_the_smallest_free_suffix():
    normalizer = ToolCallIdNormalizer()
    assert reply(normalizer, "Bash_0", "Bash_1") == ["Bash_0", "Bash_1"]
    assert reply(normalizer, "Bash_0") == ["Bash_0__2"]
    assert reply(normalizer, "Bash_0", "Bash_1") == ["Bash_0__3", "Bash_1__2"]


def test_an_id_repeated_within_one_response_is_rewritten_too():
    normalizer = ToolCallIdNormalizer()
    assert reply(normalizer, "Bash_0", "Bash_0", "Bash_0") == ["Bash_0", "Bash_0__2", "Bash_0__3"]


def test_a_suffixed_id_the_provider_already_used_is_skipped():
    normalizer = ToolCallIdNormalizer()
    assert reply(normalizer, "x", "x__2", "x") == ["x", "x__2", "x__3"]


def test_only_the_id_changes():
    [call] = ToolCallIdNormalizer(["Bash_0"]).normalize(proposed("Bash_0"))
    assert (call.provider_call_id, call.name, call.arguments) == ("Bash_0__2", "Bash", {"n": 0})


def test_a_normalizer_seeded_from_a_restored_transcript_knows_every_id_it_holds():
    transcript = [
        TranscriptEntry(role="user", text="go"),
        TranscriptEntry(role="assistant", tool_calls=[
            TranscriptCall(call_id="call_1", provider_call_id="Bash_0", name="Bash", arguments={}),
            TranscriptCall(call_id="call_2", provider_call_id="Bash_1", name="Bash", arguments={}),
        ]),
        TranscriptEntry(role="tool", call_id="call_1", provider_call_id="Bash_0", text="ok", closure="output"),
        TranscriptEntry(role="tool", call_id="call_2", provider_call_id="Bash_1", text="ok", closure="output"),
        TranscriptEntry(role="assistant", tool_calls=[
            TranscriptCall(call_id="call_3", provider_call_id="Bash_0__2", name="Bash", arguments={}),
        ]),
        # A tool entry's id alone claims nothing: only calls the model made do.
        TranscriptEntry(role="tool", call_id="call_3", provider_call_id="orphan_9", text="ok", closure="output"),
    ]
    normalizer = ToolCallIdNormalizer.from_transcript(transcript)
    assert reply(normalizer, "Bash_0", "Bash_1", "Bash_2", "orphan_9") == ["Bash_0__3", "Bash_1__2", "Bash_2", "orphan_9"]


def test_a_failed_attempts_claims_are_rolled_back_so_the_retry_gets_the_same_ids():
    normalizer = ToolCallIdNormalizer(["Bash_0"])
    first_try = ids(normalizer.normalize(proposed("Bash_0", "Bash_1")))
    normalizer.rollback()
    retry = ids(normalizer.normalize(proposed("Bash_0", "Bash_1")))
    normalizer.commit()
    assert first_try == retry == ["Bash_0__2", "Bash_1"]
    # Committed claims survive a later rollback.
    normalizer.normalize(proposed("Bash_0"))
    normalizer.rollback()
    assert reply(normalizer, "Bash_0", "Bash_1") == ["Bash_0__3", "Bash_1__2"]


def test_calls_stored_with_repeated_ids_go_on_the_wire_with_unique_ones_and_their_results_follow():
    def asked(call_id, provider_id):
        return TranscriptEntry(role="assistant", tool_calls=[
            TranscriptCall(call_id=call_id, provider_call_id=provider_id, name="Bash", arguments={})])

    def result(call_id, provider_id):
        return TranscriptEntry(role="tool", call_id=call_id, provider_call_id=provider_id, text="ok", closure="output")

    legacy = [
        TranscriptEntry(role="user", text="go"),
        asked("call_1", "Bash_0"), result("call_1", "Bash_0"),
        asked("call_2", "Bash_0"), result("call_2", "Bash_0"),
        # A result from before Signoff minted call ids: it follows its call by position.
        asked("call_3", "Bash_0"), TranscriptEntry(role="tool", provider_call_id="Bash_0", text="ok", closure="output"),
    ]
    wire = unique_wire_ids(legacy)
    assert [(e.role, e.provider_call_id or [c.provider_call_id for c in e.tool_calls]) for e in wire] == [
        ("user", []), ("assistant", ["Bash_0"]), ("tool", "Bash_0"), ("assistant", ["Bash_0__2"]),
        ("tool", "Bash_0__2"), ("assistant", ["Bash_0__3"]), ("tool", "Bash_0__3")]
    assert unique_wire_ids(wire) == wire
    assert unique_wire_ids(legacy[:3]) == legacy[:3]


def asked(*calls):
    """An assistant message; each call is (call id, provider id)."""
    return TranscriptEntry(role="assistant", tool_calls=[
        TranscriptCall(call_id=call_id, provider_call_id=provider_id, name="Bash", arguments={})
        for call_id, provider_id in calls])


def result(call_id, provider_id):
    return TranscriptEntry(role="tool", call_id=call_id, provider_call_id=provider_id, text="ok", closure="output")


def legacy_result(provider_id):
    """A result stored before Signoff minted call ids."""
    return TranscriptEntry(role="tool", provider_call_id=provider_id, text="ok", closure="output")


def wire_shape(transcript):
    return [[c.provider_call_id for c in e.tool_calls] if e.role == "assistant" else (e.role, e.call_id,
                                                                                       e.provider_call_id)
            for e in transcript]


def test_results_follow_their_calls_new_ids_across_several_calls_per_assistant_message():
    transcript = [
        TranscriptEntry(role="user", text="go"),
        asked(("call_1", "Bash_0"), ("call_2", "Bash_1")),
        result("call_1", "Bash_0"), result("call_2", "Bash_1"),
        asked(("call_3", "Bash_0"), ("call_4", "Bash_1"), ("call_5", "Bash_0")),
        # Not in call order: each result follows its own call, not a position.
        result("call_5", "Bash_0"), result("call_3", "Bash_0"), result("call_4", "Bash_1"),
    ]
    assert wire_shape(unique_wire_ids(transcript)) == [
        ("user", None, None),
        ["Bash_0", "Bash_1"],
        ("tool", "call_1", "Bash_0"), ("tool", "call_2", "Bash_1"),
        ["Bash_0__2", "Bash_1__2", "Bash_0__3"],
        ("tool", "call_5", "Bash_0__3"), ("tool", "call_3", "Bash_0__2"), ("tool", "call_4", "Bash_1__2"),
    ]


def test_results_without_call_ids_follow_their_calls_new_ids_by_position_in_the_run_after_the_message():
    transcript = [
        asked(("call_1", "Bash_0"), ("call_2", "Bash_1")),
        legacy_result("Bash_0"), legacy_result("Bash_1"),
        asked(("call_3", "Bash_0"), ("call_4", "Bash_1"), ("call_5", "Bash_0")),
        legacy_result("Bash_0"), legacy_result("Bash_1"), legacy_result("Bash_0"),
    ]
    assert wire_shape(unique_wire_ids(transcript)) == [
        ["Bash_0", "Bash_1"],
        ("tool", None, "Bash_0"), ("tool", None, "Bash_1"),
        ["Bash_0__2", "Bash_1__2", "Bash_0__3"],
        ("tool", None, "Bash_0__2"), ("tool", None, "Bash_1__2"), ("tool", None, "Bash_0__3"),
    ]


def test_a_result_without_a_call_id_that_no_call_accounts_for_keeps_the_id_it_has():
    transcript = [
        legacy_result("Bash_0"),  # before any call
        asked(("call_1", "Bash_0")),
        asked(("call_2", "Bash_0")),
        legacy_result("Bash_0"), legacy_result("Bash_7"),  # one result more than the message has calls
        asked(("call_3", "Bash_0")),
        TranscriptEntry(role="user", text="meanwhile"),
        legacy_result("Bash_0"),  # not in the run right after the message
    ]
    assert wire_shape(unique_wire_ids(transcript)) == [
        ("tool", None, "Bash_0"),
        ["Bash_0"],
        ["Bash_0__2"],
        ("tool", None, "Bash_0__2"), ("tool", None, "Bash_7"),
        ["Bash_0__3"],
        ("user", None, None),
        ("tool", None, "Bash_0"),
    ]


def words(message):
    return set(re.findall(r"\w+", message))


def test_a_rewrite_is_logged_with_the_session_the_reused_id_and_its_new_id(caplog):
    transcript = [asked(("call_1", "Bash_0"))]
    with caplog.at_level(logging.INFO, logger="signoff.model_step.ids"):
        ToolCallIdNormalizer(["Bash_0"], session_id="ses_1").normalize(proposed("Bash_0", "Bash_1"))
        ToolCallIdNormalizer.from_transcript(transcript, session_id="ses_2").normalize(proposed("Bash_0"))
        unique_wire_ids(transcript + [asked(("call_2", "Bash_0"))], session_id="ses_3")
    assert len(caplog.records) == 3
    for record, session in zip(caplog.records, ("ses_1", "ses_2", "ses_3")):
        assert words(record.getMessage()) >= {session, "Bash_0", "Bash_0__2"}


def test_nothing_is_logged_when_no_id_is_rewritten(caplog):
    with caplog.at_level(logging.INFO, logger="signoff.model_step.ids"):
        ToolCallIdNormalizer(session_id="ses_1").normalize(proposed("Bash_0", "Bash_1"))
        unique_wire_ids([asked(("call_1", "Bash_0"))], session_id="ses_1")
    assert caplog.records == []
