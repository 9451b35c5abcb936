"""`GET /v1/events` (Server-Sent Events), read line by line: the ledger's committed
events the program may see (the calls it filed among them), each with an id, its place
in the ledger's record. A stream resumes right after the last id it saw
(`Last-Event-ID`), on any gateway replica, after any restart: nothing is lost or
repeated."""

from __future__ import annotations

import json
from typing import Any

from .models import Event


class EventParser:
    """The WHATWG rules the gateway's stream uses: fields until a blank line; comments
    (heartbeats) ignored. A block with an id and no data (`since=now` begins with one,
    the place the stream starts) is an `Event` of type "" (`opened`)."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self._id: str | None = None
        self._type = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> Event | None:
        if line == "":
            event = None
            if self._id is not None:
                self.last_id = self._id
                data = json.loads("\n".join(self._data)) if self._data else {}
                event = Event(id=self._id, type=self._type if self._data else "", data=data)
            self._id, self._type, self._data = None, "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            self._id = value
        elif name == "event":
            self._type = value
        elif name == "data":
            self._data.append(value)
        return None


def call_of(event: Event) -> str | None:
    """The Signoff call an event is about, if any (`call_id`)."""
    call: Any = event.data.get("call_id")
    return call if isinstance(call, str) else None
