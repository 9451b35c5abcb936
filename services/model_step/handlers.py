"""The model-step handler: one provider call (with retries) per step request.

Whatever the provider answers and whatever fails here, the step's report goes
out: a reply, or the failure with every attempt counted (invariant 7), which
fails the turn. Nothing escapes after a provider was called, because an escaped
exception would have the step redelivered and the provider called, and billed,
again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from shared import faults
from shared.consuming import previous_deliveries
from shared.ledger.transcripts import TranscriptMismatch
from shared.messages import (
    ModelStepCompleted,
    ProviderAttempt,
    RequestModelStep,
    ToolDescription,
    TranscriptEntry,
    encode,
)
from shared.observability import PROVIDER_ATTEMPTS, PROVIDER_TOKENS, bounded
from shared.redaction import redact_then_cut
from shared.tool_menu import ToolMenuMismatch

from .replies import Provider, ProviderError, ProviderReply, counted, unusable
from .tool_call_ids import ToolCallIdNormalizer, unique_wire_ids
from .transcript_guard import heal

log = logging.getLogger("signoff.model_step")
MAX_ATTEMPTS = 3
BACKOFF_SECONDS = 0.2
# A provider's Retry-After is honoured up to this; longer waits are its problem
# to report again on the next attempt, not a reason to hold the step for minutes.
MAX_RETRY_AFTER_SECONDS = 30.0
# Publishing the report is retried (the same message id: the ledger keeps one) this
# many times before the step is left to its redelivery, which calls the provider again.
REPORT_TRIES = 6
# The longest error a step's report carries (the ledger's turn.failed reason).
ERROR_CHARS = 4000


class Transcripts(Protocol):
    """Where a step's transcript is read from (the ledger: shared/ledger/transcripts.py)."""

    async def read(self, session_id: str, length: int, digest: str) -> list[TranscriptEntry]: ...


class ToolMenus(Protocol):
    """Where a step's tool menu is read from by its digest (the ledger: shared/ledger/tool_menus.py)."""

    async def read(self, digest: str) -> list[ToolDescription]: ...


def backoff(number: int, retry_after: float | None) -> float:
    """Exponential (0.2 s, 0.4 s, ...), or the provider's hint if that is longer."""
    return max(BACKOFF_SECONDS * 2 ** (number - 1), min(retry_after or 0.0, MAX_RETRY_AFTER_SECONDS))


async def request_model_step(
    providers: dict[str, Provider],
    transcripts: Transcripts,
    report: Callable[[ModelStepCompleted], Awaitable[None]],
    request: RequestModelStep,
    *,
    max_bytes: int | None = None,
    menus: ToolMenus | None = None,
) -> None:
    """`max_bytes`: the largest message a consumer accepts (SIGNOFF_MAX_MESSAGE_BYTES);
    a reply whose report would be larger is a failed attempt, not a parked report.
    `menus`: where the tool menu a step names by digest is read (None: nowhere, and a
    step that names one fails, reported)."""
    completed = await _step(providers, transcripts, request, max_bytes, menus)
    await _send(report, completed)
    last = completed.attempts[-1] if completed.attempts else None
    # One line per model step at INFO, so following a session by its id shows each step.
    log.info(
        "session %s step %s: %s after %d attempt(s) of %s; %d input and %d output tokens; %d tool call(s)",
        request.session_id,
        request.step_id,
        "failed" if completed.error is not None else "answered",
        len(completed.attempts),
        last.provider if last else request.provider,
        sum(a.usage.input_tokens for a in completed.attempts),
        sum(a.usage.output_tokens for a in completed.attempts),
        len(completed.tool_calls),
    )
    for attempt in completed.attempts:
        provider = bounded(attempt.provider, set(providers))
        PROVIDER_ATTEMPTS.labels(provider, attempt.status).inc()
        if attempt.usage.input_tokens or attempt.usage.output_tokens:
            PROVIDER_TOKENS.labels(provider, "input").inc(attempt.usage.input_tokens)
            PROVIDER_TOKENS.labels(provider, "output").inc(attempt.usage.output_tokens)
    await faults.reached("model_step.after_report")


