"""What a program outside Signoff uses to work with it: `signoff.Client` and
`signoff.AsyncClient` (the HTTP gateway's API, signoff/client.py) and
`signoff.hooks.verify`, a hook receiver's check of a delivery's signature."""

from signoff.client import AsyncClient, Card, Client, Event, Pending, Problem, SessionView, Started, Verdict

__all__ = ["AsyncClient", "Card", "Client", "Event", "Pending", "Problem", "SessionView", "Started", "Verdict"]
