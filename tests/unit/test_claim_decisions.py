"""What a (re)delivered call may do, given its claim row (invariant 4: execute once),
and what the executor writes to that row.

`decide` and the values `Claims.take` and `renew` write (`fresh_claim`,
`retaken_claim`, `renewed_lease`, `lost_call`) are the pure part of the
executor's claims; running the statements needs a database and is not stated here.
"""

from datetime import UTC, datetime, timedelta

import pytest

from services.tool_executor.claims import decide, fresh_claim, lost_call, renewed_lease, retaken_claim
from shared.ledger.tables import ExecutionClaim

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
EFFECTS = ("read", "idempotent", "outward")


def claim(*, status="claimed", lease_expires_at, attempts=1, outcome=None, result=None):
    return ExecutionClaim(call_id="call_1", idempotency_key="idem_1", status=status, holder="executor_a",
                          lease_expires_at=lease_expires_at, attempts=attempts, outcome=outcome, result=result,
                          claimed_at=NOW - LEASE)


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_call_nobody_has_claimed_runs_as_its_first_attempt(effect):
    verdict = decide(None, effect=effect, at=NOW)
    assert (verdict.action, verdict.attempt) == ("run", 1)


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("lease_expires_at", [NOW + LEASE, NOW - LEASE], ids=["lease live", "lease over"])
def test_a_finished_call_reports_its_recorded_outcome_and_result_and_never_runs_again(effect, lease_expires_at):
    finished = claim(status="finished", lease_expires_at=lease_expires_at, outcome="output", result={"body": 1})
    verdict = decide(finished, effect=effect, at=NOW)
    assert (verdict.action, verdict.outcome, verdict.result) == ("report", "output", {"body": 1})


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_claim_whose_lease_lies_in_the_future_is_waited_for_until_the_lease_ends(effect):
    verdict = decide(claim(lease_expires_at=NOW + LEASE), effect=effect, at=NOW)
    assert (verdict.action, verdict.wait_until) == ("wait", NOW + LEASE)


def test_a_renewed_lease_keeps_the_holder_in_charge_where_the_old_lease_would_have_let_go():
    old_lease = NOW - timedelta(seconds=1)
    assert decide(claim(lease_expires_at=old_lease), effect="outward", at=NOW).action == "lost"
    renewed = decide(claim(lease_expires_at=NOW + LEASE), effect="outward", at=NOW)
    assert (renewed.action, renewed.wait_until) == ("wait", NOW + LEASE)


@pytest.mark.parametrize("effect,action", [("outward", "lost"), ("read", "run"), ("idempotent", "run")])
def test_a_lease_that_ends_at_this_very_instant_has_expired(effect, action):
    assert decide(claim(lease_expires_at=NOW), effect=effect, at=NOW).action == action


@pytest.mark.parametrize("attempts", [1, 3])
def test_an_outward_call_whose_holder_died_is_lost_and_never_run_again(attempts):
    verdict = decide(claim(lease_expires_at=NOW - LEASE, attempts=attempts), effect="outward", at=NOW)
    assert verdict.action == "lost"


@pytest.mark.parametrize("effect", ["read", "idempotent"])
@pytest.mark.parametrize("attempts", [1, 3])
def test_a_read_or_idempotent_call_whose_holder_died_runs_again_as_the_next_attempt(effect, attempts):
    verdict = decide(claim(lease_expires_at=NOW - LEASE, attempts=attempts), effect=effect, at=NOW)
    assert (verdict.action, verdict.attempt) == ("run", attempts + 1)


def test_a_fresh_claim_is_held_by_its_executor_as_the_first_attempt_with_a_lease_that_lies_in_the_future():
    row = fresh_claim("call_1", "idem_1", "executor_a", at=NOW, lease=LEASE, authorization="sealed")
    assert row == {"call_id": "call_1", "idempotency_key": "idem_1", "status": "claimed", "holder": "executor_a",
                   "lease_expires_at": NOW + LEASE, "attempts": 1, "claimed_at": NOW, "authorization": "sealed"}
    assert row["lease_expires_at"] > NOW


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_redelivery_finds_a_fresh_claim_live_and_waits_for_it(effect):
    verdict = decide(ExecutionClaim(**fresh_claim("call_1", "idem_1", "executor_a", at=NOW, lease=LEASE,
                                                  authorization="sealed")),
                     effect=effect, at=NOW)
    assert (verdict.action, verdict.wait_until) == ("wait", NOW + LEASE)


def test_renewing_a_lease_extends_it_one_lease_past_the_renewal():
    later = NOW + timedelta(seconds=20)
    assert renewed_lease(NOW, LEASE) == NOW + LEASE
    assert renewed_lease(later, LEASE) == later + LEASE > NOW + LEASE


@pytest.mark.parametrize("effect", ["read", "idempotent"])
def test_a_dead_holders_call_is_retaken_by_the_new_executor_as_the_next_attempt_with_a_fresh_lease(effect):
    verdict = decide(claim(lease_expires_at=NOW - LEASE, attempts=2), effect=effect, at=NOW)
    assert retaken_claim("executor_b", verdict.attempt, at=NOW, lease=LEASE) == {
        "holder": "executor_b", "attempts": 3, "lease_expires_at": NOW + LEASE}


