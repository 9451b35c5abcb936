"""The transcript guard (invariant 3): no model request carries a tool call
without its result.

The ledger writes every closure next to its call before it asks for the next
step, so on a healthy transcript this is a pass-through. It exists for the
transcripts that are not healthy (an old database, a bug elsewhere, a crash we
did not foresee): a provider answers those with HTTP 400 on every turn, and a
session that can only ever get 400 is dead. Healing the request instead of
failing it turns a dead session into one whose model is told, honestly, that a
call has no result.

Pure: it returns a new list and never touches the stored transcript; the same
broken transcript heals the same way on every request.
"""

from __future__ import annotations

import logging
from itertools import takewhile

from shared.messages import TranscriptCall, TranscriptEntry

log = logging.getLogger("signoff.model_step.guard")

NEVER_CLOSED = (
    "Error: this tool call was never closed; Signoff holds no result for it, so whether it ran is "
    "unknown. Do not assume it succeeded."
)


def _is_result_for(entry: TranscriptEntry, call: TranscriptCall) -> bool:
    if entry.call_id is not None:
        return entry.call_id == call.call_id
    # Results written before Signoff minted call ids can only be matched by the
    # provider's id.
    return entry.provider_call_id is not None and entry.provider_call_id == call.provider_call_id


def _is_terminal(entry: TranscriptEntry) -> bool:
    return entry.role == "tool" and bool(entry.closure)


def never_closed(call: TranscriptCall) -> TranscriptEntry:
    return TranscriptEntry(
        role="tool", call_id=call.call_id, provider_call_id=call.provider_call_id, text=NEVER_CLOSED, closure="error"
    )


def heal(transcript: list[TranscriptEntry], session_id: str) -> list[TranscriptEntry]:
    """The transcript with exactly one terminal result right after each assistant
    message for each of its calls, in call order.

    - A result found in the run of tool entries after its call stays (in call order).
    - A result found anywhere else (after a user message, say) is moved next to its call.
    - A call with no result gets an error result, placed next to it.
    - A tool entry that closes no call (unknown call, a second result for the
      same call, or no closure kind) is dropped.
    Every move, insertion and drop is logged as a warning with the session and call ids.
    """
    tool_indices = [i for i, e in enumerate(transcript) if e.role == "tool"]
    # Each call of each assistant message, keyed by (message position, call position).
    calls = {
        (index, n): call
        for index, entry in enumerate(transcript)
        if entry.role == "assistant"
        for n, call in enumerate(entry.tool_calls)
    }
    placed: dict[tuple[int, int], int] = {}  # call -> position of its result
    taken: set[int] = set()

    def take(key: tuple[int, int], among: list[int]) -> None:
        found = next(
            (
                j
                for j in among
                if j not in taken and _is_terminal(transcript[j]) and _is_result_for(transcript[j], calls[key])
            ),
            None,
        )
        if found is not None:
            placed[key] = found
            taken.add(found)

    # First every call keeps a result found in the run of tool entries right after its
    # message, before any call looks elsewhere: a provider id reused by another call,
    # earlier or later, cannot take that result away from it.
    for key in calls:
        take(key, list(takewhile(lambda j: transcript[j].role == "tool", range(key[0] + 1, len(transcript)))))
    kept = set(placed)
    # Then a call still without a result takes one found anywhere else: it is moved.
    for key in calls:
        if key not in kept:
            take(key, tool_indices)

    healed: list[TranscriptEntry] = []
    for index, entry in enumerate(transcript):
        if entry.role == "tool":
            continue  # placed with its call below, or dropped
        healed.append(entry)
        if entry.role != "assistant":
            continue
        for n, call in enumerate(entry.tool_calls):
            found = placed.get((index, n))
            if found is None:
                log.warning(
                    "session %s: tool call %s (provider id %s, %s) has no result; "
                    "closing it with an error for this request (invariant 3)",
                    session_id,
                    call.call_id,
                    call.provider_call_id,
                    call.name,
                )
                healed.append(never_closed(call))
                continue
            if (index, n) not in kept:
                log.warning(
                    "session %s: the result of tool call %s (provider id %s) was not next to its call; "
                    "moved it there (invariant 3)",
                    session_id,
                    call.call_id,
                    call.provider_call_id,
                )
            healed.append(transcript[found])
    for j in tool_indices:
        if j not in taken:
            entry = transcript[j]
            log.warning(
                "session %s: dropped a tool entry at position %d that closes no call in this transcript "
                "(call %s, provider id %s, closure %s)",
                session_id,
                j,
                entry.call_id,
                entry.provider_call_id,
                entry.closure,
            )
    return healed
