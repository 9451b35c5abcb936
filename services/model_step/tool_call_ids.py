"""Provider tool-call ids made unique per session (invariant 2).

Signoff never keys anything on a provider's tool-call id (it mints its own call
and request ids), but the id goes back to the provider as the correlation
between a call and its result. Some OpenAI-compatible servers renumber ids on
every response (`Bash_0`, `Bash_1`, ... from 0 again), so two different calls in
one transcript share an id; strict providers then reject the request, and a
lenient one may pair a result with the wrong call.

The rule: the first occurrence of an id in a session keeps it. A later one, in
a later response or the same response, becomes `<id>__<n>` with the smallest
n >= 2 not yet claimed, so the second `Bash_0` is `Bash_0__2`, the third
`Bash_0__3`. The rewrite depends only on the claimed set and the order of the
calls, so the same transcript and the same reply always give the same ids.

Every id stays within MAX_ID_LENGTH, the limit of a reported call's id
(`ProposedToolCall.provider_call_id`): a report with a longer one would be refused
as invalid and the session would wait forever. A longer id from a provider is cut
to the limit, and a suffix replaces the end of an id at the limit
(`<id cut short>__2`); the smallest free n still decides, so the result stays
unique and the same for the same claimed set and calls.

The model-step is stateless: it builds a normalizer from the stored transcript
on every request. Within a request, claims made by an attempt that then fails
are rolled back, so the retry gets the same ids as if the failed attempt had
never happened.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TypeVar

from shared.messages import ProposedToolCall, TranscriptCall, TranscriptEntry

Call = TypeVar("Call", ProposedToolCall, TranscriptCall)

log = logging.getLogger("signoff.model_step.ids")

# ProposedToolCall.provider_call_id's max_length: what a step report may carry.
MAX_ID_LENGTH: int = next(
    m.max_length for m in ProposedToolCall.model_fields["provider_call_id"].metadata if hasattr(m, "max_length")
)


def fit(provider_call_id: str) -> str:
    """The id cut to MAX_ID_LENGTH (unchanged when it fits)."""
    return provider_call_id[:MAX_ID_LENGTH]


def suffixed(provider_call_id: str, n: int) -> str:
    """`<id>__<n>`, the id cut short as much as the suffix needs to stay within MAX_ID_LENGTH."""
    suffix = f"__{n}"
    return fit(provider_call_id)[: MAX_ID_LENGTH - len(suffix)] + suffix


class ToolCallIdNormalizer:
    def __init__(self, claimed: Iterable[str] = (), *, session_id: str = "") -> None:
        self.session_id = session_id
        self._claimed: set[str] = set(claimed)
        self._pending: set[str] = set()

    @classmethod
    def from_transcript(cls, transcript: Iterable[TranscriptEntry], *, session_id: str = "") -> ToolCallIdNormalizer:
        """Seeded with every provider id the session's assistant messages already use."""
        return cls(
            (call.provider_call_id for entry in transcript if entry.role == "assistant" for call in entry.tool_calls),
            session_id=session_id,
        )

    def is_claimed(self, provider_call_id: str) -> bool:
        return provider_call_id in self._claimed or provider_call_id in self._pending

    def normalize(self, calls: Iterable[Call]) -> list[Call]:
        """The calls with unique ids, claimed for the current attempt (see commit and rollback)."""
        normalized = []
        for call in calls:
            assigned = fit(call.provider_call_id)
            if self.is_claimed(assigned):
                n = 2
                while self.is_claimed(suffixed(call.provider_call_id, n)):
                    n += 1
                assigned = suffixed(call.provider_call_id, n)
                log.info(
                    "session %s: provider reused tool-call id %s; rewritten to %s",
                    self.session_id,
                    call.provider_call_id,
                    assigned,
                )
            if assigned != call.provider_call_id:
                call = call.model_copy(update={"provider_call_id": assigned})
            self._pending.add(assigned)
            normalized.append(call)
        return normalized

    def commit(self) -> None:
        """The current attempt succeeded: its ids are the session's for good."""
        self._claimed |= self._pending
        self._pending = set()

    def rollback(self) -> None:
        """The current attempt failed: its ids are free again for the retry."""
        self._pending = set()


def unique_wire_ids(transcript: list[TranscriptEntry], session_id: str = "") -> list[TranscriptEntry]:
    """The transcript with the same rule applied to the calls it already holds.

    Calls stored before this normalizer existed may share a provider id, and a
    strict provider rejects such a request on every turn. The rewrite is made
    in transcript order, so a stored id never changes once it is unique, and
    each result follows its call's new id (by Signoff's call id, or for results
    without one, by position in the run of results after the call, which is
    where the guard puts them). Run it on the guard's output. Healthy
    transcripts come back unchanged.
    """
    normalizer = ToolCallIdNormalizer(session_id=session_id)
    out: list[TranscriptEntry] = []
    wire_ids: dict[str, str] = {}
    run: list[str] = []  # wire ids of the last assistant message's calls, by position
    run_position = 0
    for entry in transcript:
        if entry.role == "assistant":
            calls = normalizer.normalize(entry.tool_calls)
            normalizer.commit()
            wire_ids.update((c.call_id, c.provider_call_id) for c in calls)
            run, run_position = [c.provider_call_id for c in calls], 0
            if calls != entry.tool_calls:
                entry = entry.model_copy(update={"tool_calls": calls})
        elif entry.role == "tool":
            wire = wire_ids.get(entry.call_id or "") or (run[run_position] if run_position < len(run) else None)
            run_position += 1
            if wire is not None and wire != entry.provider_call_id:
                entry = entry.model_copy(update={"provider_call_id": wire})
        else:
            run = []
        out.append(entry)
    return out
