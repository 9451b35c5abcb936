"""The ledger's pure rules, with no I/O."""

from datetime import UTC, datetime, timedelta

import pytest

from services.approval_ledger import domain
from shared.ledger.tables import ExecutionClaim
from services.tool_executor.claims import decide
from shared.catalogue import REDACTED, ToolCatalogue
from shared.messages import ProposedToolCall, RespondToApproval, arguments_digest

CATALOGUE = ToolCatalogue.model_validate({"tools": [
    {"name": "send", "label": "Send money", "approval": "always", "effect": "outward", "target": "account {to}",
     "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "amount": {"type": "number"}},
                    "required": ["to", "amount"]},
     "implementation": {"kind": "python", "function": "x:y"}},
    {"name": "look", "label": "Look", "approval": "never", "effect": "read",
     "implementation": {"kind": "http", "method": "GET", "url": "https://api.example.com:8443/v1/look/{what}?key=${env:K}"}},
    {"name": "hollow", "label": "No body"},
]})


def call(name, **arguments):
    return ProposedToolCall(provider_call_id="p1", name=name, arguments=arguments)


def test_a_call_needing_approval_is_asked_and_a_policy_allowed_call_runs_at_once():
    plans = domain.plan_calls([call("send", to="acme", amount=5), call("look", what="x")], CATALOGUE)
    assert [p.action for p in plans] == ["ask", "execute"]


def test_unknown_tools_missing_implementations_and_invalid_arguments_are_closed_before_anyone_is_asked():
    plans = domain.plan_calls([call("nope"), call("hollow"), call("send", to="acme")], CATALOGUE)
    assert [(p.action, p.reason_code) for p in plans] == [
        ("close", "unknown_tool"), ("close", "no_implementation"), ("close", "invalid_arguments")]
    assert "amount" in plans[2].reason_text


@pytest.mark.parametrize("found,session,status,digest,decision,verdict", [
    (True, "s1", "pending", "d1", "approve", None),
    (True, "s1", "pending", "d2", "deny", None),
    (False, None, None, None, "approve", "unknown_request"),
    (True, "other", "pending", "d1", "approve", "unknown_request"),
    (True, "s1", "approved", "d1", "approve", "already_decided"),
    (True, "s1", "pending", "d2", "approve", "digest_mismatch"),
])
def test_a_response_decides_only_a_pending_request_of_its_session_with_the_shown_arguments(
        found, session, status, digest, decision, verdict):
    request = domain.RequestOnRecord("apr_1", session, status, "d1", "call_1") if found else None
    response = RespondToApproval(session_id="s1", request_id="apr_1", decision=decision, args_digest=digest or "")
    refused = domain.judge_response(request, response)
    assert (refused.reason_code if refused else None) == verdict


def test_the_card_redacts_credentials_and_names_the_target():
    card = CATALOGUE.get("send").card({"to": "acme", "amount": 5, "auth": {"api_key": "k", "password": "p"}})
    assert card.arguments == {"to": "acme", "amount": 5, "auth": {"api_key": REDACTED, "password": REDACTED}}
    assert card.target == "account acme"
    look = CATALOGUE.get("look").card({"what": "weather"})
    assert look.target == "GET https://api.example.com:8443/v1/look/weather"


def test_the_digest_binds_the_exact_arguments_whatever_their_key_order():
    assert arguments_digest({"a": 1, "b": [1, 2]}) == arguments_digest({"b": [1, 2], "a": 1})
    assert arguments_digest({"a": 1}) != arguments_digest({"a": 2})


@pytest.mark.parametrize("kind,expected", [
    ("output", '{"ok": true}'),
    ("denied", "The user denied this tool call. Reason: too risky"),
    ("error", "Error: too risky"),
    ("expired", "Expired: too risky"),
])
def test_every_closure_reads_as_one_honest_tool_result(kind, expected):
    entry = domain.closure_entry(call_id="c", provider_call_id="p", tool="t", kind=kind,
                                 output={"ok": True}, reason_text="too risky")
    assert (entry.role, entry.call_id, entry.closure, entry.text) == ("tool", "c", kind, expected)


def test_an_unknown_closure_kind_is_refused():
    with pytest.raises(ValueError):
        domain.closure_entry(call_id="c", provider_call_id="p", tool="t", kind="maybe", output=None, reason_text=None)


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def claim(status="claimed", expires=NOW + timedelta(seconds=5), attempts=1, outcome=None):
    return ExecutionClaim(call_id="c", idempotency_key="k", status=status, holder="h", lease_expires_at=expires,
                          attempts=attempts, outcome=outcome, result={"output": 1}, claimed_at=NOW)


def test_an_unclaimed_call_runs_and_a_finished_one_reports_its_recorded_result():
    assert decide(None, effect="outward", at=NOW).action == "run"
    finished = decide(claim(status="finished", outcome="output"), effect="outward", at=NOW)
    assert (finished.action, finished.outcome, finished.result) == ("report", "output", {"output": 1})


def test_a_live_claim_is_waited_for():
    assert decide(claim(), effect="read", at=NOW).action == "wait"


def test_a_dead_holders_outward_call_is_lost_but_a_read_or_idempotent_call_is_retried_with_the_next_attempt():
    expired = claim(expires=NOW - timedelta(seconds=1), attempts=1)
    assert decide(expired, effect="outward", at=NOW).action == "lost"
    for effect in ("read", "idempotent"):
        retry = decide(expired, effect=effect, at=NOW)
        assert (retry.action, retry.attempt) == ("run", 2)


def test_session_status_is_waiting_while_any_request_is_open():
    assert domain.session_status(waiting=True) == "waiting"
    assert domain.session_status(waiting=False) == "running"
