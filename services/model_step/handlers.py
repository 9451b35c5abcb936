"""The model-step handler: one provider call (with retries) per step request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from shared import faults
from shared.consuming import previous_deliveries
from shared.messages import ModelStepCompleted, ProviderAttempt, RequestModelStep

from .replies import Provider, ProviderError
from .tool_call_ids import ToolCallIdNormalizer, unique_wire_ids
from .transcript_guard import heal

log = logging.getLogger("signoff.model_step")
MAX_ATTEMPTS = 3
BACKOFF_SECONDS = 0.2
# A provider's Retry-After is honoured up to this; longer waits are its problem
# to report again on the next attempt, not a reason to hold the step for minutes.
MAX_RETRY_AFTER_SECONDS = 30.0


def backoff(number: int, retry_after: float | None) -> float:
    """Exponential (0.2 s, 0.4 s, ...), or the provider's hint if that is longer."""
    return max(BACKOFF_SECONDS * 2 ** (number - 1), min(retry_after or 0.0, MAX_RETRY_AFTER_SECONDS))


async def request_model_step(
    providers: dict[str, Provider],
    report: Callable[[ModelStepCompleted], Awaitable[None]],
    request: RequestModelStep,
) -> None:
    provider = providers.get(request.provider)
    # Healed once: every attempt sends the same request (invariant 3). Ids are
    # made unique on the wire too, for transcripts stored before the normalizer.
    transcript = unique_wire_ids(heal(request.transcript, request.session_id), request.session_id)
    # Stateless: the session's claimed provider ids come from its transcript.
    ids = ToolCallIdNormalizer.from_transcript(transcript, session_id=request.session_id)
    # A delivery that was never acked died with its provider call in flight (or
    # after reporting, which the ledger tells apart): counted, not forgotten (invariant 7).
    lost = previous_deliveries.get()
    attempts: list[ProviderAttempt] = [
        ProviderAttempt(
            number=n,
            status="abandoned",
            provider=request.provider,
            error="the model-step stopped before this attempt was reported",
        )
        for n in range(1, lost + 1)
    ]
    reply, tool_calls, error = None, [], None
    if provider is None:
        error = f"no provider named {request.provider!r} is configured"
        attempts.append(ProviderAttempt(number=lost + 1, status="failed", provider=request.provider, error=error))
    for number in range(lost + 1, lost + MAX_ATTEMPTS + 1 if provider else 0):
        assert provider is not None
        try:
            await faults.reached("model_step.mid_call")
            reply = await provider.complete(request.session_id, transcript, request.tools)
            tool_calls = ids.normalize(reply.tool_calls)
            ids.commit()
            attempts.append(
                ProviderAttempt(number=number, status="completed", provider=provider.name, usage=reply.usage)
            )
            break
        except ProviderError as failure:
            # A retry must give the same calls the same ids (invariant 2).
            ids.rollback()
            attempts.append(
                ProviderAttempt(
                    number=number,
                    status="failed",
                    provider=provider.name,
                    usage=failure.usage,
                    error=str(failure)[:4000],
                )
            )
            error = str(failure)[:4000]
            log.warning(
                "session %s step %s: provider %s attempt %d failed (%s): %s",
                request.session_id,
                request.step_id,
                provider.name,
                number,
                "will retry" if failure.retryable else "final",
                error,
            )
            if not failure.retryable or number == lost + MAX_ATTEMPTS:
                break
            await asyncio.sleep(backoff(number - lost, failure.retry_after))
    await report(
        ModelStepCompleted(
            session_id=request.session_id,
            causation_id=request.message_id,
            step_id=request.step_id,
            text=reply.text if reply else "",
            tool_calls=tool_calls if reply else [],
            attempts=attempts,
            error=None if reply else error,
        )
    )
    await faults.reached("model_step.after_report")
