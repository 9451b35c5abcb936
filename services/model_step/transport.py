"""One HTTP request to a model provider, with every failure turned into a
ProviderError that says whether a retry can help.

One call here is one provider attempt: the handler owns the retry loop so that
every attempt is recorded with its usage (invariant 7).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from .providers import ProviderError

# 408 and 409 are transient by OpenAI's own advice; 429 is rate limiting, 5xx
# (including Anthropic's 529 "overloaded") is the provider's trouble, not ours.
RETRYABLE_STATUSES = frozenset({408, 409, 429})


def timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(10.0, seconds))


def _redact(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _error_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:500]
    return json.dumps(body)[:500]


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
    except httpx.TransportError as error:
        detail = _redact(str(error), secrets)
        raise ProviderError(f"{provider}: {type(error).__name__}: {detail}"[:4000], retryable=True) from None
    status = response.status_code
    if status >= 400:
        retryable = status in RETRYABLE_STATUSES or status >= 500
        detail = _redact(_error_detail(response), secrets)
        raise ProviderError(f"{provider}: HTTP {status}: {detail}", retryable=retryable,
                            retry_after=_retry_after(response) if retryable else None)
    try:
        answer = response.json()
    except ValueError:
        raise ProviderError(f"{provider}: HTTP {status} with a body that is not JSON", retryable=True) from None
    if not isinstance(answer, dict):
        raise ProviderError(f"{provider}: HTTP {status} with a JSON body that is not an object", retryable=True)
    return answer
