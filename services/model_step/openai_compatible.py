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

from .replies import ProviderError, ProviderReply
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
    # Some servers answer with content parts.
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def parse_reply(answer: dict[str, Any], provider: str = "openai") -> ProviderReply:
    usage_part = answer.get("usage") or {}
    usage = Usage(
        input_tokens=int(usage_part.get("prompt_tokens") or 0),
        output_tokens=int(usage_part.get("completion_tokens") or 0),
    )
    try:
        message = answer["choices"][0]["message"]
        calls = []
        for index, call in enumerate(message.get("tool_calls") or []):
            function = call["function"]
            raw = function.get("arguments") or "{}"
            arguments = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(arguments, dict):
                raise ValueError("tool arguments are not a JSON object")
            # Some local servers send no id at all; the normalizer makes this unique.
            calls.append(
                ProposedToolCall(
                    provider_call_id=call.get("id") or f"call_{index}", name=function["name"], arguments=arguments
                )
            )
        return ProviderReply(text=_text(message.get("content")), tool_calls=calls, usage=usage)
    except (KeyError, IndexError, TypeError, ValueError) as error:
        # The model may well produce valid JSON on a second try; the tokens of
        # this one were spent all the same (invariant 7).
        raise ProviderError(
            f"{provider}: unusable reply ({type(error).__name__}: {error})"[:4000], retryable=True, usage=usage
        ) from None


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
