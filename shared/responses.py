"""The one place a person's answer becomes a signed `approval.respond`: the gateway (its
API and inbox), the command line (`signoff approve|deny`) and a channel adapter written
with `signoff.ChannelAdapter` (Slack, email, your own) all build and sign it here, so
what the ledger verifies (`RespondToApproval.signed_part`, invariant 3) is made one way.

The slim agent SDK (`signoff_sdk`) never signs a response: a program asks for a person's
decision through the gateway's API and reads the ledger's signed verdict.

Pure: the key comes in as an object; nothing is read, written or sent here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shared.messages import RespondToApproval
from shared.signatures import sign


@dataclass(frozen=True)
class ResponseSigner:
    """A registered channel's name (the `key_id` the ledger looks its public key up by)
    and its private key."""

    channel: str
    key: Ed25519PrivateKey

    def respond(self, **fields: Any) -> RespondToApproval:
        """A new response, signed. `fields` are `RespondToApproval`'s, validated there:
        `session_id`, `request_id`, `decision`, `args_digest` (the card's), `responder`,
        `reason` and `message`; then, when the caller has them, `message_id` and
        `response_id` (ids derived from a person's click or Idempotency-Key, so the same
        one sent twice counts once; fresh ones otherwise) and what is signed only when
        set: `response_token`, `edited_arguments`, `remember`. Issued now."""
        return self.sign(RespondToApproval(**fields))

    def sign(self, response: RespondToApproval) -> RespondToApproval:
        """`response` as this channel sends it: `key_id` its name, signed with its key."""
        unsigned = response.model_copy(update={"key_id": self.channel})
        return unsigned.model_copy(update={"signature": sign(self.key, unsigned.signed_part())})
