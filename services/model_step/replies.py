"""What a model provider answers, one attempt at a time: a reply or a ProviderError.

Its own module so that the provider implementations and the registry that builds
them (`providers`) both import it, and not each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.messages import ProposedToolCall, ToolDescription, TranscriptEntry, Usage
from shared.redaction import redact_then_cut


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


# The ledger keeps token counts in 32-bit integer columns (provider_attempts): a
# count beyond that would fail the ledger's transaction on every delivery.
MAX_TOKENS = 2**31 - 1


def tokens(value: Any) -> int:
    """A token count as a provider reported it, made countable: never raises.

    A non-negative number (or a numeric string) counts, truncated to a whole
    number and capped at MAX_TOKENS; anything else (negative, non-numeric, not
    finite, a boolean, null) counts as 0 (invariant 7: counted as far as readable)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return 0
    if isinstance(value, float):
        if not math.isfinite(value):
            return 0
        value = int(value)
    if not isinstance(value, int):
        return 0
    return min(max(value, 0), MAX_TOKENS)


def unusable(provider: str, error: BaseException, usage: Usage) -> ProviderError:
    """A reply that could not be used, whatever went wrong reading it: a retryable
    failure (the model may well answer properly on a second try) that keeps the
    usage the provider billed for it (invariant 7)."""
    try:
        detail = f"{type(error).__name__}: {error}"
    except Exception:
        detail = type(error).__name__
    return ProviderError(redact_then_cut(f"{provider}: unusable reply ({detail})", 4000), retryable=True, usage=usage)


def counted(usage: Any) -> Usage:
    """Any provider's usage (a reply's, a failure's) as a Usage the ledger can record."""
    return Usage(
        input_tokens=tokens(getattr(usage, "input_tokens", 0)),
        output_tokens=tokens(getattr(usage, "output_tokens", 0)),
    )


class Provider(Protocol):
    name: str

    async def complete(
        self, session_id: str, transcript: list[TranscriptEntry], tools: list[ToolDescription]
    ) -> ProviderReply: ...
