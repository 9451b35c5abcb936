"""What only the ledger can do, with the keys only it holds: compute a request's
digest, seal a request's call and an authorization for the executor, check that an
execution claim was taken under its authorization, and know the channels that may
speak for people (their public keys)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shared import keyring
from shared.authorization import Basis, GrantTerms, authorize, authorizes_call, seal_grant, seal_request
from shared.keyring import Channel
from shared.messages import ExecuteTool
from shared.settings import Settings
from shared.signatures import request_digest, seal


@dataclass(frozen=True)
class Authority:
    signing_key: Ed25519PrivateKey
    digest_key: bytes
    # Read again when channels.yaml changes (a gateway user added or removed).
    channels: Mapping[str, Channel]
    response_window: timedelta
    authorization_ttl: timedelta

    @classmethod
    def from_settings(cls, settings: Settings) -> Authority:
        keys = settings.keys_path
        return cls(
            signing_key=keyring.ledger_private_key(keys),
            digest_key=keyring.digest_key(keys),
            channels=keyring.LiveChannels(keys),
            response_window=timedelta(seconds=settings.response_window_seconds),
            authorization_ttl=timedelta(seconds=settings.authorization_ttl_seconds),
        )

    def digest(self, request_id: str, tool: str, version: str, arguments: dict[str, Any]) -> str:
        return request_digest(self.digest_key, request_id=request_id, tool=tool, version=version, arguments=arguments)

    @functools.cached_property
    def public_key(self) -> Ed25519PublicKey:
        return self.signing_key.public_key()

    def seal_request(self, request_id: str, call_id: str, session_id: str, tool: str, arguments: dict[str, Any]) -> str:
        """The seal the executor checks the call's row against before it runs an approval of it."""
        return seal_request(
            self.signing_key,
            request_id=request_id,
            call_id=call_id,
            session_id=session_id,
            tool=tool,
            arguments=arguments,
        )

    def sealed_claim(
        self, authorization: str | None, *, call_id: str, session_id: str, tool: str, arguments: dict[str, Any]
    ) -> bool:
        """Whether a claim's authorization is the ledger's own for exactly this call, tool and arguments."""
        return authorizes_call(
            self.public_key,
            authorization,
            call_id=call_id,
            session_id=session_id,
            tool=tool,
            arguments=arguments,
        )

    def seal_grant(self, terms: GrantTerms) -> str:
        """The seal the executor checks a grant's row against before it runs a call the grant authorized."""
        return seal_grant(self.signing_key, terms)

    def authorize(
        self, command: ExecuteTool, *, request_id: str | None, at: datetime, grant_id: str | None = None
    ) -> ExecuteTool:
        """The command with the ledger's seal on it: the approved request, the grant that
        covers it, or (neither) the policy that needs none."""
        basis: Basis = "approval" if request_id else "grant" if grant_id else "policy"
        token = authorize(
            self.signing_key,
            command,
            basis=basis,
            request_id=request_id,
            at=at,
            ttl=self.authorization_ttl,
            grant_id=grant_id,
        )
        return command.model_copy(update={"authorization": token})

    def seal_verdict(self, claims: dict[str, Any]) -> str:
        """A filed call's verdict, sealed with the ledger's key (`GET /v1/keys` publishes
        the public half): a caller outside the trust boundary checks that a person
        decided, and what they approved, without trusting whoever relayed it."""
        return seal(self.signing_key, claims)
