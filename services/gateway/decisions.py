"""The one decision path: approve, deny or answer a card as the person or program logged in.

The API's `POST /v1/requests/{id}/decision` and the inbox's decision form both call
`decide`, so a decision from a page is the same message, signed the same way, judged by
the same ledger, as one sent to the JSON API. Its ids follow from who asks and their
Idempotency-Key (`response_ids`): the same key and body answers the same outcome and
sends nothing twice.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fastapi.responses import JSONResponse

from shared.messages import Remember

from .bodies import DecisionBody, Pending, Verdict
from .callers import Caller, Gateway, not_found
from .problems import Problem, problem_response

# Ledger refusals that say the person may not do this (403); any other is a conflict with the state (409).
FORBIDDEN = {
    "not_an_approver",
    "starter_may_not_approve",
    "starter_unknown",
    "wrong_principal",
    "anonymous_approval",
    "unauthorized_sender",
}


async def decide(gateway: Gateway, who: Caller, request_id: str, body: DecisionBody, idempotency_key: str) -> Any:
    """The ledger's verdict on this decision (a Verdict, or a problem naming its reason
    code), or 202 and a link to poll when it takes longer than the gateway's wait."""
    found = await gateway.ledger.request(request_id)
    # A card the caller may not see is answered as one that does not exist (no oracle).
    if found is None or not await gateway.ledger.may_see_request(who.user, found):
        raise not_found("request")
    # The response id follows from who asks and their key (the ledger takes one response
    # per id: `replayed`); the message id also from what they ask, so the same key and
    # body is the same message (the ledger's inbox drops it) and another body is refused.
    message_id, response_id = response_ids(who.user.name, idempotency_key, asked(request_id, body))
    earlier = await gateway.ledger.verdict(found.session_id, message_id)
    if earlier is None:
        signed = gateway.signer.respond(
            message_id=message_id,
            response_id=response_id,
            session_id=found.session_id,
            request_id=found.id,
            decision=body.decision,
            args_digest=body.args_digest or found.args_digest,
            reason=body.reason,
            message=body.message,
            responder=who.user.name,
            edited_arguments=body.arguments if body.decision == "approve" else None,
            remember=None if body.remember is None else Remember(**body.remember.model_dump()),
        )
        wait = gateway.settings.gateway_decision_wait_seconds
        earlier = await gateway.watch.verdict(found.session_id, message_id, wait, lambda: gateway.send(signed))
    if earlier is None:
        return pending(request_id, response_id, message_id)
    return answer(earlier)


async def decided(gateway: Gateway, who: Caller, request_id: str, message_id: str) -> Any:
    """The ledger's verdict on a decision answered 202 (the link it gave), for whoever sent it."""
    found = await gateway.ledger.request(request_id)
    if found is None or not message_id.startswith("msg_") or not await gateway.ledger.may_see_request(who.user, found):
        raise not_found("decision")
    earlier = await gateway.ledger.verdict(found.session_id, message_id)
    if earlier is not None and earlier.actor != who.user.name:
        raise not_found("decision")
    if earlier is None:
        return pending(request_id, response_of(message_id), message_id)
    return answer(earlier)


def response_ids(principal: str, key: str, what: str) -> tuple[str, str]:
    """The message and response ids of a decision: the response id from (principal, key)
    alone, so a key answers at most once (the ledger refuses a response id used before,
    `replayed`); the message id from what is asked too (`asked`), so only the same
    request and body repeat the first message (IETF idempotency-key draft: a key reused
    with another body is refused, 422)."""
    keyed = hashlib.sha256(b"signoff-gateway-response\0" + principal.encode() + b"\0" + key.encode()).hexdigest()
    message = hashlib.sha256(keyed.encode() + b"\0" + what.encode()).hexdigest()
    # The message id begins with the response id's digits (`response_of`): a poll finds both.
    return f"msg_{keyed[:28]}{message[:32]}", f"rsp_{keyed[:28]}"


def response_of(message_id: str) -> str:
    return "rsp_" + message_id[4:32]


def asked(request_id: str, body: DecisionBody) -> str:
    """The request and the body as one canonical text: every field counts (the message,
    the digest, edited arguments, a remember)."""
    return json.dumps([request_id, body.model_dump(mode="json")], sort_keys=True, separators=(",", ":"))


def pending(request_id: str, response_id: str, message_id: str) -> JSONResponse:
    return JSONResponse(
        Pending(
            response_id=response_id,
            request_id=request_id,
            status="pending",
            links={"poll": f"/v1/requests/{request_id}/decision/{message_id}"},
        ).model_dump(),
        status_code=202,
    )


def answer(entry) -> Any:
    """The ledger's verdict as an HTTP answer: the accepted response, or a problem naming its reason code."""
    detail = entry.detail or {}
    if entry.kind == "response.rejected" and detail.get("reason_code") == "replayed":
        # The gateway's response ids follow from keys: the key answered something else before.
        return problem_response(
            Problem(
                422,
                "idempotency-key-reused",
                "Idempotency-Key used for another decision",
                "This key already answered a different request or body; send a new key.",
            )
        )
    if entry.kind == "response.rejected":
        code = str(detail.get("reason_code", "refused"))
        return problem_response(
            Problem(
                403 if code in FORBIDDEN else 409,
                code.replace("_", "-"),
                "Refused by the ledger",
                str(detail.get("reason_text", "")),
                reason_code=code,
                response_id=detail.get("response_id"),
            )
        )
    return Verdict(
        response_id=str(detail.get("response_id", "")),
        request_id=entry.subject or "",
        decision=detail.get("decision", "approve"),
        responder=entry.actor or "",
        outcome="accepted",
        decided=detail.get("count") is None,
        approvals=detail.get("count"),
        approvals_required=detail.get("required"),
    )
