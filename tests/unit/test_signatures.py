"""The signing scheme, as rules: canonical bytes, the ledger's keyed digest, and the
authorization the executor checks (shared/signatures.py, shared/authorization.py)."""

import base64
from datetime import UTC, datetime, timedelta

import pytest

from shared.authorization import authorize, verify_authorization
from shared.messages import ExecuteTool
from shared.signatures import (
    Unverified,
    arguments_fingerprint,
    canonical,
    load_public_key,
    new_private_key,
    public_key_text,
    request_digest,
    seal,
    sign,
    unseal,
    verify,
)

KEY = b"k" * 32
AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def digest(**changes):
    fields = dict(request_id="apr_1", tool="send", version="1", arguments={"to": "acme", "amount": 5})
    return request_digest(changes.pop("key", KEY), **{**fields, **changes})


def test_canonical_bytes_do_not_depend_on_key_order_and_follow_rfc_8785():
    assert canonical({"b": [1, 2], "a": "é"}) == canonical({"a": "é", "b": [1, 2]}) == b'{"a":"\xc3\xa9","b":[1,2]}'


def test_the_ledgers_digest_binds_the_request_the_tool_its_version_and_the_exact_arguments():
    assert digest() == digest(arguments={"amount": 5, "to": "acme"})
    assert digest().startswith("hmac-sha256:")
    for changed in ({"request_id": "apr_2"}, {"tool": "other"}, {"version": "2"}, {"arguments": {"to": "acme"}},
                    {"key": b"x" * 32}):
        assert digest(**changed) != digest(), changed


def test_the_digest_is_not_a_plain_hash_of_the_arguments_so_it_reveals_nothing_without_the_key():
    assert digest().removeprefix("hmac-sha256:") not in arguments_fingerprint({"to": "acme", "amount": 5})


def test_a_signature_holds_for_exactly_what_was_signed_by_exactly_that_key():
    key = new_private_key()
    signature = sign(key, {"a": 1})
    assert verify(load_public_key(public_key_text(key)), {"a": 1}, signature)
    assert not verify(key.public_key(), {"a": 2}, signature)
    assert not verify(new_private_key().public_key(), {"a": 1}, signature)
    assert not verify(key.public_key(), {"a": 1}, "not-a-signature")


def test_a_sealed_token_opens_only_with_its_key_and_unchanged():
    key = new_private_key()
    token = seal(key, {"a": 1})
    assert unseal(key.public_key(), token) == {"a": 1}
    body, signature = token.split(".")
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    flipped = base64.urlsafe_b64encode(bytes([raw[0] ^ 1]) + raw[1:]).rstrip(b"=").decode()
    for bad in (f"{body}x.{signature}", f"{body}.{flipped}", "nonsense", ""):
        with pytest.raises(Unverified) as refused:
            unseal(key.public_key(), bad)
        assert refused.value.code == "bad_signature"
    with pytest.raises(Unverified):
        unseal(new_private_key().public_key(), token)


COMMAND = ExecuteTool(session_id="s1", call_id="call_1", tool="send", arguments={"to": "acme"}, idempotency_key="k")


def authorized(key, **changes):
    granted = authorize(key, COMMAND, basis="approval", request_id="apr_1", at=AT, ttl=timedelta(minutes=5))
    return COMMAND.model_copy(update={"authorization": granted, **changes})


def test_the_executor_accepts_the_ledgers_authorization_for_exactly_that_call_until_it_expires():
    key = new_private_key()
    granted = verify_authorization(key.public_key(), authorized(key), at=AT + timedelta(minutes=4))
    assert (granted.call_id, granted.basis, granted.request_id) == ("call_1", "approval", "apr_1")
    assert granted.arguments == arguments_fingerprint({"to": "acme"})


@pytest.mark.parametrize("changes,code", [
    ({"authorization": ""}, "unauthorized"),
    ({"arguments": {"to": "mallory"}}, "altered"),
    ({"call_id": "call_2"}, "altered"),
    ({"tool": "other"}, "altered"),
    ({"session_id": "s2"}, "altered"),
])
def test_a_command_without_an_authorization_or_unlike_the_one_authorized_runs_nothing(changes, code):
    key = new_private_key()
    with pytest.raises(Unverified) as refused:
        verify_authorization(key.public_key(), authorized(key, **changes), at=AT)
    assert refused.value.code == code


def test_an_authorization_is_refused_once_expired_and_when_sealed_by_another_key():
    key = new_private_key()
    with pytest.raises(Unverified) as refused:
        verify_authorization(key.public_key(), authorized(key), at=AT + timedelta(minutes=5))
    assert refused.value.code == "expired"
    with pytest.raises(Unverified) as refused:
        verify_authorization(new_private_key().public_key(), authorized(key), at=AT)
    assert refused.value.code == "bad_signature"
