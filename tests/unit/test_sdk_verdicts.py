"""The slim SDK's verdict check (sdk/signoff_sdk/verdicts.py): its pure-Python Ed25519
agrees with `cryptography` on good and bad signatures, and a verdict the ledger's key did
not sign, or one changed after signing, is refused."""

from __future__ import annotations

import pytest

from shared.signatures import new_private_key, public_key_text, seal
from signoff_sdk import BadSignature, verified
from signoff_sdk.ed25519 import verify_pure
from signoff_sdk.verdicts import public_key_bytes

KEY = new_private_key()
CLAIMS = {
    "kind": "signoff.verdict", "call_id": "call_1", "program": "bot:a", "caller_call_id": "tc-1", "request_id": "apr_1",
    "tool": "send_refund", "decision": "approve", "arguments": {"amount": 10}, "args_fingerprint": "sha256:00",
    "responder": "alice", "reason": "", "edited_by": None, "decided_at": "2026-12-03T00:00:00+00:00",
}


@pytest.mark.parametrize("message", [b"", b"hello", bytes(range(256)) * 3])
def test_the_pure_ed25519_accepts_a_good_signature_and_refuses_a_changed_message_or_another_key(message):
    public = public_key_bytes(public_key_text(KEY))
    signature = KEY.sign(message)
    assert verify_pure(public, message, signature)
    assert not verify_pure(public, message + b"x", signature)
    assert not verify_pure(public_key_bytes(public_key_text(new_private_key())), message, signature)
    assert not verify_pure(public, message, signature[:32] + bytes(32))


def test_a_verdict_is_read_only_when_the_ledgers_key_signed_it_as_it_is():
    token = seal(KEY, CLAIMS)
    assert verified(token, public_key_bytes(public_key_text(KEY))).arguments == {"amount": 10}
    with pytest.raises(BadSignature):
        verified(token, public_key_bytes(public_key_text(new_private_key())))
    forged = seal(new_private_key(), {**CLAIMS, "arguments": {"amount": 10_000}})
    with pytest.raises(BadSignature):
        verified(forged.split(".")[0] + "." + token.split(".")[1], public_key_bytes(public_key_text(KEY)))
    with pytest.raises(BadSignature):
        verified(None, public_key_bytes(public_key_text(KEY)))
