"""`/v1/requests`: the cards a caller may see, and their decisions (decisions.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query

from shared.ledger.pages import BadCursor

from . import decisions
from .bodies import ID, PROBLEMS, Card, Cards, DecisionBody, Pending, Verdict
from .callers import Caller, Changer, Identifier, Reader, State, Who, not_found
from .problems import Problem
from .reads import Ledger

router = APIRouter(prefix="/v1/requests", tags=["requests"], responses=PROBLEMS)
IdempotencyKey = Annotated[str, Header(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]


async def card_for(ledger: Ledger, who: Caller, request_id: str) -> dict[str, Any]:
    """The card as the caller may see it; one they may not see is one that does not exist."""
    found = await ledger.request(request_id)
    if found is None or not await ledger.may_see_request(who.user, found):
        raise not_found("request")
    return await ledger.card(found)


@router.get("", response_model=Cards)
async def list_requests(
    ledger: Reader,
    who: Who,
    status: Annotated[
        Literal["pending", "approved", "denied", "answered", "expired", "cancelled", "altered"] | None, Query()
    ] = None,
    tool: Annotated[str | None, Query(max_length=256)] = None,
    session_id: Annotated[str | None, Query(pattern=ID)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> dict[str, Any]:
    """The cards the caller may see: those they may approve and those of sessions they started
    (operators: all), oldest first, a page of at most `limit`; `next` is the cursor of the page after."""
    try:
        cards, following = await ledger.requests(who.user, status, tool, session_id, limit, cursor)
    except BadCursor as error:
        raise Problem(400, "bad-cursor", "Not a cursor", "Pass back a `next` this gateway gave.") from error
    return {"requests": cards, "next": following}


@router.get("/{request_id}", response_model=Card)
async def show_request(request_id: Identifier, ledger: Reader, who: Who) -> dict[str, Any]:
    return await card_for(ledger, who, request_id)


@router.post("/{request_id}/decision", response_model=Verdict, responses={202: {"model": Pending}})
async def decide(
    request_id: Identifier, body: DecisionBody, gateway: State, who: Changer, idempotency_key: IdempotencyKey
) -> Any:
    """Approve or deny, as the caller, with an Idempotency-Key: the same key answers the
    same outcome and sends nothing twice. Answers the ledger's verdict once it has
    decided (refusals as problems naming the ledger's reason code), or 202 and a link
    to poll when that takes longer than a few seconds."""
    return await decisions.decide(gateway, who, request_id, body, idempotency_key)


@router.get("/{request_id}/decision/{message_id}", response_model=Verdict, responses={202: {"model": Pending}})
async def poll_decision(request_id: Identifier, message_id: Identifier, gateway: State, who: Who) -> Any:
    """The ledger's verdict on a decision answered 202 (the link it gave)."""
    return await decisions.decided(gateway, who, request_id, message_id)
