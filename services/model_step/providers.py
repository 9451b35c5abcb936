"""Model providers behind one small interface.

The scripted provider is a real feature: it lets users drive their agent flows
deterministically, and it is what `make run`, the tests and the benchmark use.
The OpenAI-compatible and Anthropic providers live in their own modules.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from shared.messages import ProposedToolCall, ToolDescription, TranscriptEntry, Usage

from .replies import Provider, ProviderReply
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
        calls = [
            ProposedToolCall(provider_call_id=c.id or f"call_{step}_{i}", name=c.name, arguments=c.arguments)
            for i, c in enumerate(reply.tool_calls)
        ]
        prompt_chars = sum(len(e.text) for e in transcript)
        text = reply.said_after(transcript)
        return ProviderReply(
            text=text,
            tool_calls=calls,
            usage=Usage(input_tokens=prompt_chars // 4 + 1, output_tokens=len(text) // 4 + 1),
        )


KNOWN_PROVIDERS = ("scripted", "openai", "anthropic")


def build_provider(name: str, script_file: Path, settings: ModelStepSettings | None = None) -> Provider:
    """The provider called `name`, built from settings; exits with a clear message
    if it is unknown or not configured.

    - "scripted" replays `script_file` and needs nothing else.
    - "openai" is any OpenAI-compatible chat-completions server:
      SIGNOFF_OPENAI_BASE_URL, SIGNOFF_OPENAI_MODEL (required), SIGNOFF_OPENAI_API_KEY (optional).
    - "anthropic" is the Messages API: SIGNOFF_ANTHROPIC_BASE_URL, SIGNOFF_ANTHROPIC_MODEL and
      SIGNOFF_ANTHROPIC_API_KEY (both required).
    `settings` defaults to the environment. One provider object per name, shared by
    every session that names it; it holds one HTTP connection pool and no session state.
    """
    if name == "scripted":
        return ScriptedProvider.from_file(script_file)
    if name not in KNOWN_PROVIDERS:
        raise SystemExit(f"unknown model provider {name!r}; known: {', '.join(KNOWN_PROVIDERS)}")
    settings = settings or ModelStepSettings()
    if name == "openai":
        from .openai_compatible import OpenAICompatibleProvider

        if not settings.openai_model:
            raise SystemExit("the openai provider needs a model: set SIGNOFF_OPENAI_MODEL")
        return OpenAICompatibleProvider(
            base_url=settings.openai_base_url,
            model=settings.openai_model,
            api_key=settings.openai_api_key,
            timeout_seconds=settings.openai_timeout_seconds,
            max_tokens=settings.openai_max_tokens,
        )
    from .anthropic_messages import AnthropicProvider

    if not settings.anthropic_model or settings.anthropic_api_key is None:
        raise SystemExit("the anthropic provider needs SIGNOFF_ANTHROPIC_MODEL and SIGNOFF_ANTHROPIC_API_KEY")
    return AnthropicProvider(
        base_url=settings.anthropic_base_url,
        model=settings.anthropic_model,
        api_key=settings.anthropic_api_key,
        version=settings.anthropic_version,
        max_tokens=settings.anthropic_max_tokens,
        timeout_seconds=settings.anthropic_timeout_seconds,
    )


def build_providers(settings: ModelStepSettings) -> dict[str, Provider]:
    """Every provider the settings name (SIGNOFF_PROVIDER plus SIGNOFF_PROVIDERS), keyed by
    name: a step request runs on the one its session names."""
    return {name: build_provider(name, settings.script_file, settings) for name in settings.provider_names}


async def close_providers(providers: dict[str, Provider]) -> None:
    for provider in providers.values():
        close = getattr(provider, "aclose", None)
        if close is not None:
            await close()