def test_a_lost_outward_call_is_written_as_finished_outcome_unknown_with_an_error_saying_it_was_not_retried():
    row = lost_call(NOW)
    assert (row["status"], row["outcome"], row["finished_at"]) == ("finished", "outcome_unknown", NOW)
    assert list(row["result"]) == ["error"]
    assert "not retried" in row["result"]["error"] and "outcome is unknown" in row["result"]["error"]


@pytest.mark.parametrize("effect", EFFECTS)
def test_once_written_a_lost_call_reports_outcome_unknown_on_every_later_delivery_and_never_runs(effect):
    lost = lost_call(NOW)
    written = claim(lease_expires_at=NOW - LEASE, status=lost["status"], outcome=lost["outcome"], result=lost["result"])
    verdict = decide(written, effect=effect, at=NOW + LEASE)
    assert (verdict.action, verdict.outcome, verdict.result) == ("report", "outcome_unknown", lost["result"])


# --- what the ledger's own rows allow ---------------------------------------------------

from services.tool_executor.claims import CallOnRecord, ledger_allows  # noqa: E402
from shared.authorization import Authorization, authorize, seal_request  # noqa: E402
from shared.messages import ExecuteTool  # noqa: E402
from shared.signatures import arguments_fingerprint, new_private_key  # noqa: E402

LEDGER = new_private_key()
ARGUMENTS = {"to": "a@example.com"}
SWAPPED = {"to": "attacker@example.com"}
PRINT = arguments_fingerprint(ARGUMENTS)


def granted(basis="approval", request_id="apr_1"):
    return Authorization("call_1", "s1", "send", PRINT, basis, request_id, NOW)


def sealed(request_id="apr_1", call_id="call_1", tool="send", arguments=ARGUMENTS, key=LEDGER):
    return seal_request(key, request_id=request_id, call_id=call_id, session_id="s1", tool=tool, arguments=arguments)


def on_record(tool="send", arguments=ARGUMENTS, request_id="apr_1", decision="approve", seal=None):
    return CallOnRecord(tool, arguments, request_id, decision, sealed() if seal is None else seal)


def allows(call, authorization=None):
    return ledger_allows(call, authorization or granted(), "send", PRINT, LEDGER.public_key())


def test_an_approved_call_on_record_with_the_same_tool_and_arguments_and_the_requests_seal_is_allowed():
    assert allows(on_record()) is None


def test_a_policy_allowed_call_is_allowed_only_if_it_needed_no_approval():
    assert allows(on_record(request_id=None, decision=None, seal=""), granted("policy", None)) is None
    assert allows(on_record(decision=None), granted("policy", None)) == "the call needs a person's approval"


ROW_CHANGED = "the request's seal does not name this call, tool and arguments: its row was changed"


@pytest.mark.parametrize("call,why", [
    (None, "the ledger has no such call"),
    (on_record(tool="other"), "the ledger's call has another tool or other arguments"),
    (on_record(arguments=SWAPPED), "the ledger's call has another tool or other arguments"),
    (on_record(decision=None), "no approval of this call is on record"),
    (on_record(decision="deny"), "no approval of this call is on record"),
    (on_record(request_id="apr_2"), "no approval of this call is on record"),
    # Rows rewritten in the database: the seal the ledger made with the request does not follow.
    (on_record(seal=""), ROW_CHANGED),
    (on_record(seal=sealed(arguments=SWAPPED)), ROW_CHANGED),
    (on_record(seal=sealed(request_id="apr_2")), ROW_CHANGED),
    (on_record(seal=sealed(call_id="call_2")), ROW_CHANGED),
    (on_record(seal=sealed(tool="other")), ROW_CHANGED),
    (on_record(seal=sealed(key=new_private_key())), ROW_CHANGED),
], ids=["no call", "other tool", "other arguments", "undecided", "denied", "other request", "no seal",
        "seal of other arguments", "seal of another request", "seal of another call", "seal of another tool",
        "seal not the ledger's"])
def test_without_a_matching_call_approval_and_request_seal_on_record_nothing_runs(call, why):
    assert allows(call) == why


def test_the_arguments_are_fingerprinted_from_the_row_itself_not_from_a_stored_hash():
    """Anyone who can rewrite the row's arguments can rewrite a stored hash beside them."""
    assert allows(on_record(arguments=dict(ARGUMENTS))) is None
    assert allows(on_record(arguments={**ARGUMENTS, "cc": "x"})) == (
        "the ledger's call has another tool or other arguments")


def test_an_authorization_is_not_a_requests_seal_nor_a_requests_seal_an_authorization():
    """Both are signed with the ledger's key: neither may stand in for the other."""
    from shared.authorization import read_authorization
    from shared.signatures import Unverified

    command = ExecuteTool(session_id="s1", call_id="call_1", tool="send", arguments=ARGUMENTS, idempotency_key="k")
    token = authorize(LEDGER, command, basis="approval", request_id="apr_1", at=NOW, ttl=LEASE)
    assert allows(on_record(seal=token)) == ROW_CHANGED
    with pytest.raises(Unverified):
        read_authorization(LEDGER.public_key(), sealed())


