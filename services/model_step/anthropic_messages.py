"""An Anthropic Messages provider: POST {base_url}/v1/messages.

The Messages API is stricter than chat completions about shape: roles must
alternate, every tool_use must be answered by a tool_result in the very next
(user) message, and those results must come before any text in it. So the
results of one assistant message go into one user message, and a user message
that follows them (a person's note sent with a decision) is merged after them.
"""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from shared.messages import ProposedToolCall, ToolDescription, TranscriptEntry, Usage

from .replies import ProviderError, ProviderReply
from .transport import HttpProvider


def to_messages(transcript: list[TranscriptEntry]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return  # empty text blocks and empty messages are rejected
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for entry in transcript:
        if entry.role == "user":
            add("user", [{"type": "text", "text": entry.text}] if entry.text else [])
        elif entry.role == "tool":
            add(
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": entry.provider_call_id,
                        "content": entry.text or "(empty)",
                        # Denied, expired, cancelled, unknown outcome: the call did not produce its output.
                        "is_error": entry.closure != "output",
                    }
                ],
            )
        else:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": entry.text}] if entry.text else []
            blocks += [
                {"type": "tool_use", "id": c.provider_call_id, "name": c.name, "input": c.arguments}
                for c in entry.tool_calls
            ]
            add("assistant", blocks)
    return messages


def to_tools(tools: list[ToolDescription]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


def request_body(
    model: str, transcript: list[TranscriptEntry], tools: list[ToolDescription], max_tokens: int
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": to_messages(transcript)}
    if tools:
        body["tools"] = to_tools(tools)
    return body


def parse_reply(answer: dict[str, Any], provider: str = "anthropic") -> ProviderReply:
    usage_part = answer.get("usage") or {}
    # Cached prompt tokens are billed too, under their own names.
    usage = Usage(
        input_tokens=sum(
            int(usage_part.get(k) or 0)
            for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        ),
        output_tokens=int(usage_part.get("output_tokens") or 0),
    )
    try:
        texts, calls = [], []
        for block in answer["content"]:
            if block["type"] == "text":
                texts.append(block["text"])
            elif block["type"] == "tool_use":
                if not isinstance(block["input"], dict):
                    raise ValueError("tool input is not an object")
                calls.append(
                    ProposedToolCall(provider_call_id=block["id"], name=block["name"], arguments=block["input"])
                )
        return ProviderReply(text="".join(texts), tool_calls=calls, usage=usage)
    except (KeyError, TypeError, ValueError) as error:
        raise ProviderError(
            f"{provider}: unusable reply ({type(error).__name__}: {error})"[:4000], retryable=True, usage=usage
        ) from None


class AnthropicProvider(HttpProvider):
    path = "/v1/messages"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: SecretStr | None,
        version: str = "2023-06-01",
        max_tokens: int = 4096,
        timeout_seconds: float = 120.0,
        name: str = "anthropic",
    ) -> None:
        super().__init__(base_url=base_url, model=model, api_key=api_key, timeout_seconds=timeout_seconds, name=name)
        self.version = version
        self.max_tokens = max_tokens

    def headers(self, key: str) -> dict[str, str]:
        return {"x-api-key": key, "anthropic-version": self.version}

    def body(self, transcript: list[TranscriptEntry], tools: list[ToolDescription]) -> dict[str, Any]:
        return request_body(self.model, transcript, tools, self.max_tokens)

    def parse(self, answer: dict[str, Any]) -> ProviderReply:
        return parse_reply(answer, self.name)
