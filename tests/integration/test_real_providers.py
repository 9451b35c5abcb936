"""The OpenAI-compatible and Anthropic providers against strict loopback fakes
(tests/fake_providers.py), through the model-step handler, and one session on
the real services against a provider that renumbers its tool-call ids
(invariants 2, 3, 7)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import logging
import socket
from contextlib import asynccontextmanager

import pytest
from pydantic import SecretStr
from sqlalchemy import select

from shared.ledger.tables import Closure, ProviderAttemptRow, Session, ToolCall
from services.model_step import anthropic_messages, openai_compatible
from services.model_step.anthropic_messages import AnthropicProvider
from services.model_step.handlers import request_model_step
from services.model_step.openai_compatible import OpenAICompatibleProvider
from services.model_step.providers import build_provider, build_providers
from services.model_step.replies import ProviderError
from services.model_step.scripted import ScriptedProvider
from services.model_step.settings import ModelStepSettings
from shared.consuming import previous_deliveries
from shared.messages import (
    RequestModelStep,
    StartTurn,
    ToolDescription,
    TranscriptCall,
    TranscriptEntry,
    mint,
)
from shared.settings import PROJECT_ROOT
from tests.fake_providers import FakeAnthropic, FakeOpenAI, FakeReply
from tests.transcript_store import HeldTranscripts
from tests.harness import assert_nothing_left_in_any_queue, next_event, rows

KEY = "sk-test-4f1c9e2b7d-never-shown"
TOOLS = [ToolDescription(
    name="post_to_sink", description="Post a message.",
    parameters={"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
)]
POST = ("post_to_sink", {"message": "hello"})


@asynccontextmanager
async def served(kind: str, script: list[FakeReply], *, renumber: bool = False, client_key: str = KEY):
    """A strict fake server of this kind and a provider pointed at it."""
    if kind == "openai":
        fake = FakeOpenAI(script, api_key=KEY, renumber=renumber)
        provider = OpenAICompatibleProvider(base_url=fake.base_url, model="fake-gpt", api_key=SecretStr(client_key))
    else:
        fake = FakeAnthropic(script, api_key=KEY)
        provider = AnthropicProvider(base_url=fake.base_url, model="fake-claude", api_key=SecretStr(client_key))
    with fake:
        try:
            yield fake, provider
        finally:
            await provider.aclose()


async def step(provider, transcript: list[TranscriptEntry], session_id: str = "ses_1"):
    """Run the model-step handler once; the report it would publish."""
    reports = []

    async def report(message):
        reports.append(message)

    transcripts = HeldTranscripts()
    request = transcripts.step(session_id, transcript, provider=provider.name, tools=TOOLS)
    await request_model_step({provider.name: provider}, transcripts, report, request)
    [reported] = reports
    return reported


def user(text: str) -> TranscriptEntry:
    return TranscriptEntry(role="user", text=text)


def asked(*provider_ids: str, text: str = "") -> TranscriptEntry:
    return TranscriptEntry(role="assistant", text=text, tool_calls=[
        TranscriptCall(call_id=f"call_{p}_{i}", provider_call_id=p, name="post_to_sink", arguments={"message": p})
        for i, p in enumerate(provider_ids)
    ])


def results_for(entry: TranscriptEntry, text: str = "ok") -> list[TranscriptEntry]:
    """What the ledger writes after an assistant entry once its calls are closed."""
    return [TranscriptEntry(role="tool", call_id=c.call_id, provider_call_id=c.provider_call_id, text=text,
                            closure="output") for c in entry.tool_calls]


def as_ledger_would_store(reported, n: int) -> TranscriptEntry:
    return TranscriptEntry(role="assistant", text=reported.text, tool_calls=[
        TranscriptCall(call_id=f"call_{n}_{i}", provider_call_id=c.provider_call_id, name=c.name, arguments=c.arguments)
        for i, c in enumerate(reported.tool_calls)
    ])


both = pytest.mark.parametrize("kind", ["openai", "anthropic"])


# --- one step -------------------------------------------------------------------


@both
async def test_a_reply_with_a_tool_call_comes_back_with_the_usage_the_provider_reported(kind):
    async with served(kind, [FakeReply("Posting.", [POST])]) as (fake, provider):
        reported = await step(provider, [user("post hello")])
    assert reported.error is None and reported.text == "Posting."
    [call] = reported.tool_calls
    assert (call.name, call.arguments) == POST
    [attempt] = reported.attempts
    assert attempt.status == "completed" and attempt.provider == kind
    assert (attempt.usage.input_tokens, attempt.usage.output_tokens) == (fake.usages[0]["input"], fake.usages[0]["output"])
    assert attempt.usage.input_tokens > 0 and attempt.usage.output_tokens > 0


@both
async def test_429_and_500_are_retried_and_recorded_as_failed_attempts_before_the_completed_one(kind):
    async with served(kind, [FakeReply("Hello.")]) as (fake, provider):
        fake.fail_next(1, 429)
        fake.fail_next(1, 500)
        reported = await step(provider, [user("hi")])
    assert fake.statuses == [429, 500, 200]
    assert reported.error is None and reported.text == "Hello."
    assert [(a.number, a.status) for a in reported.attempts] == [(1, "failed"), (2, "failed"), (3, "completed")]
    assert "HTTP 429" in reported.attempts[0].error and "HTTP 500" in reported.attempts[1].error
    assert reported.attempts[2].usage.input_tokens == fake.usages[0]["input"]


@both
async def test_a_provider_that_keeps_failing_fails_the_step_with_every_attempt_recorded(kind):
    async with served(kind, [FakeReply("never")]) as (fake, provider):
        fake.fail_next(5, 503)
        reported = await step(provider, [user("hi")])
    assert fake.statuses == [503, 503, 503]
    assert reported.error and "HTTP 503" in reported.error and reported.tool_calls == []
    assert [a.status for a in reported.attempts] == ["failed"] * 3


async def test_a_provider_that_cannot_be_reached_is_retried_as_well():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    provider = OpenAICompatibleProvider(base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key=SecretStr(KEY))
    try:
        reported = await step(provider, [user("hi")])
    finally:
        await provider.aclose()
    assert [a.status for a in reported.attempts] == ["failed"] * 3
    assert "ConnectError" in reported.error


@both
async def test_a_rejected_key_is_not_retried_and_no_key_appears_in_errors_logs_or_reprs(kind, caplog):
    with caplog.at_level(logging.DEBUG):
        async with served(kind, [FakeReply("never")], client_key=KEY + "-wrong") as (fake, provider):
            reported = await step(provider, [user("hi")])
            shown = repr(provider)
    assert fake.statuses == [401]
    [attempt] = reported.attempts
    assert attempt.status == "failed" and "HTTP 401" in attempt.error
    assert KEY not in reported.model_dump_json() and KEY not in shown
    assert not [r for r in caplog.records if KEY in r.getMessage()]
    config = ModelStepSettings(openai_api_key=KEY, anthropic_api_key=KEY)
    assert KEY not in repr(config) and KEY not in str(config)


async def test_a_redelivered_step_counts_the_delivery_that_died_as_an_abandoned_attempt():
    token = previous_deliveries.set(1)
    try:
        async with served("openai", [FakeReply("Hello.")]) as (fake, provider):
            fake.fail_next(1, 500)
            reported = await step(provider, [user("hi")])
    finally:
        previous_deliveries.reset(token)
    assert [(a.number, a.status) for a in reported.attempts] == [(1, "abandoned"), (2, "failed"), (3, "completed")]
    assert reported.error is None and fake.statuses == [500, 200]


# --- invariant 3: the strict servers never see a dangling call --------------------


@both
async def test_a_dangling_call_the_strict_server_would_reject_is_healed_before_it_is_sent(kind):
    # An assistant call whose result was lost, then a new user turn (a broken stored transcript).
    broken = [user("post hello"), asked("p_lost"), user("are you there?")]
    async with served(kind, [FakeReply("ignored"), FakeReply("I am here.")]) as (fake, provider):
        with pytest.raises(ProviderError) as refused:
            await provider.complete("ses_1", broken, TOOLS)  # unguarded: the strict server refuses it
        assert "HTTP 400" in str(refused.value) and not refused.value.retryable
        reported = await step(provider, broken)
    assert fake.statuses == [400, 200]
    assert reported.error is None and reported.text == "I am here."
    sent = fake.requests[-1]["body"]["messages"]
    if kind == "openai":
        assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]
        assert sent[2]["tool_call_id"] == "p_lost"
        assert sent[2]["content"].startswith("Error: this tool call was never closed;")
    else:
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        result, note = sent[2]["content"]
        assert result["type"] == "tool_result" and result["tool_use_id"] == "p_lost" and result["is_error"]
        assert result["content"].startswith("Error: this tool call was never closed;")
        assert note == {"type": "text", "text": "are you there?"}


async def test_anthropic_gets_a_messages_results_and_the_note_after_them_in_one_user_message():
    call = asked("toolu_a", "toolu_b", text="Posting twice.")
    denied = TranscriptEntry(role="tool", call_id=call.tool_calls[1].call_id, provider_call_id="toolu_b",
                             text="The user denied this tool call. Reason: not now", closure="denied")
    transcript = [user("post twice"), call, results_for(call)[0], denied, user("[ann, with their decision] later")]
    async with served("anthropic", [FakeReply(), FakeReply("Understood.")]) as (fake, provider):
        reported = await step(provider, transcript)
    assert fake.statuses == [200] and reported.text == "Understood."
    sent = fake.requests[0]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [(b["type"], b.get("tool_use_id"), b.get("is_error")) for b in sent[2]["content"]] == [
        ("tool_result", "toolu_a", False), ("tool_result", "toolu_b", True), ("text", None, None)]
    assert anthropic_messages.to_messages(transcript) == sent


def test_openai_gets_tool_calls_as_functions_and_results_as_tool_messages():
    call = asked("call_x", text="")
    messages = openai_compatible.to_messages([user("hi"), call, *results_for(call, "done")])
    assert messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_x", "type": "function", "function": {"name": "post_to_sink", "arguments": '{"message": "call_x"}'}}]}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_x", "content": "done"}


# --- invariant 2: provider ids are unique per session ----------------------------


async def test_a_renumbering_server_gets_ids_that_stay_unique_across_steps():
    script = [FakeReply("one", [POST]), FakeReply("two", [POST, POST]), FakeReply("three", [POST]), FakeReply("done")]
    transcript = [user("go")]
    seen = []
    async with served("openai", script, renumber=True) as (fake, provider):
        for n in range(3):
            reported = await step(provider, transcript)
            assert reported.error is None, reported.error
            seen.append([c.provider_call_id for c in reported.tool_calls])
            stored = as_ledger_would_store(reported, n)
            transcript += [stored, *results_for(stored)]
        final = await step(provider, transcript)
    assert seen == [["Bash_0"], ["Bash_0__2", "Bash_1"], ["Bash_0__3"]]
    assert final.text == "done" and fake.bad_requests == []


async def test_ids_repeated_in_a_transcript_stored_before_normalization_are_made_unique_on_the_wire():
    first, second = asked("Bash_0"), asked("Bash_0")
    second = second.model_copy(update={"tool_calls": [second.tool_calls[0].model_copy(update={"call_id": "call_two"})]})
    legacy = [user("go"), first, *results_for(first, "one"), user("again"), second, *results_for(second, "two")]
    async with served("openai", [FakeReply(), FakeReply(), FakeReply("ok", [POST])], renumber=True) as (fake, provider):
        reported = await step(provider, legacy)
    assert fake.statuses == [200]
    sent = fake.requests[0]["body"]["messages"]
    assert [m.get("tool_call_id") or [c["id"] for c in m.get("tool_calls", [])] for m in sent] == [
        [], ["Bash_0"], "Bash_0", [], ["Bash_0__2"], "Bash_0__2"]
    assert [m.get("content") for m in sent if m["role"] == "tool"] == ["one", "two"]
    assert [c.provider_call_id for c in reported.tool_calls] == ["Bash_0__3"]


def test_tool_arguments_that_are_not_a_json_object_are_a_retryable_failure_that_keeps_its_usage():
    answer = {"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "post_to_sink", "arguments": "{not json"}}]}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 4}}
    with pytest.raises(ProviderError) as failure:
        openai_compatible.parse_reply(answer)
    assert failure.value.retryable and failure.value.usage.input_tokens == 11 and failure.value.usage.output_tokens == 4


# --- building providers ------------------------------------------------------------


def test_build_provider_still_builds_the_scripted_provider_and_several_can_be_held_at_once():
    script = PROJECT_ROOT / "tests" / "fixtures" / "script.yaml"
    assert isinstance(build_provider("scripted", ModelStepSettings(script_file=script)), ScriptedProvider)
    config = ModelStepSettings(provider="scripted", providers="openai, anthropic", script_file=script,
                               openai_model="m", anthropic_model="c", anthropic_api_key=KEY)
    providers = build_providers(config)
    assert sorted(providers) == ["anthropic", "openai", "scripted"]
    assert all(p.name == name for name, p in providers.items())
    with pytest.raises(SystemExit, match="SIGNOFF_OPENAI_MODEL"):
        build_provider("openai", ModelStepSettings(openai_model=""))
    with pytest.raises(SystemExit, match="known: scripted, openai, anthropic"):
        build_provider("gpt", ModelStepSettings(script_file=script))


async def test_a_session_naming_a_provider_that_is_not_held_fails_its_step_with_one_recorded_attempt():
    reports = []

    async def report(message):
        reports.append(message)

    transcripts = HeldTranscripts()
    request = transcripts.step("ses_1", [user("hi")], provider="openai", tools=TOOLS, step_id="stp_1")
    await request_model_step({}, transcripts, report, request)
    [reported] = reports
    assert "no provider named 'openai'" in reported.error and [a.status for a in reported.attempts] == ["failed"]


# --- end to end, on the real services ------------------------------------------------


async def test_a_renumbering_provider_still_gets_both_approvals_executed_once(deployment, sink):
    script = [
        FakeReply("I will post the first.", [("post_to_sink", {"message": "first"})]),
        FakeReply("Posted."),
        FakeReply("I will post the second.", [("post_to_sink", {"message": "second"})]),
        FakeReply("Posted again."),
    ]
    with FakeOpenAI(script, api_key=KEY, renumber=True) as fake:
        deployment.extra_env.update(
            SINK_URL=sink.url, SINK_TOKEN="tok-123",
            SIGNOFF_PROVIDER="openai", SIGNOFF_OPENAI_BASE_URL=fake.base_url,
            SIGNOFF_OPENAI_MODEL="fake-gpt", SIGNOFF_OPENAI_API_KEY=KEY,
        )
        deployment.start()
        session_id = mint("ses")
        cards = []
        async with deployment.console() as console:
            events = await console.watch(session_id)
            for text, final in (("post the first", "Posted."), ("post the second", "Posted again.")):
                await console.send(StartTurn(session_id=session_id, text=text))
                requested = await next_event(events, "approval.requested", "turn.failed")
                assert requested.type == "approval.requested", requested
                cards.append(requested)
                await console.respond(requested.request_id, "approve", "", "", "tester")
                completed = await next_event(events, "turn.completed", "turn.failed")
                assert completed.type == "turn.completed", completed
                assert completed.text == final

    assert [c.card.arguments for c in cards] == [{"message": "first"}, {"message": "second"}]
    assert cards[0].request_id != cards[1].request_id and cards[0].call_id != cards[1].call_id
    assert sink.counts["/sink"] == 2
    assert [json.loads(r["body"])["message"] for r in sink.requests] == ["first", "second"]
    assert fake.bad_requests == [] and fake.statuses == [200] * 4
    # The provider called both `Bash_0`; the second went on, and back to it, as `Bash_0__2`.
    last = fake.requests[-1]["body"]["messages"]
    assert [c["id"] for m in last for c in m.get("tool_calls") or []] == ["Bash_0", "Bash_0__2"]
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ["Bash_0", "Bash_0__2"]
    async with deployment.ledger() as ledger, ledger() as db:
        calls = (await db.scalars(select(ToolCall).where(ToolCall.session_id == session_id)
                                  .order_by(ToolCall.created_at))).all()
        assert [c.provider_call_id for c in calls] == ["Bash_0", "Bash_0__2"]
        closures = (await db.scalars(select(Closure).where(Closure.session_id == session_id))).all()
        assert sorted(c.kind for c in closures) == ["output", "output"]
        attempts = (await db.scalars(select(ProviderAttemptRow).where(ProviderAttemptRow.session_id == session_id)
                                     .order_by(ProviderAttemptRow.id))).all()
        assert [(a.status, a.provider) for a in attempts] == [("completed", "openai")] * 4
        assert [(a.input_tokens, a.output_tokens) for a in attempts] == [(u["input"], u["output"]) for u in fake.usages]


async def test_a_session_may_name_openai_when_its_settings_are_set_though_the_default_provider_is_another(deployment):
    with FakeOpenAI([FakeReply("Hello from the API model.")], api_key=KEY) as fake:
        # SIGNOFF_PROVIDER left at its default (scripted): the openai settings alone make it held.
        deployment.extra_env.update(
            SIGNOFF_OPENAI_BASE_URL=fake.base_url, SIGNOFF_OPENAI_MODEL="fake-gpt", SIGNOFF_OPENAI_API_KEY=KEY
        )
        deployment.start()
        session_id = mint("ses")
        async with deployment.console() as console:
            events = await console.watch(session_id)
            await console.send(StartTurn(session_id=session_id, text="hello", provider="openai"))
            ended = await next_event(events, "turn.completed", "turn.failed")
    assert ended.type == "turn.completed", ended
    assert ended.text == "Hello from the API model." and fake.statuses == [200]


def test_the_cli_names_every_registered_provider_and_no_other():
    from services.model_step.providers import PROVIDERS

    shown = subprocess.run([sys.executable, "-m", "services.operations.cli", "session", "start", "--help"],
                           capture_output=True, text=True, check=True, cwd=PROJECT_ROOT).stdout
    assert f"({', '.join(PROVIDERS)})" in " ".join(shown.split())


async def test_a_provider_that_keeps_failing_ends_the_turn_as_failed_with_every_attempt_counted(deployment):
    with FakeOpenAI([FakeReply("never seen")], api_key=KEY) as fake:
        fake.fail_next(10, 503)
        deployment.extra_env.update(
            SIGNOFF_PROVIDER="openai", SIGNOFF_OPENAI_BASE_URL=fake.base_url,
            SIGNOFF_OPENAI_MODEL="fake-gpt", SIGNOFF_OPENAI_API_KEY=KEY,
        )
        deployment.start()
        session_id = mint("ses")
        async with deployment.console() as console:
            events = await console.watch(session_id)
            await console.send(StartTurn(session_id=session_id, text="hello"))
            failed = await next_event(events, "turn.failed", "turn.completed", timeout=40)
    assert failed.type == "turn.failed" and failed.reason_code == "provider_failed"
    assert "503" in failed.reason_text and KEY not in failed.reason_text
    from shared.ledger.tables import ProviderAttemptRow, Session
    from tests.harness import rows

    attempts = await rows(deployment, ProviderAttemptRow, session_id=session_id)
    assert [a.status for a in attempts] == ["failed"] * len(fake.statuses) and len(attempts) >= 2
    [session] = await rows(deployment, Session, id=session_id)
    assert session.status == "idle", "a failed turn does not leave the session stuck running"


async def test_a_provider_answering_garbage_fails_the_turn_after_its_budget_and_is_never_called_again(deployment):
    """Replies of the wrong shape, with garbage usage: each call is one counted attempt
    (usage as far as readable), the turn fails with the reason after the retry budget,
    and the step is never redelivered, so the provider is never called (and billed) again."""
    garbage = [
        {"choices": [{"message": "I am a string"}], "usage": {"prompt_tokens": -1, "completion_tokens": "x"}},
        {"choices": [{"message": {"content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": "post_to_sink"}]}}],
         "usage": {"prompt_tokens": 12, "completion_tokens": 5}},
        {"choices": [{"message": {"tool_calls": {"id": "c1"}}}],
         "usage": {"prompt_tokens": 10**12, "completion_tokens": None}},
    ]
    with FakeOpenAI([FakeReply("never seen")], api_key=KEY) as fake:
        fake.answer_next(*garbage, *garbage)  # more than the budget: a redelivery would find more
        deployment.extra_env.update(
            SIGNOFF_PROVIDER="openai", SIGNOFF_OPENAI_BASE_URL=fake.base_url,
            SIGNOFF_OPENAI_MODEL="fake-gpt", SIGNOFF_OPENAI_API_KEY=KEY,
            # A handler that fails has its step redelivered: few times, so that a
            # failure shows quickly (as calls beyond the budget, and no turn.failed).
            SIGNOFF_DELIVERY_LIMIT="3",
        )
        deployment.start()
        session_id = mint("ses")
        async with deployment.console() as console:
            events = await console.watch(session_id)
            await console.send(StartTurn(session_id=session_id, text="hello"))
            failed = await next_event(events, "turn.failed", "turn.completed", timeout=30)
            await asyncio.sleep(1.5)  # what a redelivery would have called by now
            calls = len(fake.requests)
            assert calls == 3, f"the provider was called {calls} times for one step with a budget of 3"
            assert failed.type == "turn.failed" and failed.reason_code == "provider_failed", failed
            assert "unusable reply" in failed.reason_text and KEY not in failed.reason_text
            await assert_nothing_left_in_any_queue(console, deployment.namespace)
    attempts = await rows(deployment, ProviderAttemptRow, session_id=session_id)
    attempts.sort(key=lambda a: a.number)
    assert [(a.number, a.status) for a in attempts] == [(1, "failed"), (2, "failed"), (3, "failed")]
    assert [(a.input_tokens, a.output_tokens) for a in attempts] == [(0, 0), (12, 5), (2**31 - 1, 0)]
    [session] = await rows(deployment, Session, id=session_id)
    assert session.status == "idle"
