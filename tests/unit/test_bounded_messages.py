"""Bounded messages (docs/design.md, "Bounded messages"), as pure rules: a step names its
transcript by length and digest, a result too large for a message stays in the claim,
the model reads a long result truncated with a marker, and text a service wrote is
recorded without NUL."""

import pytest

from services.approval_ledger import domain
from services.approval_ledger.domain import ClaimOnRecord
from services.approval_ledger.store import storable
from services.model_step.handlers import request_model_step
from services.model_step.replies import ProviderReply
from services.tool_executor.handlers import report_of
from services.tool_executor.tools import ToolResult
from shared.ledger.transcripts import EMPTY, TranscriptMismatch, checked, digest_of, extended
from shared.messages import ExecuteTool, ToolDescription, TranscriptEntry, encode
from tests.transcript_store import HeldTranscripts

TOOLS = [ToolDescription(name="t", description="", parameters={"type": "object"})]


def entry(text, role="user"):
    return TranscriptEntry(role=role, text=text).model_dump(mode="json")


def test_the_transcript_digest_is_a_chain_that_any_change_to_any_entry_breaks():
    entries = [entry("a"), entry("b", "assistant"), entry("c")]
    assert digest_of([]) == EMPTY
    assert digest_of(entries) == extended(extended(extended(EMPTY, entries[0]), entries[1]), entries[2])
    assert digest_of(entries[:2]) != digest_of(entries)
    assert digest_of([entries[1], entries[0], entries[2]]) != digest_of(entries)
    assert digest_of([entries[0], entry("B", "assistant"), entries[2]]) != digest_of(entries)
    # Key order does not matter (a store may give JSON back in any order); values do.
    assert digest_of([dict(reversed(list(e.items()))) for e in entries]) == digest_of(entries)


def test_a_step_gets_exactly_the_entries_it_names_or_a_mismatch():
    entries = [entry("a"), entry("b", "assistant")]
    assert [e.text for e in checked(entries, 2, digest_of(entries))] == ["a", "b"]
    with pytest.raises(TranscriptMismatch, match="holds 1 of the 2"):
        checked(entries[:1], 2, digest_of(entries))
    with pytest.raises(TranscriptMismatch, match="digest"):
        checked([entries[0], entry("c", "assistant")], 2, digest_of(entries))
    # A row no entry can be read from fails the same way on every delivery: a mismatch, reported.
    broken = [{"role": "system", "text": "x"}]
    with pytest.raises(TranscriptMismatch, match="not a transcript entry"):
        checked(broken, 1, digest_of(broken))


class Provider:
    name = "fake"

    def __init__(self):
        self.transcripts = []

    async def complete(self, session_id, transcript, tools):
        self.transcripts.append(transcript)
        return ProviderReply("done", [])


async def test_a_step_reads_only_the_prefix_it_names_though_the_session_grew_since():
    held, provider, reports = HeldTranscripts(), Provider(), []
    request = held.step("ses_1", [TranscriptEntry(role="user", text="hi")], provider="fake", tools=TOOLS)
    # The session went on after the step was asked for (a redelivery comes later).
    held.sessions["ses_1"].append(entry("later"))

    async def report(message):
        reports.append(message)

    await request_model_step({"fake": provider}, held, report, request)
    assert [[e.text for e in t] for t in provider.transcripts] == [["hi"]]
    assert reports[0].error is None


async def test_a_step_whose_transcript_is_not_the_one_named_fails_reported_without_calling_the_provider():
    held, provider, reports = HeldTranscripts(), Provider(), []
    request = held.step("ses_1", [TranscriptEntry(role="user", text="hi")], provider="fake", tools=TOOLS)
    held.sessions["ses_1"][0] = entry("changed")

    async def report(message):
        reports.append(message)

    await request_model_step({"fake": provider}, held, report, request)
    assert provider.transcripts == []
    [failed] = reports
    assert failed.error.startswith("the model-step could not read the step's transcript: the transcript's digest")
    assert [a.status for a in failed.attempts] == ["failed"]


def test_a_result_too_large_for_a_message_is_reported_as_kept_in_the_claim():
    command = ExecuteTool(session_id="ses_1", call_id="call_1", tool="t", arguments={}, idempotency_key="idk_1")
    small = report_of(command, ToolResult("output", "x" * 1000), 10_000)
    assert (small.output, small.output_in_claim) == ("x" * 1000, False)
    large = report_of(command, ToolResult("output", "x" * 20_000), 10_000)
    assert (large.output, large.output_in_claim, large.outcome) == (None, True, "output")
    assert len(encode(large)) < 10_000
    # A tool's error of any length fits the report's limit for it.
    failed = report_of(command, ToolResult("error", error="e" * 10_000), 100_000)
    assert failed.error == "e" * 4000


def test_the_ledger_closes_a_call_with_the_output_its_claim_kept_whatever_the_report_carries():
    kept = ClaimOnRecord("finished", "output", {"output": "whole", "error": None})
    assert domain.closure_of_claim(kept) == domain.ClosureOnRecord("output", output="whole")


def test_the_model_reads_a_long_result_truncated_with_a_marker_saying_where_the_whole_is():
    short = domain.closure_entry(call_id="call_1", provider_call_id="p", tool="t", kind="output", output="abc",
                                 reason_text=None, limit=3)
    assert short.text == "abc"
    long = domain.closure_entry(call_id="call_1", provider_call_id="p", tool="t", kind="output",
                                output="abcdefgh", reason_text=None, limit=3)
    assert long.text == ("abc\n[Signoff truncated this result: the first 3 of 8 characters are shown; the whole "
                         "output is kept in the ledger (call call_1).]")


def test_text_a_service_wrote_is_recorded_without_nul():
    assert storable("a\x00b") == "a\ufffdb"
    assert storable("plain") == "plain"
    assert storable({"json": "a\x00b"}) == {"json": "a\x00b"}, "JSON columns escape it themselves"
    assert storable(5) == 5
