"""`GET /v1/events`: the ledger's committed events as Server-Sent Events.

Every event's id is its place in the ledger's record, `<txid>.<outbox id>` (reads.py
`events_after`), so any replica, after any restart, resumes a stream right after the
id a client last saw (`Last-Event-ID`): no event is lost or repeated. The stream
holds nothing of its own but its cursor. A caller is sent only the events they may
see (`visible`); the cursor moves past the others. Comment lines every
`gateway_heartbeat_seconds` keep proxies from closing an idle stream.
"""

from __future__ import annotations

from typing import Any

from sse_starlette import EventSourceResponse

from .problems import Problem
from .reads import _escalated, may_approve
from .users import User
from .watch import Row

APPROVAL_EVENTS = ("approval.",)


def parse_cursor(last_event_id: str | None) -> tuple[int, int]:
    if not last_event_id:
        return (0, 0)
    try:
        txid, row = last_event_id.split(".")
        cursor = (int(txid), int(row))
    except ValueError:
        raise Problem(400, "bad-event-id", "Last-Event-ID is not an event id of this stream") from None
    if cursor[0] < 0 or cursor[1] < 0:
        raise Problem(400, "bad-event-id", "Last-Event-ID is not an event id of this stream")
    return cursor


class Visibility:
    """Whom an event concerns, as `GET /v1/requests` and `GET /v1/sessions/{id}` judge it:
    an operator sees all; others the sessions they started, and the approval events of
    requests they may approve."""

    def __init__(self, gateway, user: User) -> None:
        self.ledger = gateway.ledger
        self.user = user
        self.sessions: dict[str, bool] = {}
        self.requests: dict[str, bool] = {}

    async def session(self, session_id: str) -> bool:
        if session_id not in self.sessions:
            self.sessions[session_id] = await self.ledger.may_see_session(self.user, session_id)
        return self.sessions[session_id]

    async def visible(self, session_id: str, message_type: str, body: dict[str, Any]) -> bool:
        if self.user.operator or await self.session(session_id):
            return True
        request_id = body.get("request_id")
        if not message_type.startswith(APPROVAL_EVENTS) or not request_id:
            return False
        if request_id not in self.requests:
            request = await self.ledger.request(request_id)
            self.requests[request_id] = request is not None and may_approve(
                self.ledger.catalogue, self.user, request.card.get("tool", ""), _escalated(request)
            )
        return self.requests[request_id]

    def forget_refusals(self) -> None:
        """A session may become theirs (a turn they start): what was refused is asked again."""
        self.sessions = {k: v for k, v in self.sessions.items() if v}


async def stream(gateway, user: User, last_event_id: str | None, since: str | None = None) -> EventSourceResponse:
    """The stream after `last_event_id`; without one, from the ledger's beginning, or from
    now (`since=now`: the first thing sent is an id alone, the resume point, so a client
    that reconnects before any event it may see still resumes exactly there)."""
    cursor = parse_cursor(last_event_id)
    watch = gateway.watch
    from_now = not last_event_id and since == "now"
    settings = gateway.settings
    seeing = Visibility(gateway, user)

    async def events():
        nonlocal cursor
        with watch.stream():
            if from_now:
                cursor = await watch.newest()
                yield {"id": f"{cursor[0]}.{cursor[1]}", "comment": "from now"}
            while True:
                rows = watch.rows_after(cursor)
                if rows is None:  # behind what the process's tail keeps: read the ledger
                    found = await gateway.ledger.events_after(cursor)
                    rows = [Row(int(r[0]), int(r[1]), r[2], r[3], r[4]) for r in found]
                for row in rows:
                    cursor = row.cursor
                    body = row.loaded()
                    if await seeing.visible(row.session_id, row.message_type, body):
                        yield {"id": f"{cursor[0]}.{cursor[1]}", "event": row.message_type, "data": row.shown()}
                if not rows:
                    seeing.forget_refusals()
                    await watch.changed(settings.gateway_heartbeat_seconds)

    return EventSourceResponse(events(), ping=settings.gateway_heartbeat_seconds, headers={"Cache-Control": "no-store"})
