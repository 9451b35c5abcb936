"""One HTTP request to a model provider, with every failure turned into a
ProviderError that says whether a retry can help.

One call here is one provider attempt: the handler owns the retry loop so that
every attempt is recorded with its usage (invariant 7).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from pydantic import SecretStr

from shared.messages import ToolDescription, TranscriptEntry
from shared.redaction import hide_pieces, redact_text, remember

from .replies import ProviderError, ProviderReply

# 408 and 409 are transient by OpenAI's own advice; 429 is rate limiting, 5xx
# (including Anthropic's 529 "overloaded") is the provider's trouble, not ours.
RETRYABLE_STATUSES = frozenset({408, 409, 429})


def timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(10.0, seconds))


# What a provider's error may say in a failure's reason, and how much of its body is read
# to find that: more than the reason by far more than any key, so a key cut at the first
# bound is past the second.
DETAIL_CHARS = 500
BODY_CHARS = 65_536


def _redact(text: str, secrets: tuple[str, ...]) -> str:
    """The text without the keys (whole, or any piece of 8 characters or more), known
    secrets and credential shapes."""
    return hide_pieces(redact_text(text, secrets), secrets)


def _error_detail(response: httpx.Response, secrets: tuple[str, ...]) -> str:
    """What the provider said was wrong, redacted, then cut (in that order: a key cut in
    two is no longer found, and its first characters would go out)."""
    try:
        body = response.json()
        error = body.get("error") if isinstance(body, dict) else None
        said = str(error["message"]) if isinstance(error, dict) and error.get("message") else json.dumps(body)
    except Exception:  # not JSON, or JSON nested past the parser's recursion limit
        said = response.text
    return _redact(said[:BODY_CHARS], secrets)[:DETAIL_CHARS]


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None  # absent, or an HTTP date: the handler's own backoff will do


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    *,
    provider: str,
    headers: dict[str, str],
    body: dict[str, Any],
    secrets: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The provider's JSON answer; every failure a ProviderError without secrets in it.

    `secrets` are scrubbed from every message: some providers echo (part of) a
    rejected key back in the error body.
    """
    try:
        response = await client.post(url, json=body, headers=headers)
    except httpx.TimeoutException as error:
        raise ProviderError(f"{provider}: no answer in time ({type(error).__name__})", retryable=True) from None
    except httpx.RequestError as error:
        # A transport error, a body that cannot be decoded, too many redirects.
        detail = _redact(f"{provider}: {type(error).__name__}: {error}", secrets)
        raise ProviderError(detail[:4000], retryable=True) from None
    status = response.status_code
    if status >= 400:
        retryable = status in RETRYABLE_STATUSES or status >= 500
        detail = _error_detail(response, secrets)
        raise ProviderError(
            f"{provider}: HTTP {status}: {detail}",
            retryable=retryable,
            retry_after=_retry_after(response) if retryable else None,
        )
    try:
        answer = response.json()
    except (ValueError, RecursionError):  # RecursionError: JSON nested past the parser's limit
        raise ProviderError(f"{provider}: HTTP {status} with a body that is not JSON", retryable=True) from None
    if not isinstance(answer, dict):
        raise ProviderError(f"{provider}: HTTP {status} with a JSON body that is not an object", retryable=True)
    return answer


class HttpProvider:
    """A provider behind one HTTP endpoint: one connection pool, no session state.
    Each kind says where it posts, how it authenticates, and how it maps a step to
    and from its wire format."""

    path = ""

    def __init__(
        self, *, base_url: str, model: str, api_key: SecretStr | None, timeout_seconds: float, name: str
    ) -> None:
        self.name = name
        self.url = base_url.rstrip("/") + self.path
        self.model = model
        self._api_key = api_key
        if api_key is not None:
            # Known to the redactor from start-up on: hidden in every log line and error.
            remember(api_key.get_secret_value())
        self._client = httpx.AsyncClient(timeout=timeout(timeout_seconds))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, url={self.url!r}, model={self.model!r})"

    def headers(self, key: str) -> dict[str, str]:
        raise NotImplementedError

    def body(self, transcript: list[TranscriptEntry], tools: list[ToolDescription]) -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, answer: dict[str, Any]) -> ProviderReply:
        raise NotImplementedError

    async def complete(
        self, session_id: str, transcript: list[TranscriptEntry], tools: list[ToolDescription]
    ) -> ProviderReply:
        key = self._api_key.get_secret_value() if self._api_key else ""
        answer = await post_json(
            self._client,
            self.url,
            provider=self.name,
            headers=self.headers(key),
            body=self.body(transcript, tools),
            secrets=(key,),
        )
        return self.parse(answer)

    async def aclose(self) -> None:
        await self._client.aclose()
