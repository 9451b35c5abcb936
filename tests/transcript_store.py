"""A step's transcript as the model-step handler reads it, held in memory: for tests that
run the handler alone (the services read it from the ledger, shared/ledger/transcripts.py),
checked the same way (length and digest)."""

from __future__ import annotations

from shared.ledger.transcripts import checked, digest_of
from shared.messages import RequestModelStep, ToolDescription, TranscriptEntry, mint


class HeldTranscripts:
    def __init__(self) -> None:
        self.sessions: dict[str, list[dict]] = {}

    async def read(self, session_id: str, length: int, digest: str) -> list[TranscriptEntry]:
        return checked(self.sessions.get(session_id, [])[:length], length, digest)

    def step(
        self, session_id: str, entries: list[TranscriptEntry], *, provider: str, tools: list[ToolDescription],
        step_id: str | None = None,
    ) -> RequestModelStep:
        """Hold the session's transcript and return a step request naming it."""
        stored = [entry.model_dump(mode="json") for entry in entries]
        self.sessions[session_id] = stored
        return RequestModelStep(
            session_id=session_id, step_id=step_id or mint("stp"), provider=provider, tools=tools,
            transcript_length=len(stored), transcript_digest=digest_of(stored),
        )
