"""Provider tool-call ids are unique within a session after normalization (invariant 2)."""

import logging
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

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


# --- ids at the length limit (a report with a longer one would be refused as invalid) ----------

LIMIT = 256


def test_the_limit_is_the_one_a_step_report_enforces():
    from services.model_step.tool_call_ids import MAX_ID_LENGTH
    from shared.messages import ModelStepCompleted, ProviderAttempt

    assert MAX_ID_LENGTH == LIMIT

    def report(provider_id):
        call = ProposedToolCall.model_construct(provider_call_id=provider_id, name="Bash", arguments={})
        message = ModelStepCompleted(session_id="ses_1", step_id="stp_1", tool_calls=[call],
                                     attempts=[ProviderAttempt(number=1, status="completed", provider="p")])
        return ModelStepCompleted.model_validate_json(message.model_dump_json())

    report("x" * LIMIT)
    with pytest.raises(ValidationError):
        report("x" * (LIMIT + 1))


def test_a_reused_id_at_the_limit_gets_its_suffix_within_the_limit_and_stays_unique():
    at_limit = "a" * LIMIT
    normalizer = ToolCallIdNormalizer()
    got = reply(normalizer, at_limit, at_limit, at_limit) + reply(normalizer, at_limit)
    assert got[0] == at_limit
    assert got[1:] == ["a" * (LIMIT - 3) + "__2", "a" * (LIMIT - 3) + "__3", "a" * (LIMIT - 3) + "__4"]
    assert all(len(i) <= LIMIT for i in got) and len(set(got)) == len(got)
    # Ten and more need a longer suffix: still within the limit.
    many = reply(ToolCallIdNormalizer(), *[at_limit] * 12)
    assert many[-1] == "a" * (LIMIT - 4) + "__12" and len(set(many)) == 12
    assert all(len(i) <= LIMIT for i in many)


def test_ids_that_differ_only_past_where_the_suffix_cuts_them_still_get_unique_ids():
    # Two ids at the limit that share all but their last characters: cut short, their
    # suffixed forms would collide, so the smallest free n differs.
    first, second = "b" * (LIMIT - 1) + "1", "b" * (LIMIT - 1) + "2"
    normalizer = ToolCallIdNormalizer([first, second])
    got = reply(normalizer, first, second, first)
    assert got == ["b" * (LIMIT - 3) + "__2", "b" * (LIMIT - 3) + "__3", "b" * (LIMIT - 3) + "__4"]


def test_a_suffixed_id_within_the_limit_that_the_provider_already_used_is_skipped():
    at_limit = "c" * LIMIT
    taken = "c" * (LIMIT - 3) + "__2"
    assert reply(ToolCallIdNormalizer(), at_limit, taken, at_limit) == [at_limit, taken, "c" * (LIMIT - 3) + "__3"]


def test_an_id_past_the_limit_is_cut_to_it():
    # Stored calls have no limit of their own (a report never carries a longer one).
    past = TranscriptCall(call_id="call_1", provider_call_id="d" * (LIMIT + 40), name="Bash", arguments={})
    normalizer = ToolCallIdNormalizer()
    assert ids(normalizer.normalize([past])) == ["d" * LIMIT]
    normalizer.commit()
    assert ids(normalizer.normalize([past])) == ["d" * (LIMIT - 3) + "__2"]


def test_ids_at_the_limit_are_the_same_on_every_retry_of_an_attempt():
    at_limit = "e" * LIMIT
    normalizer = ToolCallIdNormalizer([at_limit])
    first_try = ids(normalizer.normalize(proposed(at_limit, at_limit)))
    normalizer.rollback()
    retry = ids(normalizer.normalize(proposed(at_limit, at_limit)))
    normalizer.commit()
    assert first_try == retry == ["e" * (LIMIT - 3) + "__2", "e" * (LIMIT - 3) + "__3"]
    # And the same stateless normalizer, built again from the stored transcript, agrees.
    again = ToolCallIdNormalizer([at_limit])
    assert ids(again.normalize(proposed(at_limit, at_limit))) == first_try


@given(st.lists(st.sampled_from(["f" * LIMIT, "f" * (LIMIT - 1) + "g", "f" * (LIMIT + 5), "f" * (LIMIT - 3) + "__2",
                                 "Bash_0", "Bash_0__2"]), max_size=12),
       st.lists(st.sampled_from(["f" * LIMIT, "Bash_0", "f" * (LIMIT - 3) + "__3"]), max_size=4))
def test_normalized_ids_are_always_unique_and_within_the_limit(raw, claimed):
    normalizer = ToolCallIdNormalizer(claimed)
    calls = [TranscriptCall(call_id=f"call_{n}", provider_call_id=r, name="Bash", arguments={})
             for n, r in enumerate(raw)]
    got = ids(normalizer.normalize(calls))
    assert all(len(i) <= LIMIT for i in got)
    assert len(set(got)) == len(got) and not set(got) & set(claimed)
