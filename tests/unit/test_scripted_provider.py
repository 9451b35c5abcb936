"""The scripted provider (the demo's model): its reply can depend on how the calls it
asked for closed, so a denied call is not followed by "Done"."""

import asyncio
from pathlib import Path

from services.model_step.scripted import ScriptedProvider
from shared.messages import TranscriptCall, TranscriptEntry

DEMO_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "script.yaml"


def _after(closure: str) -> list[TranscriptEntry]:
    return [
        TranscriptEntry(role="user", text="publish the notes"),
        TranscriptEntry(
            role="assistant",
            text="I'll publish",
            tool_calls=[TranscriptCall(call_id="call_1", provider_call_id="p1", name="publish_post", arguments={})],
        ),
        TranscriptEntry(role="tool", text="...", call_id="call_1", provider_call_id="p1", closure=closure),
    ]


def _said(transcript: list[TranscriptEntry]) -> str:
    provider = ScriptedProvider.from_file(DEMO_SCRIPT)
    return asyncio.run(provider.complete("ses_demo", transcript, [])).text


def test_the_demos_model_says_done_only_when_the_call_ran_and_says_it_was_denied_when_it_was():
    assert _said(_after("output")) == "Done: the release notes are published."
    denied = _said(_after("denied"))
    assert "denied" in denied and "Done" not in denied and "published." not in denied
    assert "nobody decided in time" in _said(_after("expired"))


def _proposed(asked: str) -> dict:
    provider = ScriptedProvider.from_file(DEMO_SCRIPT)
    [call] = asyncio.run(provider.complete("ses_demo", [TranscriptEntry(role="user", text=asked)], [])).tool_calls
    return call.arguments


def test_the_demos_model_proposes_a_post_titled_after_what_the_person_asked_for():
    assert _proposed("Please publish the release notes for version 1.2.")["title"] == "Release notes for version 1.2"
    assert _proposed("Publish the notes for 1.3")["title"] == "Notes for 1.3"
    assert "Publish the notes for 1.3" in _proposed("Publish the notes for 1.3")["body"]
    assert _proposed("please!")["title"] == "Untitled"
