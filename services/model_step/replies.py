"""What a model provider answers, one attempt at a time: a reply or a ProviderError.

Its own module so that the provider implementations and the registry that builds
them (`providers`) both import it, and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from shared.messages import ProposedToolCall, ToolDescription, TranscriptEntry, Usage


@dataclass
class ProviderReply:
    text: str
    tool_calls: list[ProposedToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)


class ProviderError(Exception):
    """One failed provider attempt. `usage` is what the provider billed for it
    (zero when it never answered); `retry_after` is the provider's own hint."""

    def __init__(
        self, message: str, *, retryable: bool, usage: Usage | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.usage = usage or Usage()
        self.retry_after = retry_after


class Provider(Protocol):
    name: str

    async def complete(
        self, session_id: str, transcript: list[TranscriptEntry], tools: list[ToolDescription]
    ) -> ProviderReply: ...
