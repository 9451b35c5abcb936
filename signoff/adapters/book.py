"""What a channel adapter remembers of the cards it showed: one JSON file of its own,
replaced whole on every change (`keyring.replace_private`: a reader, or the adapter after
a SIGKILL, finds the old file or the new one, never a part). A killed process loses
nothing it wrote (the kernel holds the file); what a whole machine's crash could lose
is the last write, which the adapter then reconciles (Slack: the message's metadata).

Each card's entry is the event that announced it (what a response is signed over) and
what the channel keeps of it: where it was posted, who approved so far, its outcome."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shared.keyring import replace_private
from shared.messages import EVENT
from signoff.channel import CardEvent


class CardBook:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}

    def get(self, request_id: str) -> dict[str, Any] | None:
        return self.entries.get(request_id)

    def put(self, request_id: str, entry: dict[str, Any]) -> None:
        self.entries[request_id] = entry
        replace_private(self.path, json.dumps(self.entries, sort_keys=True).encode())

    def by_call(self, call_id: str) -> str | None:
        return next((rid for rid, e in self.entries.items() if e["event"].get("call_id") == call_id), None)

    def open_ids(self) -> list[str]:
        """The cards shown and not yet closed (as far as this channel knows)."""
        return [rid for rid, entry in self.entries.items() if not entry.get("outcome")]

    @staticmethod
    def event_of(entry: dict[str, Any]) -> CardEvent:
        return EVENT.validate_python(entry["event"])
