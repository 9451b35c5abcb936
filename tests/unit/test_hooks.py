"""Lifecycle hooks: stable delivery ids, signatures a receiver can check, backoff, the retry budget."""

import hashlib
import hmac
import json

import pytest
from pydantic import ValidationError

from services.publisher.hooks import MAX_BACKOFF_SECONDS, Hook, backoff, delivery_id, load_hooks, retry_delay, sign
from shared.messages import EVENT_TYPES
from signoff.hooks import InvalidSignature, verify

SECRET = "0123456789abcdef0123456789abcdef"
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
    assert Hook(name="a", url="http://x", events=["approval.*"], secret=SECRET).wants("approval.decided")
    with pytest.raises(ValidationError, match="approval.requested"):
        Hook(name="a", url="http://x", events=["tool.completed"], secret=SECRET)


def test_a_delivery_is_retried_with_backoff_until_its_budget_of_attempts_is_spent():
    assert [retry_delay(n, 3) for n in (1, 2, 3, 4)] == [backoff(1), backoff(2), None, None]
    assert retry_delay(1, 1) is None, "a budget of one attempt never retries"
    assert retry_delay(99, 100) == MAX_BACKOFF_SECONDS
    # The default budget retries for about an hour and a half before giving up.
    budget = PublisherSettings.model_fields["hook_max_attempts"].default
    assert 80 * 60 < sum(retry_delay(n, budget) or 0 for n in range(1, budget)) < 100 * 60


def test_a_hooks_own_budget_must_allow_one_attempt():
    assert Hook(name="a", url="http://x", events=["*"], secret=SECRET, max_attempts=1).max_attempts == 1
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        Hook(name="a", url="http://x", events=["*"], secret=SECRET, max_attempts=0)


def test_every_event_pattern_matches_events_only_and_never_a_command_the_publisher_relays():
    everything = Hook(name="a", url="http://x", events=["*"], secret=SECRET)
    tools = Hook(name="b", url="http://x", events=["tool.*"], secret=SECRET)
    steps = Hook(name="c", url="http://x", events=["*.*"], secret=SECRET)
    assert all(everything.wants(event) for event in EVENT_TYPES)
    for command in ("tool.execute", "step.requested", "turn.start", "approval.respond", "tool.completed"):
        assert not everything.wants(command) and not tools.wants(command) and not steps.wants(command)
    assert tools.wants("tool.closed")


@pytest.mark.parametrize("secret", ["", "hunter2", "x" * 31, "${env:SIGNOFF_TEST_HOOK_SECRET_UNSET}"])
def test_a_hook_secret_that_is_unset_or_shorter_than_32_bytes_stops_the_publisher_naming_the_hook(
        tmp_path, monkeypatch, secret):
    monkeypatch.delenv("SIGNOFF_TEST_HOOK_SECRET_UNSET", raising=False)
    path = tmp_path / "hooks.yaml"
    path.write_text(json.dumps({"hooks": [{"name": "audit", "url": "http://x", "events": ["*"], "secret": secret}]}))
    with pytest.raises(SystemExit) as stopped:
        load_hooks(path)
    said = str(stopped.value)
    assert said.startswith(f"hooks file {path} (SIGNOFF_HOOKS_FILE) is not usable: hooks.0.secret: the secret")
    assert ("is not set" in said) if secret.startswith("$") else ("shorter than 32 bytes" in said)
    if secret and not secret.startswith("$"):
        assert secret not in said, "the error never repeats the secret"


def test_a_hook_secret_from_the_environment_of_32_bytes_is_used_resolved(tmp_path, monkeypatch):
    monkeypatch.setenv("SIGNOFF_TEST_HOOK_SECRET", SECRET)
    path = tmp_path / "hooks.yaml"
    path.write_text(json.dumps({"hooks": [{"name": "audit", "url": "http://x", "events": ["*"],
                                           "secret": "${env:SIGNOFF_TEST_HOOK_SECRET}"}]}))
    [hook] = load_hooks(path)
    assert hook.secret == SECRET and SECRET not in repr(hook)


# --- the receiver's side: signoff.hooks.verify ----------------------------------------------


def signed_headers(body: bytes, timestamp: int, secret: str = SECRET) -> dict[str, str]:
    return {"Signoff-Timestamp": str(timestamp), "Signoff-Signature": sign(secret, str(timestamp), body)}


def test_a_receiver_accepts_a_delivery_signed_with_its_secret_within_the_window():
    body = b'{"type": "tool.closed"}'
    verify(SECRET, body, signed_headers(body, 1_700_000_000), now=1_700_000_100)
    lowered = {k.lower(): v for k, v in signed_headers(body, 1_700_000_000).items()}
    verify(SECRET, body, lowered, now=1_700_000_000)


@pytest.mark.parametrize(("case", "message"), [
    ("other secret", "does not match"), ("altered body", "does not match"), ("too old", "window"),
    ("from the future", "window"), ("no signature", "missing"), ("bad timestamp", "unix seconds"),
])
def test_a_receiver_refuses_a_forged_altered_replayed_or_unsigned_delivery(case, message):
    body = b'{"type": "tool.closed"}'
    at = 1_700_000_000
    headers = signed_headers(body, at, "another secret, also long enough!!" if case == "other secret" else SECRET)
    received = body.replace(b"closed", b"opened") if case == "altered body" else body
    now = {"too old": at + 301, "from the future": at - 301}.get(case, at)
    if case == "no signature":
        del headers["Signoff-Signature"]
    if case == "bad timestamp":
        headers["Signoff-Timestamp"] = "yesterday"
    with pytest.raises(InvalidSignature, match=message):
        verify(SECRET, received, headers, now=now)


def test_the_receiver_compares_signatures_in_constant_time(monkeypatch):
    import hmac as hmac_module

    compared = []
    real = hmac_module.compare_digest
    monkeypatch.setattr(hmac_module, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    body = b"{}"
    verify(SECRET, body, signed_headers(body, 1_700_000_000), now=1_700_000_000)
    assert len(compared) == 1
