"""`GET /v1/events`: the ledger's committed events as Server-Sent Events.

Every event's id is its place in the ledger's record, `<txid>.<outbox id>` (reads.py
`events_after`), so any replica, after any restart, resumes a stream right after the
id a client last saw (`Last-Event-ID`): no event is lost or repeated. The stream
holds nothing of its own but its cursor. A caller is sent only the events they may
see (`visible`); the cursor moves past the others. Comment lines every
`gateway_heartbeat_seconds` keep proxies from closing an idle stream.

A stream lasts only as long as its login (auth.OpenStreams): when the login ends (a
logout on any replica, `signoff user remove`, a password reset, `signoff token revoke`,
or its time is up) the stream sends nothing more and ends within a second.
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response
from sse_starlette import EventSourceResponse

from .auth import Login
from .bodies import PROBLEMS
from .callers import State, Who
from .problems import Problem
from .reads import _escalated, may_approve
from .users import User
from .watch import Row

APPROVAL_EVENTS = ("approval.",)
router = APIRouter(tags=["events"])


@router.get(
    "/v1/events",
    responses={**PROBLEMS, 200: {"content": {"text/event-stream": {}}}},
    response_class=Response,
)
async def events(
    gateway: State,
    who: Who,
    last_event_id: Annotated[str | None, Header(max_length=64)] = None,
    since: Annotated[Literal["start", "now"], Query()] = "start",
) -> Response:
    """Server-Sent Events of every event the caller may see, in the ledger's commit
    order, each with an id; `Last-Event-ID` resumes right after it, on any replica.
    Without one the stream starts at the ledger's beginning (`since=start`), or with
    what is committed from now on (`since=now`: its first message is the id to resume
    from, with no event, so a reconnect before any event misses nothing)."""
    return await stream(gateway, who.user, last_event_id, since, login=who.login)


# `<txid>.<outbox id>`, each as this stream writes it: ASCII digits, no sign, no `_`,
# no leading zero, within a 64-bit column (`int` alone takes " 7", "+7", "1_0" and "١").
EVENT_ID = re.compile(r"(0|[1-9][0-9]{0,18})\.(0|[1-9][0-9]{0,18})")
BIGINT = 2**63 - 1


def parse_cursor(last_event_id: str | None) -> tuple[int, int]:
    if not last_event_id:
        return (0, 0)
    matched = EVENT_ID.fullmatch(last_event_id)
    cursor = (int(matched.group(1)), int(matched.group(2))) if matched else None
    if cursor is None or max(cursor) > BIGINT:
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


async def stream(
    gateway, user: User, last_event_id: str | None, since: str | None = None, *, login: Login
) -> EventSourceResponse:
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
        with watch.stream(), gateway.logins.streams.watching(login) as ended:
            if from_now:
                cursor = await watch.newest()
                yield {"id": f"{cursor[0]}.{cursor[1]}", "comment": "from now"}
            while not ended.is_set():
                rows = watch.rows_after(cursor)
                if rows is None:  # behind what the process's tail keeps: read the ledger
                    found = await gateway.ledger.events_after(cursor)
                    rows = [Row(int(r[0]), int(r[1]), r[2], r[3], r[4]) for r in found]
                for row in rows:
                    if ended.is_set():
                        return  # the login ended: not one event more
                    cursor = row.cursor
                    body = row.loaded()
                    if await seeing.visible(row.session_id, row.message_type, body):
                        yield {"id": f"{cursor[0]}.{cursor[1]}", "event": row.message_type, "data": row.shown()}
                if not rows:
                    seeing.forget_refusals()
                    await changed_or_ended(watch, ended, settings.gateway_heartbeat_seconds)

    return EventSourceResponse(events(), ping=settings.gateway_heartbeat_seconds, headers={"Cache-Control": "no-store"})


async def changed_or_ended(watch, ended: asyncio.Event, timeout: float) -> None:
    """Until the tail has new rows, the login has ended, or `timeout`."""
    waits = [asyncio.ensure_future(watch.changed(timeout)), asyncio.ensure_future(ended.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
