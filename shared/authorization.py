"""The ledger's authorization on a `tool.execute`: only the ledger decides what may
run, and the executor runs nothing it cannot verify came from the ledger
(docs/design.md, "Trust boundaries").

The ledger seals the call id, session, tool, a fingerprint of the exact
arguments, the basis (a person's approval of a request, or the catalogue's policy
that needs none) and an expiry. The executor checks the seal with the ledger's
public key and every field against the command it came with, and keeps it in its
execution claim, where the ledger checks it again before it believes the claim's
result. When it mints an approval request, the ledger also seals the call the person
is asked about (`seal_request`), kept in the request's row: the executor checks the
call's row against it, so rows rewritten in the database never run. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shared.messages import ExecuteTool
from shared.signatures import Unverified, arguments_fingerprint, seal, unseal


@dataclass(frozen=True)
class Authorization:
    call_id: str
    session_id: str
    tool: str
    arguments: str
    # "approval": a person approved `request_id`; "policy": the tool needs no approval;
    # "grant": a person's remembered approval, `grant_id`, covers the call.
    basis: Literal["approval", "policy", "grant"]
    request_id: str | None
    expires_at: datetime
    grant_id: str | None = None


Basis = Literal["approval", "policy", "grant"]


def authorize(
    key: Ed25519PrivateKey,
    command: ExecuteTool,
    *,
    basis: Basis,
    request_id: str | None,
    at: datetime,
    ttl: timedelta,
    grant_id: str | None = None,
) -> str:
    claims = {
        "call_id": command.call_id,
        "session_id": command.session_id,
        "tool": command.tool,
        "arguments": arguments_fingerprint(command.arguments),
        "basis": basis,
        "request_id": request_id,
        "expires_at": (at + ttl).isoformat(),
    }
    # Only on a grant's authorization: the others' seals stay as they were.
    if grant_id is not None:
        claims["grant_id"] = grant_id
    return seal(key, claims)


def read_authorization(key: Ed25519PublicKey, token: str) -> Authorization:
    """What an authorization token grants, if the ledger sealed it; Unverified otherwise.
    A request's seal (`seal_request`) has no basis nor expiry, so it never reads as one."""
    claims = unseal(key, token)
    try:
        return Authorization(
            call_id=claims["call_id"],
            session_id=claims["session_id"],
            tool=claims["tool"],
            arguments=claims["arguments"],
            basis=claims["basis"],
            request_id=claims.get("request_id"),
            expires_at=datetime.fromisoformat(claims["expires_at"]),
            grant_id=claims.get("grant_id"),
        )
    except (KeyError, TypeError, ValueError):
        raise Unverified("bad_signature", "the authorization's claims are incomplete") from None


def verify_authorization(key: Ed25519PublicKey, command: ExecuteTool, *, at: datetime) -> Authorization:
    """The authorization a command carries, if the ledger sealed it for exactly this
    call, tool and arguments and it has not expired; Unverified (with a reason code)
    otherwise."""
    if not command.authorization:
        raise Unverified("unauthorized", "the command carries no authorization from the ledger")
    granted = read_authorization(key, command.authorization)
    asked = (command.call_id, command.session_id, command.tool, arguments_fingerprint(command.arguments))
    if (granted.call_id, granted.session_id, granted.tool, granted.arguments) != asked:
        raise Unverified("altered", "the command is not the call the ledger authorized (call, tool or arguments)")
    if granted.expires_at <= at:
        raise Unverified("expired", f"the authorization expired at {granted.expires_at.isoformat()}")
    return granted


def authorizes_call(
    key: Ed25519PublicKey, token: str | None, *, call_id: str, session_id: str, tool: str, arguments: dict[str, Any]
) -> bool:
    """Whether `token` is the ledger's authorization of exactly this call, tool and
    arguments (the ledger checks the one an execution claim was taken under; a result
    may outlive the authorization's expiry, so expiry is not checked here)."""
    if not token:
        return False
    try:
        granted = read_authorization(key, token)
    except Unverified:
        return False
    return (granted.call_id, granted.session_id, granted.tool, granted.arguments) == (
        call_id,
        session_id,
        tool,
        arguments_fingerprint(arguments),
    )


# --- the ledger's seal on a request, made when it is minted ---------------------------

REQUEST_SEAL = "approval_request"


def seal_request(
    key: Ed25519PrivateKey, *, request_id: str, call_id: str, session_id: str, tool: str, arguments: dict[str, Any]
) -> str:
    """The ledger's signature, made when it mints a request, over the call the person
    is asked about: its id, tool and argument fingerprint. Kept in the request's row;
    the executor checks it against the call's row and the command before it claims, so
    arguments swapped in the database (which anyone with the ledger's role, or the
    SQLite file, can write) never run: re-sealing needs the ledger's private key."""
    return seal(
        key,
        {
            "sealed": REQUEST_SEAL,
            "request_id": request_id,
            "call_id": call_id,
            "session_id": session_id,
            "tool": tool,
            "arguments": arguments_fingerprint(arguments),
        },
    )


def request_seal_names(
    key: Ed25519PublicKey, token: str | None, *, request_id: str | None, call_id: str, tool: str, fingerprint: str
) -> bool:
    """Whether `token` is the ledger's seal of this request over this call, tool and arguments."""
    if not token or request_id is None:
        return False
    try:
        claims = unseal(key, token)
    except Unverified:
        return False
    named = (
        claims.get("sealed"),
        claims.get("request_id"),
        claims.get("call_id"),
        claims.get("tool"),
        claims.get("arguments"),
    )
    return named == (REQUEST_SEAL, request_id, call_id, tool, fingerprint)


# --- the ledger's seal on a grant, made when a person's approval is remembered ----------

GRANT_SEAL = "grant"


@dataclass(frozen=True)
class GrantTerms:
    """What a grant allows, as the ledger sealed it: the executor checks the grant's row
    against this seal, so a grant widened in the database (another session, tool or
    version, any target, later expiry, more approvers) authorizes nothing."""

    grant_id: str
    session_id: str
    tool: str
    tool_version: str
    target: str | None
    approvals_required: int
    expires_at: datetime | None

    def claims(self) -> dict[str, Any]:
        return {
            "sealed": GRANT_SEAL,
            "grant_id": self.grant_id,
            "session_id": self.session_id,
            "tool": self.tool,
            "tool_version": self.tool_version,
            "target": self.target,
            "approvals_required": self.approvals_required,
            "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
        }


def seal_grant(key: Ed25519PrivateKey, terms: GrantTerms) -> str:
    return seal(key, terms.claims())


def grant_seal_names(key: Ed25519PublicKey, token: str | None, terms: GrantTerms) -> bool:
    """Whether `token` is the ledger's seal of exactly these grant terms."""
    if not token:
        return False
    try:
        claims = unseal(key, token)
    except Unverified:
        return False
    return claims == terms.claims()
