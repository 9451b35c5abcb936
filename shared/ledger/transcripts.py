"""The transcript as a model step reads it: by reference, from the ledger (claim-check).

A `step.requested` names the session, how many transcript entries the step is for
and their digest, instead of carrying them: the transcript is stored once, in the
`transcript` table, and every step's command and outbox row stays the same size
however long the session grows. The model-step reads the entries with its own
read-only role and checks the digest, so a redelivered step sees exactly the prefix
the ledger asked for (entries are append-only: positions 1..n never change).

The digest is a chain, kept on the session row: each appended entry extends it, so
the ledger never re-reads the transcript to name it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.ledger import driver
from shared.ledger.tables import TABLES
from shared.messages import TranscriptEntry

TRANSCRIPT = TABLES["transcript"]
# The digest of an empty transcript.
EMPTY = "sha256:" + hashlib.sha256(b"signoff transcript").hexdigest()


def extended(digest: str, entry: dict[str, Any]) -> str:
    """The digest of a transcript after appending `entry` (as stored: its JSON-mode dump).
    Sorted keys, no spaces: the ledger and the model-step make the same bytes (both
    Python; not RFC 8785, which refuses integers past 2**53 that a model may send)."""
    body = json.dumps(entry, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(digest.encode() + b"\n" + body.encode()).hexdigest()


def digest_of(entries: Iterable[dict[str, Any]]) -> str:
    digest = EMPTY
    for entry in entries:
        digest = extended(digest, entry)
    return digest


class TranscriptMismatch(Exception):
    """The ledger's rows are not the transcript the step was asked for: it fails the same
    way on every delivery, so the step reports it instead of being redelivered."""


_ENTRIES = (
    select(TRANSCRIPT.c.entry)
    .where(TRANSCRIPT.c.session_id == bindparam("session_id"), TRANSCRIPT.c.position <= bindparam("upto"))
    .order_by(TRANSCRIPT.c.position)
)


class LedgerTranscripts:
    """Reads a step's transcript from the ledger (the model-step's role may only read it)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def read(self, session_id: str, length: int, digest: str) -> list[TranscriptEntry]:
        async with self.engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                # Outside a transaction: SQLAlchemy's execution would add a BEGIN and a
                # ROLLBACK around it and cost more CPU than the read (a third of the
                # model-step's time per step, profiled). One statement sees one
                # snapshot, and entries are append-only.
                found = await driver.fetch(conn, _ENTRIES, {"session_id": session_id, "upto": length})
                rows = [record.entry for record in found]
            else:
                rows = list(await conn.scalars(_ENTRIES, {"session_id": session_id, "upto": length}))
        return checked(rows, length, digest)


def checked(rows: list[dict[str, Any]], length: int, digest: str) -> list[TranscriptEntry]:
    """The entries, if they are the `length` entries whose digest is `digest`."""
    if len(rows) != length:
        raise TranscriptMismatch(f"the ledger holds {len(rows)} of the {length} transcript entries asked for")
    found = digest_of(rows)
    if found != digest:
        raise TranscriptMismatch(f"the transcript's digest is {found}, not {digest} as asked for")
    try:
        return [TranscriptEntry.model_validate(row) for row in rows]
    except ValidationError as broken:
        raise TranscriptMismatch(f"a stored entry is not a transcript entry: {broken}") from None
