"""An OpenAI-compatible chat-completions provider: the hosted service, vLLM,
Ollama, llama.cpp's server, and anything else that speaks
POST {base_url}/chat/completions with function tools.

The mapping to and from the wire is pure; the provider adds one HTTP request.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import SecretStr

from shared.messages import ProposedToolCall, ToolDescription, TranscriptEntry, Usage

from .replies import ProviderReply, tokens, unusable
from .settings import ModelStepSettings
from .tool_call_ids import fit
from .transport import HttpProvider


def to_messages(transcript: list[TranscriptEntry]) -> list[dict[str, Any]]:
    """Signoff's transcript in chat-completions form; the provider's call id is the wire id."""
    messages: list[dict[str, Any]] = []
    for entry in transcript:
        if entry.role == "user":
            messages.append({"role": "user", "content": entry.text})
        elif entry.role == "tool":
            messages.append({"role": "tool", "tool_call_id": entry.provider_call_id, "content": entry.text})
        elif entry.tool_calls:
            messages.append(
                {
                    "role": "assistant",
                    # null, not "", beside tool calls: some servers' chat templates
                    # render an empty string as an empty turn.
                    "content": entry.text or None,
                    "tool_calls": [
                        {
                            "id": call.provider_call_id,
                            "type": "function",
                            "function": {
                                "name": call.name,
                                "arguments": json.dumps(call.arguments, ensure_ascii=False),
                            },
                        }
                        for call in entry.tool_calls
                    ],
                }
            )
        else:
            messages.append({"role": "assistant", "content": entry.text})
    return messages


def to_tools(tools: list[ToolDescription]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


def request_body(
    model: str, transcript: list[TranscriptEntry], tools: list[ToolDescription], max_tokens: int | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": to_messages(transcript)}
    if tools:  # an empty list is rejected by the hosted API
        body["tools"] = to_tools(tools)
    if max_tokens:
        body["max_tokens"] = max_tokens
    return body


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"message.content is a {type(content).__name__}, not text")
    # Some servers answer with content parts.
    return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))


def _usage(answer: Any) -> Usage:
    part = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(part, dict):
        return Usage()
    return Usage(input_tokens=tokens(part.get("prompt_tokens")), output_tokens=tokens(part.get("completion_tokens")))


def _calls(message: dict[str, Any]) -> list[ProposedToolCall]:
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ValueError(f"message.tool_calls is a {type(raw_calls).__name__}, not a list")
    calls = []
    for index, call in enumerate(raw_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise ValueError(f"tool_calls[{index}] has no function object")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool_calls[{index}].function has no name")
        raw = function.get("arguments") or "{}"
        arguments = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(arguments, dict):
            raise ValueError("tool arguments are not a JSON object")
        # Some local servers send no id at all (or not a string); the normalizer makes this unique.
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{index}"
        calls.append(ProposedToolCall(provider_call_id=fit(call_id), name=name, arguments=arguments))
    return calls


def parse_reply(answer: Any, provider: str = "openai") -> ProviderReply:
    """The reply, or a ProviderError whatever its shape: never another exception.
    Usage is counted as far as it is readable, also when the rest is not."""
    usage = _usage(answer)
    try:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices:
            raise ValueError("the reply has no choices")
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        if not isinstance(message, dict):
            raise ValueError("choices[0].message is not an object")
        return ProviderReply(text=_text(message.get("content")), tool_calls=_calls(message), usage=usage)
    except Exception as error:
        raise unusable(provider, error, usage) from None


class OpenAICompatibleProvider(HttpProvider):
    path = "/chat/completions"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: SecretStr | None = None,
        timeout_seconds: float = 120.0,
        max_tokens: int | None = None,
        name: str = "openai",
    ) -> None:
        super().__init__(base_url=base_url, model=model, api_key=api_key, timeout_seconds=timeout_seconds, name=name)
        self.max_tokens = max_tokens

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def body(self, transcript: list[TranscriptEntry], tools: list[ToolDescription]) -> dict[str, Any]:
        return request_body(self.model, transcript, tools, self.max_tokens)

    def parse(self, answer: dict[str, Any]) -> ProviderReply:
        return parse_reply(answer, self.name)


def configured(settings: ModelStepSettings) -> bool:
    return bool(settings.openai_model)


def build(settings: ModelStepSettings) -> OpenAICompatibleProvider:
    if not settings.openai_model:
        raise SystemExit("the openai provider needs a model: set SIGNOFF_OPENAI_MODEL")
    return OpenAICompatibleProvider(
        base_url=settings.openai_base_url,
        model=settings.openai_model,
        api_key=settings.openai_api_key,
        timeout_seconds=settings.openai_timeout_seconds,
        max_tokens=settings.openai_max_tokens,
    )
