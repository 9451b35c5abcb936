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

from .replies import MAX_TOKENS, ProviderReply, tokens, unusable
from .settings import ModelStepSettings
from .tool_call_ids import fit
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


def _usage(answer: Any) -> Usage:
    part = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(part, dict):
        return Usage()
    # Cached prompt tokens are billed too, under their own names.
    billed = sum(
        tokens(part.get(k)) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    return Usage(input_tokens=min(billed, MAX_TOKENS), output_tokens=tokens(part.get("output_tokens")))


def parse_reply(answer: Any, provider: str = "anthropic") -> ProviderReply:
    """The reply, or a ProviderError whatever its shape: never another exception.
    Usage is counted as far as it is readable, also when the rest is not."""
    usage = _usage(answer)
    try:
        content = answer.get("content") if isinstance(answer, dict) else None
        if not isinstance(content, list):
            raise ValueError("the reply's content is not a list of blocks")
        texts, calls = [], []
        for index, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if not isinstance(kind, str):
                raise ValueError(f"content[{index}] is not a typed block")
            if kind == "text":
                if not isinstance(block.get("text"), str):
                    raise ValueError(f"content[{index}].text is not text")
                texts.append(block["text"])
            elif kind == "tool_use":
                if not isinstance(block.get("input"), dict):
                    raise ValueError("tool input is not an object")
                call_id = block.get("id")
                if not isinstance(call_id, str) or not call_id:
                    call_id = f"toolu_{index}"
                calls.append(
                    ProposedToolCall(provider_call_id=fit(call_id), name=block.get("name"), arguments=block["input"])
                )
        return ProviderReply(text="".join(texts), tool_calls=calls, usage=usage)
    except Exception as error:
        raise unusable(provider, error, usage) from None


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


def configured(settings: ModelStepSettings) -> bool:
    return bool(settings.anthropic_model) and settings.anthropic_api_key is not None


def build(settings: ModelStepSettings) -> AnthropicProvider:
    key = settings.anthropic_api_key
    if not settings.anthropic_model or key is None:
        raise SystemExit("the anthropic provider needs SIGNOFF_ANTHROPIC_MODEL and SIGNOFF_ANTHROPIC_API_KEY")
    return AnthropicProvider(
        base_url=settings.anthropic_base_url,
        model=settings.anthropic_model,
        api_key=key,
        version=settings.anthropic_version,
        max_tokens=settings.anthropic_max_tokens,
        timeout_seconds=settings.anthropic_timeout_seconds,
    )
