"""`/v1/sessions` and `/v1/grants`: start a turn, read a session, cancel it, its grants."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header

from shared.messages import CancelTurn, RevokeGrant, StartTurn

from . import turns
from .bodies import PROBLEMS, CancelBody, Cancelled, Grants, RevokeBody, Revoking, SessionShown, StartBody, Started
from .callers import Caller, Changer, Identifier, Reader, State, Who, not_found
from .reads import Ledger, may_approve

router = APIRouter(tags=["sessions"], responses=PROBLEMS)
OptionalKey = Annotated[str | None, Header(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]


async def seen_session(ledger: Ledger, who: Caller, session_id: str) -> dict[str, Any]:
    """The session as its page and the API show it: for whoever started it, and operators
    (to anyone else, one that does not exist)."""
    shown = await ledger.session(session_id)
    if shown is None or not await ledger.may_see_session(who.user, session_id):
        raise not_found("session")
    return shown


@router.post("/v1/sessions", status_code=202, response_model=Started)
async def start_session(body: StartBody, gateway: State, who: Changer, idempotency_key: OptionalKey = None) -> Started:
    """Start a turn, started by the caller: in a new session, or in `session_id`'s once it
    is idle (else 409, naming its open turn). With an Idempotency-Key, a repeat is
    answered with the turn that key started (`repeated`), never a second one."""
    session_id = body.session_id or turns.new_session_id(who.user.name, idempotency_key)
    # A new turn in an existing session only for whoever may see it (its starters, operators).
    exists = body.session_id is not None and await gateway.ledger.session(session_id) is not None
    if exists and not await gateway.ledger.may_see_session(who.user, session_id):
        raise not_found("session")
    turn = StartTurn(
        session_id=session_id,
        text=body.text,
        provider=body.provider,
        started_by=who.user.name,
        idempotency_key=idempotency_key,
    )
    turn_id, repeated = await turns.start(gateway, turn)
    return Started(
        session_id=turn.session_id,
        message_id=turn.message_id,
        links={"session": f"/v1/sessions/{turn.session_id}"},
        turn_id=turn_id,
        repeated=repeated,
    )


@router.get("/v1/sessions/{session_id}", response_model=SessionShown)
async def show_session(session_id: Identifier, ledger: Reader, who: Who) -> dict[str, Any]:
    """Status, transcript (as the card shows it), pending requests and usage: for
    whoever started it, and operators."""
    return await seen_session(ledger, who, session_id)


@router.post("/v1/sessions/{session_id}/cancel", status_code=202, response_model=Cancelled)
async def cancel_session(session_id: Identifier, body: CancelBody, gateway: State, who: Changer) -> Cancelled:
    """Cancel the session's open turn, as the caller (the ledger judges whether they may)."""
    if await gateway.ledger.session(session_id) is None or not await gateway.ledger.may_see_session(
        who.user, session_id
    ):
        raise not_found("session")
    cancel = CancelTurn(session_id=session_id, reason=body.reason, cancelled_by=who.user.name)
    await gateway.send(cancel)
    return Cancelled(session_id=session_id, message_id=cancel.message_id)


# --- grants (approve and remember) ------------------------------------------------------


@router.get("/v1/sessions/{session_id}/grants", response_model=Grants)
async def list_grants(session_id: Identifier, ledger: Reader, who: Who) -> dict[str, Any]:
    """The session's remembered approvals, live or not: for whoever started it, and operators."""
    if await ledger.session(session_id) is None or not await ledger.may_see_session(who.user, session_id):
        raise not_found("session")
    return {"grants": await ledger.grants(session_id)}


@router.post("/v1/grants/{grant_id}/revoke", status_code=202, response_model=Revoking)
async def revoke_grant(grant_id: Identifier, body: RevokeBody, gateway: State, who: Changer) -> Revoking:
    """Revoke a remembered approval, as the caller (the ledger judges whether they may):
    every call decided after it asks a person again."""
    grant = await gateway.ledger.grant(grant_id)
    if grant is None or not (
        await gateway.ledger.may_see_session(who.user, grant.session_id)
        or may_approve(gateway.ledger.catalogue, who.user, grant.tool, False)
    ):
        raise not_found("grant")
    revoke = RevokeGrant(session_id=grant.session_id, grant_id=grant_id, reason=body.reason, revoked_by=who.user.name)
    await gateway.send(revoke)
    return Revoking(grant_id=grant_id, message_id=revoke.message_id)