async def _step(
    providers: dict[str, Provider],
    transcripts: Transcripts,
    request: RequestModelStep,
    max_bytes: int | None,
    menus: ToolMenus | None = None,
) -> ModelStepCompleted:
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
    try:
        # Before any provider call: a database outage raised here pauses the consumer
        # (shared/consuming.py) with nothing billed.
        stored = await transcripts.read(request.session_id, request.transcript_length, request.transcript_digest)
    except TranscriptMismatch as mismatch:
        # Not the transcript the ledger asked for: every delivery would find the same.
        error = redact_then_cut(f"the model-step could not read the step's transcript: {mismatch}", ERROR_CHARS)
        attempts.append(ProviderAttempt(number=lost + 1, status="failed", provider=request.provider, error=error))
        return _failed(request, attempts, error)
    try:
        # Before any provider call too, and read the same way: an outage pauses the consumer.
        tools = await _tools(menus, request)
    except ToolMenuMismatch as mismatch:
        # Not the menu the ledger stored for this digest (a rewritten row): every delivery would find the same.
        error = redact_then_cut(f"the model-step could not read the step's tool menu: {mismatch}", ERROR_CHARS)
        attempts.append(ProviderAttempt(number=lost + 1, status="failed", provider=request.provider, error=error))
        return _failed(request, attempts, error)
    provider = providers.get(request.provider)
    if provider is None:
        held = ", ".join(providers) or "none"
        error = f"no provider named {request.provider!r} is configured (this model-step holds: {held})"
        attempts.append(ProviderAttempt(number=lost + 1, status="failed", provider=request.provider, error=error))
        return _failed(request, attempts, error)
    try:
        # Healed once: every attempt sends the same request (invariant 3). Ids are
        # made unique on the wire too, for transcripts stored before the normalizer.
        transcript = unique_wire_ids(heal(stored, request.session_id), request.session_id)
        # Stateless: the session's claimed provider ids come from its transcript.
        ids = ToolCallIdNormalizer.from_transcript(transcript, session_id=request.session_id)
    except Exception as broken:
        # Pure code over the request: it would fail the same way on every delivery.
        log.exception("session %s step %s: could not prepare the request", request.session_id, request.step_id)
        error = redact_then_cut(
            f"the model-step could not prepare the request: {type(broken).__name__}: {broken}", ERROR_CHARS
        )
        attempts.append(ProviderAttempt(number=lost + 1, status="failed", provider=provider.name, error=error))
        return _failed(request, attempts, error)
    error = ""
    for number in range(lost + 1, lost + MAX_ATTEMPTS + 1):
        await faults.reached("model_step.mid_call")
        try:
            reply = await provider.complete(request.session_id, transcript, tools)
            completed = _completed(request, attempts, number, provider.name, reply, ids, max_bytes)
        except Exception as raised:
            # A ProviderError says whether a retry can help; anything else a provider
            # or this code raised is counted the same way, never escaping (see above).
            failure = raised if isinstance(raised, ProviderError) else _unexpected(provider.name, raised)
            # A retry must give the same calls the same ids (invariant 2).
            ids.rollback()
            # Redacted before it is cut: the provider's keys are known to the redactor.
            error = redact_then_cut(str(failure), ERROR_CHARS)
            attempts.append(
                ProviderAttempt(
                    number=number, status="failed", provider=provider.name, usage=counted(failure.usage), error=error
                )
            )
            final = not failure.retryable or number == lost + MAX_ATTEMPTS
            log.warning(
                "session %s step %s: provider %s attempt %d failed (%s): %s",
                request.session_id,
                request.step_id,
                provider.name,
                number,
                "final" if final else "will retry",
                error,
            )
            if final:
                break
            await asyncio.sleep(backoff(number - lost, failure.retry_after))
        else:
            ids.commit()
            return completed
    return _failed(request, attempts, error or "the provider gave no usable reply")


async def _tools(menus: ToolMenus | None, request: RequestModelStep) -> list[ToolDescription]:
    """The tools the step offers: the menu its digest names, checked; a step asked for
    before menus were named carries the descriptions themselves."""
    if request.tools_digest is None:
        return request.tools
    if menus is None:
        raise ToolMenuMismatch(f"the step names the tool menu {request.tools_digest}, and this model-step reads none")
    return await menus.read(request.tools_digest)


def _completed(
    request: RequestModelStep,
    attempts: list[ProviderAttempt],
    number: int,
    provider: str,
    reply: ProviderReply,
    ids: ToolCallIdNormalizer,
    max_bytes: int | None,
) -> ModelStepCompleted:
    """The report of a completed attempt, checked as its consumer will check it: a
    report the ledger would park as invalid or oversized would leave the session
    running forever. A ProviderError (retryable: the model may answer otherwise)
    when it does not pass, with the usage billed for the reply."""
    usage = counted(getattr(reply, "usage", None))
    try:
        completed = ModelStepCompleted(
            session_id=request.session_id,
            causation_id=request.message_id,
            step_id=request.step_id,
            text=reply.text,
            tool_calls=ids.normalize(reply.tool_calls),
            attempts=[*attempts, ProviderAttempt(number=number, status="completed", provider=provider, usage=usage)],
        )
        # Nested models are not validated again on construction: read it back as the ledger will.
        body = encode(completed)
        ModelStepCompleted.model_validate_json(body)
    except Exception as error:
        raise unusable(provider, error, usage) from None
    if max_bytes is not None and len(body) > max_bytes:
        raise ProviderError(
            f"{provider}: the reply is too large to report ({len(body)} bytes; the limit is {max_bytes})",
            retryable=True,
            usage=usage,
        )
    return completed


def _unexpected(provider: str, error: Exception) -> ProviderError:
    """A provider that raised something other than a ProviderError: a retryable failure
    (bounded by MAX_ATTEMPTS) whose usage, if any was billed, is unknown."""
    said = f"{provider}: the call failed ({type(error).__name__}: {error})"
    return ProviderError(redact_then_cut(said, ERROR_CHARS), retryable=True)


def _failed(request: RequestModelStep, attempts: list[ProviderAttempt], error: str) -> ModelStepCompleted:
    """The report of a step the provider could not answer: the ledger fails the turn with `error`."""
    return ModelStepCompleted(
        session_id=request.session_id,
        causation_id=request.message_id,
        step_id=request.step_id,
        attempts=attempts,
        error=redact_then_cut(error, ERROR_CHARS),
    )


async def _send(report: Callable[[ModelStepCompleted], Awaitable[None]], completed: ModelStepCompleted) -> None:
    """Publish the report, retried on a passing broker failure: the provider was called
    and billed, and the redelivery that a failure here leads to would call it again."""
    for number in range(1, REPORT_TRIES + 1):
        try:
            await report(completed)
            return
        except Exception as error:
            if number == REPORT_TRIES:
                raise
            log.warning(
                "step %s: publishing its report failed (%r); trying again", completed.step_id, error, exc_info=True
            )
            await asyncio.sleep(backoff(number, None))
