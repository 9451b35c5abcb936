"""The scripted provider: replies read from a file, by step.

A real feature: it lets users drive their agent flows deterministically, and it
is what `make run`, the tests and the benchmark use.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from shared.messages import ProposedToolCall, ToolDescription, TranscriptEntry, Usage

from .replies import ProviderReply
from .settings import ModelStepSettings


class ScriptedCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: dict[str, Any] = {}
    # The provider's tool-call id; repeat one to imitate providers that reuse ids.
    id: str | None = None


class ScriptedReply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = ""
    tool_calls: list[ScriptedCall] = []
    # The text instead, when a call of the step before closed this way (`denied`,
    # `expired`, `error`, ...): a scripted model that says "done" after a person
    # denied the call would teach a newcomer that the model lies.
    when_closed: dict[str, str] = {}

    def said_after(self, transcript: list[TranscriptEntry]) -> str:
        for closure in _latest_closures(transcript):
            if closure in self.when_closed:
                return self.when_closed[closure]
        return self.text


def _latest_closures(transcript: list[TranscriptEntry]) -> list[str]:
    """How the calls of the last assistant entry closed, in the transcript's order."""
    closures: list[str] = []
    for entry in reversed(transcript):
        if entry.role == "assistant":
            break
        if entry.role == "tool" and entry.closure:
            closures.append(entry.closure)
    return closures[::-1]


class Script(BaseModel):
    """Replies by step: the n-th model step of a session gets the n-th reply.

    `sessions` maps a session id, or a pattern like `bench-*`, to its own list.
    """

    model_config = ConfigDict(extra="forbid")
    default: list[ScriptedReply] = []
    sessions: dict[str, list[ScriptedReply]] = {}

    def replies_for(self, session_id: str) -> list[ScriptedReply]:
        if session_id in self.sessions:
            return self.sessions[session_id]
        for pattern, replies in self.sessions.items():
            if fnmatch.fnmatchcase(session_id, pattern):
                return replies
        return self.default


class ScriptedProvider:
    name = "scripted"

    def __init__(self, script: Script) -> None:
        self.script = script

    @classmethod
    def from_file(cls, path: Path) -> ScriptedProvider:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise SystemExit(f"script file not found: {path} (set SIGNOFF_SCRIPT_FILE)") from None
        return cls(Script.model_validate(data))

    async def complete(
        self, session_id: str, transcript: list[TranscriptEntry], tools: list[ToolDescription]
    ) -> ProviderReply:
        # Stateless: the position comes from the transcript, so a redelivered
        # step gets the same reply as the first delivery did.
        step = sum(1 for e in transcript if e.role == "assistant")
        replies = self.script.replies_for(session_id)
        reply = ScriptedReply(text="(the script has no more replies)") if step >= len(replies) else replies[step]
        asked = next((e.text for e in reversed(transcript) if e.role == "user"), "")
        calls = [
            ProposedToolCall(
                provider_call_id=c.id or f"call_{step}_{i}", name=c.name, arguments=filled(c.arguments, asked)
            )
            for i, c in enumerate(reply.tool_calls)
        ]
        prompt_chars = sum(len(e.text) for e in transcript)
        text = reply.said_after(transcript)
        return ProviderReply(
            text=text,
            tool_calls=calls,
            usage=Usage(input_tokens=prompt_chars // 4 + 1, output_tokens=len(text) // 4 + 1),
        )


# Words a request starts with that say what to do, not what about ("Please publish the …").
_ASKING = {"please", "publish", "post", "write", "the", "a", "an", "can", "could", "would", "you", "now"}


def title_of(asked: str) -> str:
    """A title from what the person asked: without the asking words it starts with, nor
    its end's punctuation; "Please publish the release notes for version 1.2." gives
    "Release notes for version 1.2"."""
    words = asked.strip().rstrip(".!?").split()
    while words and words[0].lower().strip(",:") in _ASKING:
        words.pop(0)
    title = " ".join(words)[:80] or "Untitled"
    return title[0].upper() + title[1:]


def filled(value: Any, asked: str) -> Any:
    """A scripted call's arguments with `{request}` (what the person asked, as written)
    and `{request_title}` (`title_of` it) filled in: a scripted model that proposes the
    same post whatever the person asked for teaches that the model does not listen."""
    if isinstance(value, str):
        return value.replace("{request_title}", title_of(asked)).replace("{request}", asked)
    if isinstance(value, dict):
        return {k: filled(v, asked) for k, v in value.items()}
    if isinstance(value, list):
        return [filled(v, asked) for v in value]
    return value


def configured(settings: ModelStepSettings) -> bool:
    """Never held unless named: its script file has a default, so its settings are never "present"."""
    return False


def build(settings: ModelStepSettings) -> ScriptedProvider:
    return ScriptedProvider.from_file(settings.script_file)
