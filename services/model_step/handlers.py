"""The model-step handler: one provider call (with retries) per step request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from shared import faults
from shared.messages import ModelStepCompleted, ProviderAttempt, RequestModelStep

from .providers import Provider, ProviderError

log = logging.getLogger("signoff.model_step")
MAX_ATTEMPTS = 3


async def request_model_step(
    providers: dict[str, Provider],
    report: Callable[[ModelStepCompleted], Awaitable[None]],
    request: RequestModelStep,
) -> None:
    provider = providers.get(request.provider)
    attempts: list[ProviderAttempt] = []
    reply, error = None, None
    if provider is None:
        error = f"no provider named {request.provider!r} is configured"
        attempts.append(ProviderAttempt(number=1, status="failed", provider=request.provider, error=error))
    for number in range(1, MAX_ATTEMPTS + 1 if provider else 0):
        try:
            await faults.reached("model_step.mid_call")
            reply = await provider.complete(request.session_id, request.transcript, request.tools)
            attempts.append(ProviderAttempt(number=number, status="completed", provider=provider.name, usage=reply.usage))
            break
        except ProviderError as failure:
            attempts.append(ProviderAttempt(number=number, status="failed", provider=provider.name,
                                            usage=failure.usage, error=str(failure)[:4000]))
            error = str(failure)[:4000]
            if not failure.retryable or number == MAX_ATTEMPTS:
                break
            await asyncio.sleep(0.2 * 2 ** (number - 1))
    await report(
        ModelStepCompleted(
            session_id=request.session_id,
            causation_id=request.message_id,
            step_id=request.step_id,
            text=reply.text if reply else "",
            tool_calls=reply.tool_calls if reply else [],
            attempts=attempts,
            error=None if reply else error,
        )
    )
    await faults.reached("model_step.after_report")
