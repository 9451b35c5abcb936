"""The model-step handler always reports its step, once the provider was called: a
failed step with every attempt counted, never an exception that would have the step
redelivered and the provider called, and billed, again (invariant 7)."""

import pytest

from services.model_step import handlers
from services.model_step.handlers import request_model_step
from services.model_step.replies import MAX_TOKENS, ProviderError, ProviderReply
from tests.transcript_store import HeldTranscripts
from shared.messages import (
    ModelStepCompleted,
    ProposedToolCall,
    RequestModelStep,
    ToolDescription,
    TranscriptEntry,
    Usage,
    encode,
)

TOOLS = [ToolDescription(name="post_to_sink", description="Post.", parameters={"type": "object"})]


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(handlers, "BACKOFF_SECONDS", 0.0)


class Provider:
    """Answers from a list, one item per call: a reply is returned, an exception raised."""

    name = "fake"

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = 0

    async def complete(self, session_id, transcript, tools):
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def run(provider, *, report=None, max_bytes=None, transcript=None):
    reports = []

    async def collect(message):
        reports.append(message)

    transcripts = HeldTranscripts()
    request = transcripts.step("ses_1", transcript or [TranscriptEntry(role="user", text="hi")], provider="fake",
                               tools=TOOLS, step_id="stp_1")
    limit = {"max_bytes": max_bytes} if max_bytes is not None else {}
    await request_model_step({"fake": provider}, transcripts, report or collect, request, **limit)
    return reports


def accepted_by_the_ledger(report: ModelStepCompleted) -> ModelStepCompleted:
    return ModelStepCompleted.model_validate_json(encode(report))


def call(provider_id="c1", name="post_to_sink"):
    return ProposedToolCall(provider_call_id=provider_id, name=name, arguments={})


async def test_a_provider_that_raises_something_else_is_counted_per_call_and_the_step_fails_reported():
    provider = Provider(RuntimeError("boom"), KeyError("choices"), AttributeError("'str' has no 'get'"))
    [report] = await run(provider)
    assert provider.calls == 3
    assert [(a.number, a.status) for a in report.attempts] == [(1, "failed"), (2, "failed"), (3, "failed")]
    assert "RuntimeError: boom" in report.attempts[0].error and "AttributeError" in report.error
    accepted_by_the_ledger(report)


async def test_a_reply_whose_report_the_ledger_would_refuse_is_a_failed_attempt_with_its_usage():
    # A provider implementation that skipped validation: a name past the report's limit.
    bad = ProposedToolCall.model_construct(provider_call_id="c1", name="n" * 300, arguments={})
    provider = Provider(ProviderReply("", [bad], Usage(input_tokens=9, output_tokens=4)),
                        ProviderReply("ok", [call()], Usage(input_tokens=10, output_tokens=5)))
    [report] = await run(provider)
    assert [(a.status, a.usage.input_tokens, a.usage.output_tokens) for a in report.attempts] == [
        ("failed", 9, 4), ("completed", 10, 5)]
    assert "unusable reply" in report.attempts[0].error
    assert report.error is None and [c.provider_call_id for c in accepted_by_the_ledger(report).tool_calls] == ["c1"]


async def test_usage_no_ledger_column_can_hold_is_capped_and_garbage_counts_as_nothing():
    usage = Usage.model_construct(input_tokens=10**12, output_tokens=-5)
    [report] = await run(Provider(ProviderReply("ok", [], usage)))
    [attempt] = accepted_by_the_ledger(report).attempts
    assert (attempt.usage.input_tokens, attempt.usage.output_tokens) == (MAX_TOKENS, 0)
    failure = ProviderError("p: bad", retryable=False, usage=Usage.model_construct(input_tokens="x", output_tokens=3))
    [report] = await run(Provider(failure))
    [attempt] = accepted_by_the_ledger(report).attempts
    assert (attempt.usage.input_tokens, attempt.usage.output_tokens) == (0, 3)


async def test_a_reply_too_large_to_report_is_a_failed_attempt_and_the_failed_step_is_still_reported():
    huge = ProviderReply("x" * 10_000, [], Usage(input_tokens=3, output_tokens=2500))
    provider = Provider(huge, huge, huge)
    [report] = await run(provider, max_bytes=5_000)
    assert provider.calls == 3 and [a.status for a in report.attempts] == ["failed"] * 3
    assert "too large" in report.error and all(a.usage.output_tokens == 2500 for a in report.attempts)
    assert len(encode(report)) <= 5_000


async def test_a_reused_provider_id_at_the_length_limit_is_reported_within_it():
    at_limit = "x" * 256
    transcript = [
        TranscriptEntry(role="user", text="hi"),
        TranscriptEntry(role="assistant", tool_calls=[
            {"call_id": "call_1", "provider_call_id": at_limit, "name": "post_to_sink", "arguments": {}}]),
        TranscriptEntry(role="tool", call_id="call_1", provider_call_id=at_limit, text="ok", closure="output"),
    ]
    [report] = await run(Provider(ProviderReply("again", [call(at_limit)])), transcript=transcript)
    assert report.error is None
    [proposed] = accepted_by_the_ledger(report).tool_calls
    assert proposed.provider_call_id == "x" * 253 + "__2"


async def test_a_report_that_fails_to_publish_is_sent_again_without_calling_the_provider_again():
    sent = []

    async def flaky(message):
        sent.append(message)
        if len(sent) < 3:
            raise ConnectionError("broker away")

    provider = Provider(ProviderReply("ok", [call()]))
    await run(provider, report=flaky)
    assert provider.calls == 1
    assert len(sent) == 3 and len({m.message_id for m in sent}) == 1, "the same report, under one message id"


async def test_a_report_that_never_publishes_fails_the_delivery_after_its_tries():
    async def broken(message):
        raise ConnectionError("broker away")

    with pytest.raises(ConnectionError):
        await run(Provider(ProviderReply("ok")), report=broken)


async def test_a_request_that_cannot_be_prepared_is_reported_failed_without_calling_the_provider(monkeypatch):
    def broken_heal(transcript, session_id):
        raise ValueError("a transcript no rule foresaw")

    monkeypatch.setattr(handlers, "heal", broken_heal)
    provider = Provider(ProviderReply("never"))
    [report] = await run(provider)
    assert provider.calls == 0
    [attempt] = report.attempts
    assert attempt.status == "failed" and "could not prepare the request" in report.error
    accepted_by_the_ledger(report)


async def test_a_final_provider_error_is_not_retried_and_garbage_in_its_message_is_cut():
    provider = Provider(ProviderError("p: HTTP 401: " + "k" * 10_000, retryable=False))
    [report] = await run(provider)
    assert provider.calls == 1 and len(report.error) == 4000
    accepted_by_the_ledger(report)