# --- a call a remembered approval (a grant) authorized ----------------------------------

from datetime import timedelta as _hours_later  # noqa: E402

from services.tool_executor.claims import GrantOnRecord  # noqa: E402
from shared.authorization import GrantTerms, seal_grant  # noqa: E402

DECIDED = NOW
TERMS = GrantTerms("grt_1", "s1", "send", "1", "to a@example.com", 1, None)


def grant_row(terms=TERMS, revoked_at=None, seal=None, key=LEDGER):
    return GrantOnRecord(terms, revoked_at, seal_grant(key, terms) if seal is None else seal)


def by_grant(grant=None, grant_id="grt_1", request_id=None, session_id="s1", created_at=DECIDED):
    return CallOnRecord(
        "send", ARGUMENTS, request_id, None, None, session_id=session_id, created_at=created_at, grant_id=grant_id,
        grant=grant_row() if grant is None else grant,
    )


def granted_by(grant_id="grt_1", session_id="s1"):
    return Authorization("call_1", session_id, "send", PRINT, "grant", None, NOW, grant_id=grant_id)


def grant_allows(call, authorization=None, target="to a@example.com"):
    return ledger_allows(call, authorization or granted_by(), "send", PRINT, LEDGER.public_key(), target)


def test_a_call_a_live_sealed_grant_of_its_session_tool_and_target_covers_is_allowed():
    assert grant_allows(by_grant()) is None
    anywhere = TERMS.__class__(**{**TERMS.__dict__, "target": None})
    assert grant_allows(by_grant(grant_row(anywhere)), target="to b@example.com") is None


WIDENED = "the grant's row does not carry the ledger's seal over its terms: it was changed"


@pytest.mark.parametrize("call,authorization,target,why", [
    (by_grant(grant_id=None), None, "to a@example.com", "no grant of this call is on record"),
    (by_grant(grant_id="grt_2"), None, "to a@example.com", "no grant of this call is on record"),
    (by_grant(request_id="apr_1"), None, "to a@example.com", "no grant of this call is on record"),
    (by_grant(), granted_by(grant_id=None), "to a@example.com", "no grant of this call is on record"),
    (by_grant(grant_row(seal="")), None, "to a@example.com", WIDENED),
    (by_grant(grant_row(key=new_private_key())), None, "to a@example.com", WIDENED),
    # A grant widened in the database (any target instead of one): its seal does not follow.
    (by_grant(grant_row(TERMS.__class__(**{**TERMS.__dict__, "target": None}), seal=seal_grant(LEDGER, TERMS))),
     None, "to b@example.com", WIDENED),
    (by_grant(grant_row(TERMS.__class__(**{**TERMS.__dict__, "session_id": "s2"}))), None, "to a@example.com",
     "the grant is for another session or tool"),
    (by_grant(session_id="s2"), granted_by(session_id="s2"), "to a@example.com",
     "the grant is for another session or tool"),
    (by_grant(grant_row(TERMS.__class__(**{**TERMS.__dict__, "tool": "other"}))), None, "to a@example.com",
     "the grant is for another session or tool"),
    (by_grant(), None, "to b@example.com", "the grant is for another target"),
    (by_grant(grant_row(TERMS.__class__(**{**TERMS.__dict__, "expires_at": DECIDED}))), None, "to a@example.com",
     "the grant had expired when the call was decided"),
    (by_grant(grant_row(revoked_at=DECIDED)), None, "to a@example.com",
     "the grant was revoked before the call was decided"),
    (by_grant(created_at=None), None, "to a@example.com", "the ledger's call has no time of decision"),
], ids=["no grant named", "another grant named", "the call asked a person", "authorization names none",
        "no seal", "seal not the ledger's", "widened in the database", "another session's grant",
        "another session's call", "another tool's grant", "another target", "expired", "revoked", "no time"])
def test_a_forged_or_widened_grant_basis_runs_nothing(call, authorization, target, why):
    assert grant_allows(call, authorization, target) == why


def test_a_grant_revoked_or_expiring_after_the_call_was_decided_still_lets_that_call_run():
    """A revocation takes effect for every call decided after it, not for one decided before."""
    later = DECIDED + _hours_later(seconds=1)
    expiring = TERMS.__class__(**{**TERMS.__dict__, "expires_at": later})
    assert grant_allows(by_grant(grant_row(expiring, revoked_at=later))) is None


def test_a_grant_basis_is_not_a_policy_basis_nor_a_policy_basis_a_grant_basis():
    policy = Authorization("call_1", "s1", "send", PRINT, "policy", None, NOW)
    assert grant_allows(by_grant(), policy) == "the call was authorized by a grant, not the policy"
    assert grant_allows(on_record(request_id=None, decision=None, seal=""), granted_by()) == (
        "no grant of this call is on record")
