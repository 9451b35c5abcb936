"""The ledger's authorization on a `tool.execute`: only the ledger decides what may
run, and the executor runs nothing it cannot verify came from the ledger
(docs/design.md, "Trust boundaries").

The ledger seals the call id, session, tool, a fingerprint of the exact
arguments, the basis (a person's approval of a request, or the catalogue's policy
that needs none) and an expiry. The executor checks the seal with the ledger's
public key and every field against the command it came with. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shared.messages import ExecuteTool
from shared.signatures import Unverified, arguments_fingerprint, seal, unseal


@dataclass(frozen=True)
class Authorization:
    call_id: str
    session_id: str
    tool: str
    arguments: str
    # "approval": a person approved `request_id`; "policy": the tool needs no approval.
    basis: Literal["approval", "policy"]
    request_id: str | None
    expires_at: datetime


def authorize(
    key: Ed25519PrivateKey,
    command: ExecuteTool,
    *,
    basis: Literal["approval", "policy"],
    request_id: str | None,
    at: datetime,
    ttl: timedelta,
) -> str:
    return seal(
        key,
        {
            "call_id": command.call_id,
            "session_id": command.session_id,
            "tool": command.tool,
            "arguments": arguments_fingerprint(command.arguments),
            "basis": basis,
            "request_id": request_id,
            "expires_at": (at + ttl).isoformat(),
        },
    )


def verify_authorization(key: Ed25519PublicKey, command: ExecuteTool, *, at: datetime) -> Authorization:
    """The authorization a command carries, if the ledger sealed it for exactly this
    call, tool and arguments and it has not expired; Unverified (with a reason code)
    otherwise."""
    if not command.authorization:
        raise Unverified("unauthorized", "the command carries no authorization from the ledger")
    claims = unseal(key, command.authorization)
    try:
        granted = Authorization(
            call_id=claims["call_id"],
            session_id=claims["session_id"],
            tool=claims["tool"],
            arguments=claims["arguments"],
            basis=claims["basis"],
            request_id=claims.get("request_id"),
            expires_at=datetime.fromisoformat(claims["expires_at"]),
        )
    except (KeyError, TypeError, ValueError):
        raise Unverified("bad_signature", "the authorization's claims are incomplete") from None
    asked = (command.call_id, command.session_id, command.tool, arguments_fingerprint(command.arguments))
    if (granted.call_id, granted.session_id, granted.tool, granted.arguments) != asked:
        raise Unverified("altered", "the command is not the call the ledger authorized (call, tool or arguments)")
    if granted.expires_at <= at:
        raise Unverified("expired", f"the authorization expired at {granted.expires_at.isoformat()}")
    return granted
