"""Model providers behind one small interface.

The scripted provider is a real feature: it lets users drive their agent flows
deterministically, and it is what `make run`, the tests and the benchmark use.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic import BaseModel, ConfigDict

from shared.messages import ProposedToolCall, ToolDescription, TranscriptEntry, Usage


@dataclass
class ProviderReply:
    text: str
    tool_calls: list[ProposedToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)


class ProviderError(Exception):
    def __init__(self, message: str, *, retryable: bool, usage: Usage | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.usage = usage or Usage()


class Provider(Protocol):
    name: str

    async def complete(
        self, session_id: str, transcript: list[TranscriptEntry], tools: list[ToolDescription]
    ) -> ProviderReply: ...


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
        if step >= len(replies):
            reply = ScriptedReply(text="(the script has no more replies)")
        else:
            reply = replies[step]
        calls = [
            ProposedToolCall(provider_call_id=c.id or f"call_{step}_{i}", name=c.name, arguments=c.arguments)
            for i, c in enumerate(reply.tool_calls)
        ]
        prompt_chars = sum(len(e.text) for e in transcript)
        return ProviderReply(
            text=reply.text,
            tool_calls=calls,
            usage=Usage(input_tokens=prompt_chars // 4 + 1, output_tokens=len(reply.text) // 4 + 1),
        )


def build_provider(name: str, script_file: Path) -> Provider:
    if name == "scripted":
        return ScriptedProvider.from_file(script_file)
    raise SystemExit(f"unknown model provider {name!r}; known: scripted")
