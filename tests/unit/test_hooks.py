"""Lifecycle hooks: stable delivery ids, signatures a receiver can check, backoff, the retry budget."""

import hashlib
import hmac

import pytest
from pydantic import ValidationError

from services.publisher.hooks import MAX_BACKOFF_SECONDS, Hook, backoff, delivery_id, retry_delay, sign
from services.publisher.settings import PublisherSettings


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


def test_a_delivery_is_retried_with_backoff_until_its_budget_of_attempts_is_spent():
    assert [retry_delay(n, 3) for n in (1, 2, 3, 4)] == [backoff(1), backoff(2), None, None]
    assert retry_delay(1, 1) is None, "a budget of one attempt never retries"
    assert retry_delay(99, 100) == MAX_BACKOFF_SECONDS
    # The default budget retries for about an hour and a half before giving up.
    budget = PublisherSettings.model_fields["hook_max_attempts"].default
    assert 80 * 60 < sum(retry_delay(n, budget) or 0 for n in range(1, budget)) < 100 * 60


def test_a_hooks_own_budget_must_allow_one_attempt():
    assert Hook(name="a", url="http://x", events=["*"], secret="s", max_attempts=1).max_attempts == 1
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        Hook(name="a", url="http://x", events=["*"], secret="s", max_attempts=0)
