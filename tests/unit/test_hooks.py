"""Lifecycle hooks: stable delivery ids, signatures a receiver can check, backoff."""

import hashlib
import hmac

import pytest
from pydantic import ValidationError

from services.publisher.hooks import MAX_BACKOFF_SECONDS, Hook, backoff, delivery_id, sign


def test_a_delivery_id_is_the_same_for_the_same_hook_and_event_and_differs_otherwise():
    assert delivery_id("audit", "msg_1") == delivery_id("audit", "msg_1")
    assert len({delivery_id("audit", "msg_1"), delivery_id("audit", "msg_2"), delivery_id("crm", "msg_1")}) == 3


def test_the_signature_is_hmac_sha256_over_timestamp_dot_body():
    body = b'{"type": "approval.requested"}'
    expected = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("k", "1700000000", body) == f"sha256={expected}"
    assert sign("other", "1700000000", body) != sign("k", "1700000000", body)


def test_retries_back_off_exponentially_up_to_a_cap():
    delays = [backoff(n) for n in range(1, 15)]
    assert delays == sorted(delays) and delays[0] < 1 and delays[-1] == MAX_BACKOFF_SECONDS


def test_a_hook_on_an_event_that_does_not_exist_is_refused_with_the_list_of_events():
    assert Hook(name="a", url="http://x", events=["approval.*"], secret="s").wants("approval.decided")
    with pytest.raises(ValidationError, match="approval.requested"):
        Hook(name="a", url="http://x", events=["tool.completed"], secret="s")
