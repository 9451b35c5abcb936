"""The ledger's signed verdicts: `<claims>.<signature>`, both base64url without padding;
the signature is Ed25519 over the claims' bytes as they are, so nothing needs to be
re-encoded to check it. The ledger's public key is at `GET /v1/keys` (or pinned)."""

from __future__ import annotations

import base64
import binascii
import json

from . import ed25519
from .errors import BadSignature
from .models import Verdict


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_key_bytes(text: str) -> bytes:
    """A public key as `GET /v1/keys` gives it (raw, base64url)."""
    try:
        key = _unb64(text.strip())
    except (ValueError, binascii.Error) as error:
        raise BadSignature(f"not an Ed25519 public key ({error})") from None
    if len(key) != 32:
        raise BadSignature("not an Ed25519 public key (it is not 32 bytes)")
    return key


def verified(token: str | None, public_key: bytes) -> Verdict:
    """The verdict's claims, if the ledger's key signed them; BadSignature otherwise."""
    if not token:
        raise BadSignature("the call carries no signed verdict")
    try:
        body_text, signature_text = token.split(".")
        body, signature = _unb64(body_text), _unb64(signature_text)
    except (ValueError, binascii.Error):
        raise BadSignature("the verdict is not `<claims>.<signature>`") from None
    if not ed25519.verify(public_key, body, signature):
        raise BadSignature("the verdict is not signed by the ledger's key")
    try:
        return Verdict.model_validate(json.loads(body))
    except ValueError as error:
        raise BadSignature(f"the verdict's claims do not read ({error})") from None
