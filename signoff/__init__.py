"""Signoff from a program's side (the SDK):

- `Client` / `AsyncClient`: the HTTP gateway's API (signoff/client.py): start
  sessions, read cards, approve or deny as the logged-in person, follow the event
  stream; answers as typed models (signoff/models.py).
- `ChannelAdapter`: an AMQP channel adapter's parts (signoff/channel.py): cards
  in, signed responses out as the channel's own broker user.
- `signoff.hooks.verify`: a hook receiver's check of a delivery's signature.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import (
    AsyncClient,
    Client,
    DecisionPending,
    ProblemError,
    Refused,
    SignoffError,
    Unauthenticated,
)
from .models import (
    Cancelled,
    Card,
    Event,
    GrantShown,
    Me,
    Pending,
    ProblemDocument,
    Revoking,
    SessionShown,
    Started,
    Verdict,
)

if TYPE_CHECKING:
    from .channel import ChannelAdapter

__all__ = [
    "AsyncClient",
    "Cancelled",
    "Card",
    "ChannelAdapter",
    "Client",
    "DecisionPending",
    "Event",
    "GrantShown",
    "Me",
    "Pending",
    "ProblemDocument",
    "ProblemError",
    "Refused",
    "Revoking",
    "SessionShown",
    "SignoffError",
    "Started",
    "Unauthenticated",
    "Verdict",
]


def __getattr__(name: str) -> Any:
    # The channel adapter needs the AMQP client; an HTTP-only program never imports it.
    if name == "ChannelAdapter":
        from .channel import ChannelAdapter

        return ChannelAdapter
    raise AttributeError(f"module 'signoff' has no attribute {name!r}")
