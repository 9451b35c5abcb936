"""The ledger's rules (services/approval_ledger/domain.py), each stated as a sentence: pure, no I/O.

What a handler loads and records needs a database and is not stated here; what it
decides is. The executor's claim decisions are in test_claim_decisions.py.
"""

from datetime import UTC, datetime, timedelta

import pytest

from services.approval_ledger import domain
from services.approval_ledger.domain import Call, ClosureOnRecord, Note, RequestOnRecord, Step
from shared.catalogue import ToolCatalogue
from shared.redaction import REDACTED
from shared.keyring import Channel
from shared.messages import (
    ProposedToolCall,
    ProviderAttempt,
    RespondToApproval,
    TranscriptEntry,
)
from shared.signatures import new_private_key, sign

CATALOGUE = ToolCatalogue.model_validate({"tools": [
    {"name": "send", "label": "Send money", "approval": "always", "effect": "outward", "target": "account {to}",
     "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "amount": {"type": "number"}},
                    "required": ["to", "amount"]},
     "implementation": {"kind": "python", "function": "x:y"}},
    {"name": "look", "label": "Look", "approval": "never", "effect": "read",
     "parameters": {"type": "object", "properties": {"what": {"type": "string"}}},
     "implementation": {"kind": "http", "method": "GET", "url": "https://api.example.com:8443/v1/look/{what}?key=${env:K}"}},
    {"name": "hollow", "label": "No body"},
]})


def proposed(name, provider_call_id="p1", **arguments):
    return ProposedToolCall(provider_call_id=provider_call_id, name=name, arguments=arguments)


# --- turns ----------------------------------------------------------------------


@pytest.mark.parametrize("status", ["running", "waiting"])
def test_a_busy_session_running_or_waiting_on_a_person_refuses_a_new_turn_as_session_busy(status):
    refused = domain.refuse_turn(status)
    assert refused == domain.Refusal(
        "session_busy", f"The session is {status}; a new turn can start when it is idle.")


def test_an_idle_session_starts_a_new_turn():
    assert domain.refuse_turn("idle") is None


# --- model steps ----------------------------------------------------------------

STEP = Step(id="step_1", session_id="s1", turn_id="turn_1", status="requested")
COMPLETED_STEP = Step(id="step_1", session_id="s1", turn_id="turn_1", status="completed")


def attempt(number, status):
    return ProviderAttempt(number=number, status=status, provider="fake")


ATTEMPTS = [attempt(1, "failed"), attempt(2, "abandoned"), attempt(3, "completed")]


@pytest.mark.parametrize("step", [None, Step(id="step_1", session_id="other", turn_id="turn_1", status="requested")],
                         ids=["no such step", "a step of another session"])
def test_a_report_for_a_step_of_another_session_or_for_none_is_refused_as_unknown_step_and_records_nothing(step):
    judged = domain.judge_step_report(step, "s1", ATTEMPTS)
    assert (judged.verdict, judged.attempts) == ("unknown", ())
    assert judged.refusal == domain.Refusal("unknown_step", "No such model step in this session.")


def test_a_duplicate_report_keeps_its_attempts_counted_as_discarded_except_its_abandoned_one():
    judged = domain.judge_step_report(COMPLETED_STEP, "s1", ATTEMPTS)
    assert (judged.verdict, judged.refusal) == ("duplicate", None)
    assert judged.attempts == ((ATTEMPTS[0], "discarded"), (ATTEMPTS[2], "discarded"))


def test_a_new_report_is_applied_and_records_each_attempt_with_its_own_status():
    judged = domain.judge_step_report(STEP, "s1", ATTEMPTS)
    assert (judged.verdict, judged.refusal) == ("apply", None)
    assert judged.attempts == ((ATTEMPTS[0], "failed"), (ATTEMPTS[1], "abandoned"), (ATTEMPTS[2], "completed"))


def test_a_call_needing_approval_is_asked_and_a_policy_allowed_call_runs_at_once():
    calls = [proposed("send", "p1", to="acme", amount=5), proposed("look", "p2", what="x")]
    plans = domain.plan_calls(calls, CATALOGUE)
    assert [(p.proposed, p.action, p.spec, p.reason_code, p.reason_text) for p in plans] == [
        (calls[0], "ask", CATALOGUE.get("send"), None, None),
        (calls[1], "execute", CATALOGUE.get("look"), None, None),
    ]


def test_unknown_tools_missing_implementations_and_invalid_arguments_are_closed_before_anyone_is_asked():
    calls = [proposed("nope"), proposed("hollow"), proposed("send", to="acme"), proposed("send", to="acme", amount=1)]
    plans = domain.plan_calls(calls, CATALOGUE)
    assert [(p.proposed, p.action, p.spec, p.reason_code) for p in plans] == [
        (calls[0], "close", None, "unknown_tool"),
        (calls[1], "close", CATALOGUE.get("hollow"), "no_implementation"),
        (calls[2], "close", CATALOGUE.get("send"), "invalid_arguments"),
        (calls[3], "ask", CATALOGUE.get("send"), None),
    ]
    assert plans[0].reason_text == "There is no tool named 'nope'."
    assert plans[1].reason_text == "The tool 'hollow' has no implementation."
    assert plans[2].reason_text == "Invalid arguments for 'send': " + "; ".join(
        CATALOGUE.get("send").argument_errors({"to": "acme"}))
    assert "amount" in plans[2].reason_text


def test_an_argument_the_schema_does_not_list_closes_the_call_before_anyone_is_asked_and_says_which():
    # The model added `cc`: a closed schema (the default) refuses it rather than send it unseen.
    calls = [proposed("send", to="acme", amount=1, cc="mallory"), proposed("look", what="x", key="k")]
    plans = domain.plan_calls(calls, CATALOGUE)
    assert [(p.action, p.reason_code) for p in plans] == [("close", "unexpected_arguments"),
                                                         ("close", "unexpected_arguments")]
    assert plans[0].reason_text == (
        "The tool 'send' takes no argument named 'cc'; the call was not run and nobody was asked. "
        "Call it again with only its declared parameters.")


def test_every_argument_error_of_an_invalid_call_is_named_in_its_closure():
    [plan] = domain.plan_calls([proposed("send", to=1)], CATALOGUE)
    errors = CATALOGUE.get("send").argument_errors({"to": 1})
    assert len(errors) == 2
    assert plan.reason_text == f"Invalid arguments for 'send': {errors[0]}; {errors[1]}"


# --- approvals ------------------------------------------------------------------


@pytest.mark.parametrize("found,session,status,digest,decision,verdict", [
    (True, "s1", "pending", "d1", "approve", None),
    (True, "s1", "pending", "d2", "deny", None),
    (False, None, None, None, "approve", "unknown_request"),
    (True, "other", "pending", "d1", "approve", "unknown_request"),
    (True, "s1", "approved", "d1", "approve", "already_decided"),
    (True, "s1", "denied", "d1", "deny", "already_decided"),
    (True, "s1", "pending", "d2", "approve", "digest_mismatch"),
])
def test_a_response_decides_only_a_pending_request_of_its_session_with_the_shown_arguments(
        found, session, status, digest, decision, verdict):
    request = RequestOnRecord("apr_1", session, status, "d1", "call_1") if found else None
    response = RespondToApproval(session_id="s1", request_id="apr_1", decision=decision, args_digest=digest or "")
    refused = domain.judge_response(request, response)
    assert (refused.reason_code if refused else None) == verdict


def test_each_refused_response_says_why():
    def why(request, decision="approve", digest="d1"):
        response = RespondToApproval(session_id="s1", request_id="apr_1", decision=decision, args_digest=digest)
        return domain.judge_response(request, response).reason_text

    assert why(None) == "No approval request with that id exists in this session."
    assert why(RequestOnRecord("apr_1", "s1", "denied", "d1", "call_1")) == "The request is already denied."
    assert why(RequestOnRecord("apr_1", "s1", "pending", "d1", "call_1"), digest="d2") == (
        "The approval names different arguments from the ones shown; refusing to run them.")


@pytest.mark.parametrize("decision,status", [("approve", "approved"), ("deny", "denied"), ("respond", "answered")])
def test_a_request_is_approved_by_an_approval_denied_by_a_denial_and_answered_by_an_answer(decision, status):
    assert domain.request_status_after(decision) == status


def test_a_decision_with_a_message_yields_a_note_from_its_responder_and_one_without_yields_none():
    said = RespondToApproval(session_id="s1", request_id="apr_1", decision="deny", args_digest="d1",
                             message="use the other account", responder="ann")
    silent = RespondToApproval(session_id="s1", request_id="apr_1", decision="approve", args_digest="d1",
                               responder="ann")
    assert domain.note_of(said) == Note("ann", "use the other account")
    assert domain.note_of(silent) is None


def test_the_model_is_told_who_changed_the_arguments_how_and_the_call_as_approved_with_secrets_hidden():
    card = {"edited_by": "bob", "edit": "amount: 2500 → 900", "arguments": {"amount": 900, "token": "***redacted***"}}
    assert domain.edit_of(card) == (
        'bob changed the arguments before approving: amount: 2500 → 900. '
        'The call was approved with these arguments: {"amount": 900, "token": "***redacted***"}')
    assert domain.edit_of({**card, "edited_by": None}).startswith("A person changed the arguments")
    assert domain.edit_of({**card, "edit": ""}) is None and domain.edit_of(None) is None and domain.edit_of({}) is None
    long = domain.edit_of({**card, "arguments": {"memo": "é" * 2000}})
    assert long.endswith('{"memo": "' + "é" * (domain.EDITED_CALL_CHARS - 10) + "…")
    # Exactly as long as the limit: whole. Keys in one order, whatever order the card has.
    whole = {"memo": "x" * (domain.EDITED_CALL_CHARS - 12)}
    assert domain.edit_of({**card, "arguments": whole}).endswith('{"memo": "' + "x" * (domain.EDITED_CALL_CHARS - 12) + '"}')
    assert domain.edit_of({**card, "arguments": {"z": 1, "a": 2}}).endswith('{"a": 2, "z": 1}')
    response = RespondToApproval(session_id="s1", request_id="apr_1", decision="approve", args_digest="d1",
                                 message="thanks", responder="alice")
    assert domain.note_of(response, edit="bob changed it") == Note("alice", "bob changed it\nthanks")


def test_an_answer_in_the_tools_place_closes_the_call_as_answered_with_the_message_said_once_as_its_result():
    answer = RespondToApproval(session_id="s1", request_id="apr_1", decision="respond", args_digest="d1",
                               reason="ignored", message="done by hand", responder="ann")
    assert domain.closure_of_decision(answer) == ClosureOnRecord(
        "answered", reason_code="answered_by_person", reason_text="done by hand")
    assert domain.closure_text("answered", None, "done by hand") == "done by hand"
    assert domain.note_of(answer) is None  # not said twice: no note besides the result
    denial = answer.model_copy(update={"decision": "deny"})
    assert domain.closure_of_decision(denial) == domain.closure_of_denial("ignored")


def test_an_answer_without_a_message_is_refused_as_input():
    with pytest.raises(ValueError, match="message"):
        RespondToApproval(session_id="s1", request_id="apr_1", decision="respond", args_digest="d1", message=" ")


def test_an_answer_counts_as_a_denial_does_one_eligible_approver_closes_it_and_a_stranger_may_not():
    policy = domain.ApprovalPolicy(approvers=frozenset({"ann", "bob"}), starter_may_approve=False,
                                   approvals_required=2)
    request = RequestOnRecord("apr_1", "s1", "pending", "d1", "call_1", starters=frozenset({"ann"}), approvals=1)
    answer = RespondToApproval(session_id="s1", request_id="apr_1", decision="respond", args_digest="d1",
                               message="no need", responder="ann")
    assert domain.judge_approver(policy, request, answer) is None
    assert domain.tally(policy, request, "respond").decides
    stranger = answer.model_copy(update={"responder": "eve"})
    assert domain.judge_approver(policy, request, stranger).reason_code == "not_an_approver"


def test_a_denied_call_closes_as_denied_by_a_person_with_their_reason():
    assert domain.closure_of_denial("too risky") == ClosureOnRecord(
        "denied", output=None, reason_code="denied_by_person", reason_text="too risky")


def test_a_deny_without_a_reason_closes_with_no_reason_text_and_reads_without_one():
    closure = domain.closure_of_denial("")
    assert closure == ClosureOnRecord("denied", reason_code="denied_by_person", reason_text=None)
    text = domain.closure_text(closure.kind, closure.output, closure.reason_text)
    assert text == "The user denied this tool call."
    assert "Reason:" not in text


# --- tool results ---------------------------------------------------------------


def a_call(n=1, status="executing", session_id="s1", closure=None, note=None, provider_call_id=None):
    return Call(id=f"call_{n}", session_id=session_id, step_id="step_1", turn_id="turn_1",
                provider_call_id=provider_call_id or f"p{n}", tool="send", arguments={"n": n},
                idempotency_key=f"idk_{n}", status=status, closure=closure, note=note)


@pytest.mark.parametrize("call", [None, a_call(session_id="other")], ids=["no such call", "a call of another session"])
def test_a_tool_report_for_a_call_of_another_session_or_for_none_is_unknown(call):
    assert domain.judge_tool_report(call, "s1") == "unknown"


@pytest.mark.parametrize("status", ["closed", "awaiting_approval"])
def test_a_tool_report_for_a_call_that_is_not_executing_is_stale(status):
    assert domain.judge_tool_report(a_call(status=status), "s1") == "stale"


def test_a_tool_report_for_an_executing_call_of_its_session_is_applied():
    assert domain.judge_tool_report(a_call(status="executing"), "s1") == "apply"


def finished(outcome, output=None, error=None):
    return domain.ClaimOnRecord("finished", outcome, {"output": output, "error": error}, "executor_a", 1)


def test_a_tool_output_closes_its_call_with_the_output_its_claim_recorded():
    assert domain.closure_of_claim(finished("output", output={"id": 7})) == ClosureOnRecord(
        "output", output={"id": 7}, reason_code=None, reason_text=None)


def test_a_tool_error_closes_its_call_as_tool_failed_with_the_error_its_claim_recorded():
    assert domain.closure_of_claim(finished("error", error="HTTP 500")) == ClosureOnRecord(
        "error", output=None, reason_code="tool_failed", reason_text="HTTP 500")


def test_an_outcome_unknown_closes_its_call_as_outcome_unknown_with_the_claims_error_or_else_the_default_text():
    assert domain.closure_of_claim(finished("outcome_unknown", error="lease lost")) == ClosureOnRecord(
        "outcome_unknown", output=None, reason_code="outcome_unknown", reason_text="lease lost")
    assert domain.closure_of_claim(finished("outcome_unknown")) == ClosureOnRecord(
        "outcome_unknown", output=None, reason_code="outcome_unknown",
        reason_text="The executor stopped mid-call; whether the call happened is unknown.")


@pytest.mark.parametrize("claim,sealed", [
    (None, True), (domain.ClaimOnRecord("claimed"), True), (finished("output", output=1), False),
], ids=["no claim", "claimed, not finished", "finished, not under the ledger's authorization"])
def test_a_tool_report_without_a_finished_claim_under_the_ledgers_authorization_is_refused(claim, sealed):
    refused = domain.judge_claim(claim, sealed=sealed)
    assert refused is not None and refused.reason_code == "not_claimed"


def test_a_tool_report_with_a_finished_claim_under_the_ledgers_authorization_is_applied():
    assert domain.judge_claim(finished("output", output=1), sealed=True) is None


def test_an_approval_is_refused_as_altered_when_the_digest_recomputed_from_the_row_is_not_the_one_approved():
    assert domain.judge_arguments("hmac-sha256:aa", "hmac-sha256:aa") is None
    assert domain.judge_arguments("hmac-sha256:bb", "hmac-sha256:aa") == domain.ALTERED
    closed = domain.closure_of_altered()
    assert (closed.kind, closed.reason_code) == ("error", "altered")


@pytest.mark.parametrize("kind", domain.CLOSURE_KINDS)
def test_only_an_outcome_unknown_closure_needs_an_operator(kind):
    assert domain.needs_operator(ClosureOnRecord(kind)) is (kind == "outcome_unknown")


# --- resuming a step and the session's status ---------------------------------


def closed(n, kind="output", output="ok", reason_text=None, note=None):
    return a_call(n, status="closed", closure=ClosureOnRecord(kind, output=output, reason_text=reason_text), note=note)


@pytest.mark.parametrize("open_status", ["awaiting_approval", "executing"])
@pytest.mark.parametrize("waits,status", [(True, "waiting"), (False, "running")])
def test_while_any_call_of_a_step_is_open_nothing_is_written_and_the_session_waits_on_a_person_or_runs(
        open_status, waits, status):
    calls = [closed(1, note=Note("ann", "fine")), a_call(2, status=open_status), closed(3)]
    assert domain.resume(calls, session_waits=waits) == domain.Resumption(status, None)


def test_when_the_last_call_closes_every_closure_is_written_in_the_models_call_order_then_every_decision_note():
    calls = [
        closed(1, output={"id": 1}, note=Note("ann", "go ahead")),
        closed(2, kind="denied", output=None, reason_text="too risky", note=Note("bob", "not that one")),
        closed(3, kind="error", output=None, reason_text="HTTP 500"),
    ]
    resumed = domain.resume(calls, session_waits=True)
    assert resumed.status == "running"
    assert resumed.entries == [
        TranscriptEntry(role="tool", call_id="call_1", provider_call_id="p1", text='{"id": 1}', closure="output"),
        TranscriptEntry(role="tool", call_id="call_2", provider_call_id="p2",
                        text="The user denied this tool call. Reason: too risky", closure="denied"),
        TranscriptEntry(role="tool", call_id="call_3", provider_call_id="p3", text="Error: HTTP 500", closure="error"),
        TranscriptEntry(role="user", text="[ann, with their decision] go ahead"),
        TranscriptEntry(role="user", text="[bob, with their decision] not that one"),
    ]


def test_a_step_whose_calls_all_closed_without_notes_writes_only_their_closures():
    resumed = domain.resume([closed(2), closed(1)], session_waits=False)
    assert [(e.role, e.call_id) for e in resumed.entries] == [("tool", "call_2"), ("tool", "call_1")]


def test_a_closed_call_without_a_closure_on_record_is_a_bug_and_stops_the_resumption():
    with pytest.raises(AssertionError, match="call_1"):
        domain.resume([a_call(1, status="closed")], session_waits=False)


def test_session_status_is_waiting_while_any_request_is_open_and_running_otherwise():
    assert domain.session_status(waiting=True) == "waiting"
    assert domain.session_status(waiting=False) == "running"


# --- what the model reads -------------------------------------------------------


@pytest.mark.parametrize("kind,expected", [
    ("output", '{"ok": true}'),
    ("denied", "The user denied this tool call. Reason: too risky"),
    ("error", "Error: too risky"),
    ("expired", "Expired: too risky"),
    ("cancelled", "Cancelled: too risky"),
])
def test_every_closure_reads_as_one_honest_tool_result(kind, expected):
    entry = domain.closure_entry(call_id="c", provider_call_id="p", tool="t", kind=kind,
                                 output={"ok": True}, reason_text="too risky")
    assert entry == TranscriptEntry(role="tool", call_id="c", provider_call_id="p", text=expected, closure=kind)


@pytest.mark.parametrize("kind", ["error", "expired", "cancelled"])
def test_a_closure_without_a_reason_says_no_reason_was_given(kind):
    assert domain.closure_text(kind, None, None) == f"{kind.capitalize()}: no reason given"


def test_a_text_output_reads_as_itself_and_any_other_output_as_json_keeping_non_ascii_and_showing_anything_else():
    assert domain.closure_text("output", "plain text", None) == "plain text"
    assert domain.closure_text("output", {"name": "Zoë", "at": datetime(2026, 1, 1, tzinfo=UTC)}, None) == (
        '{"name": "Zoë", "at": "2026-01-01 00:00:00+00:00"}')
    assert domain.closure_text("output", [1, 2], "ignored") == "[1, 2]"


def test_an_outcome_unknown_closure_tells_the_model_it_may_have_run_and_will_not_be_retried():
    text = domain.closure_text("outcome_unknown", None, "lease lost")
    assert text == ("Error: the tool may or may not have run (its executor stopped mid-call); "
                    "it will not be retried automatically and an operator was told.")
    entry = domain.closure_entry(call_id="c", provider_call_id="p", tool="t", kind="outcome_unknown",
                                 output=None, reason_text=None)
    assert (entry.text, entry.closure) == (text, "outcome_unknown")


def test_an_unknown_closure_kind_is_refused():
    with pytest.raises(ValueError, match="'maybe'"):
        domain.closure_entry(call_id="c", provider_call_id="p", tool="t", kind="maybe", output=None, reason_text=None)


def test_a_decision_note_is_said_to_the_model_as_the_responders_words_with_their_decision():
    assert domain.decision_note(Note("ann", "use the other account")) == TranscriptEntry(
        role="user", text="[ann, with their decision] use the other account")


# --- the card and the digest a decision is bound to (invariant 6) -------------


def test_the_card_redacts_credentials_and_names_the_target():
    card = CATALOGUE.get("send").card({"to": "acme", "amount": 5, "auth": {"api_key": "k", "password": "p"}})
    assert card.arguments == {"to": "acme", "amount": 5, "auth": {"api_key": REDACTED, "password": REDACTED}}
    assert card.target == "account acme"
    look = CATALOGUE.get("look").card({"what": "weather"})
    # The executor's rules, its secrets hidden: `${env:K}` is a query value, hidden as every one is.
    assert look.target == f"GET https://api.example.com:8443/v1/look/weather?key={REDACTED}"


# --- who may respond ------------------------------------------------------------------

CHANNEL_KEY = new_private_key()
CHANNELS = {"chat": Channel("chat", CHANNEL_KEY.public_key(), ("alice", "team-*"))}
AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=5)


def chat_response(key=CHANNEL_KEY, key_id="chat", **changes):
    fields = dict(session_id="s1", request_id="apr_1", decision="approve", args_digest="d1", responder="alice",
                  issued_at=AT)
    response = RespondToApproval(**{**fields, **changes}).model_copy(update={"key_id": key_id})
    return response.model_copy(update={"signature": sign(key, response.signed_part())})


def refusal_code(response):
    refused = domain.authenticate_response(response, CHANNELS, at=AT, window=WINDOW)
    return refused.reason_code if refused else None


def test_a_response_signed_by_a_registered_channel_for_a_principal_it_may_assert_is_authentic():
    assert refusal_code(chat_response()) is None
    assert refusal_code(chat_response(responder="team-ops")) is None


def test_an_unsigned_response_or_one_without_a_key_id_is_refused_as_unsigned():
    assert refusal_code(RespondToApproval(session_id="s1", request_id="apr_1", decision="approve",
                                          args_digest="d1")) == "unsigned"
    assert refusal_code(chat_response().model_copy(update={"key_id": None})) == "unsigned"


def test_a_response_from_a_key_nobody_registered_is_refused_as_unknown_key():
    assert refusal_code(chat_response(key=new_private_key(), key_id="stranger")) == "unknown_key"


def test_a_response_changed_after_signing_or_signed_by_another_key_is_refused_as_a_bad_signature():
    for changed in ({"decision": "deny"}, {"request_id": "apr_2"}, {"args_digest": "d2"}, {"responder": "team-x"},
                    {"response_id": "rsp_other"}, {"issued_at": AT + timedelta(seconds=1)}, {"reason": "r"}):
        assert refusal_code(chat_response().model_copy(update=changed)) == "bad_signature", changed
    assert refusal_code(chat_response(key=new_private_key())) == "bad_signature"


def test_a_channel_may_speak_only_for_the_principals_it_was_registered_for():
    refused = domain.authenticate_response(chat_response(responder="bob"), CHANNELS, at=AT, window=WINDOW)
    assert (refused.reason_code, refused.reason_text) == ("wrong_principal", "Channel 'chat' may not respond as 'bob'.")


def test_a_response_issued_outside_the_window_either_way_is_stale_and_one_at_its_edge_is_not():
    assert refusal_code(chat_response(issued_at=AT - WINDOW)) is None
    assert refusal_code(chat_response(issued_at=AT + WINDOW)) is None
    assert refusal_code(chat_response(issued_at=AT - WINDOW - timedelta(seconds=1))) == "stale"
    assert refusal_code(chat_response(issued_at=AT + WINDOW + timedelta(seconds=1))) == "stale"


# --- response tokens ------------------------------------------------------------------

TOKEN = "tok-1"
TOKEN_HASH = domain.token_hash(TOKEN)


def test_the_ledger_keeps_a_tokens_sha256_and_never_the_token():
    assert TOKEN_HASH == "sha256:" + __import__("hashlib").sha256(b"tok-1").hexdigest()
    assert TOKEN not in TOKEN_HASH


def test_a_token_response_names_its_channel_as_token_colon_channel_and_no_one_else():
    assert refusal_code(chat_response(responder="token:chat", response_token=TOKEN)) is None
    for responder in ("alice", "token:cli", "token:chat2"):
        refused = domain.authenticate_response(chat_response(responder=responder, response_token=TOKEN), CHANNELS,
                                               at=AT, window=WINDOW)
        assert refused.reason_code == "wrong_principal", responder


def test_a_response_without_a_token_may_not_pass_itself_off_as_a_tokens_even_from_a_channel_that_asserts_anyone():
    anyone = {"cli": Channel("cli", CHANNEL_KEY.public_key(), ("*",))}
    response = chat_response(key_id="cli", responder="token:cli")
    refused = domain.authenticate_response(response, anyone, at=AT, window=WINDOW)
    assert (refused.reason_code, refused.reason_text) == ("wrong_principal", "Channel 'cli' may not respond as 'token:cli'.")
    assert domain.authenticate_response(chat_response(key_id="cli", responder="bob"), anyone, at=AT, window=WINDOW) is None


def test_a_token_is_part_of_what_the_channel_signs():
    assert refusal_code(chat_response(responder="token:chat", response_token=TOKEN).model_copy(
        update={"response_token": "tok-2"})) == "bad_signature"


def pending(**changes):
    fields = dict(id="apr_1", session_id="s1", status="pending", args_digest="d1", call_id="call_1", tool="pay",
                  token_hash=TOKEN_HASH)
    return RequestOnRecord(**{**fields, **changes})


def answer(decision="approve", responder="alice", token=None, args_digest="d1"):
    return RespondToApproval(session_id="s1", request_id="apr_1", decision=decision, args_digest=args_digest,
                             responder=responder, response_token=token)


def test_a_token_counts_only_for_its_own_request_and_only_once():
    assert domain.judge_token(pending(), TOKEN) is None
    assert domain.judge_token(pending(), None) is None
    assert domain.judge_token(pending(), "tok-2") == domain.Refusal(
        "bad_token", "The response token is not this request's.")
    assert domain.judge_token(pending(token_hash=None), TOKEN).reason_code == "bad_token"
    assert domain.judge_token(pending(token_used=True), TOKEN) == domain.Refusal(
        "token_used", "The response token was used before; a token counts once.")
    assert domain.judge_token(pending(token_used=True), "tok-2").reason_code == "bad_token"


def test_a_used_token_is_refused_as_used_even_once_its_request_is_decided_and_a_good_one_still_needs_the_digest():
    assert domain.judge_response(pending(status="approved", token_used=True), answer(token=TOKEN)).reason_code == (
        "token_used")
    assert domain.judge_response(pending(), answer(token=TOKEN)) is None
    assert domain.judge_response(pending(), answer(token=TOKEN, args_digest="d2")).reason_code == "digest_mismatch"
    assert domain.judge_response(pending(session_id="s2"), answer(token=TOKEN)).reason_code == "unknown_request"


# --- who may approve ------------------------------------------------------------------

APPROVERS_CATALOGUE = ToolCatalogue.model_validate({
    "groups": {"finance": ["ann", "bob"]},
    "tools": [
        {"name": "pay", "label": "Pay", "approvers": ["group:finance", "cy"], "starter_may_approve": False,
         "approvals_required": 2},
        {"name": "open", "label": "Open"},
    ]})


def test_a_tools_policy_is_its_declaration_with_groups_resolved_and_a_tool_gone_from_the_catalogue_has_no_approver():
    assert domain.approval_policy(APPROVERS_CATALOGUE, "pay") == domain.ApprovalPolicy(
        frozenset({"ann", "bob", "cy"}), starter_may_approve=False, approvals_required=2)
    assert domain.approval_policy(APPROVERS_CATALOGUE, "open") == domain.ApprovalPolicy(None, True, 1)
    assert domain.approval_policy(APPROVERS_CATALOGUE, "gone") == domain.NOBODY == domain.ApprovalPolicy(
        frozenset(), True, 1)


OPEN = domain.ApprovalPolicy()
APPROVERS = domain.ApprovalPolicy(frozenset({"ann", "bob", "token:chat"}))
SEPARATED = domain.ApprovalPolicy(starter_may_approve=False)
FOUR_EYES = domain.ApprovalPolicy(approvals_required=2)


def who(policy, request=None, **response):
    refused = domain.judge_approver(policy, request or pending(starters=frozenset({"sam"})), answer(**response))
    return refused.reason_code if refused else None


def test_anyone_a_channel_vouches_for_may_approve_a_tool_that_names_no_approvers_the_starter_included():
    assert who(OPEN, responder="zed") is None
    assert who(OPEN, responder="sam") is None


def test_only_a_tools_approvers_may_approve_it():
    assert (who(APPROVERS, responder="ann"), who(APPROVERS, responder="bob")) == (None, None)
    refused = domain.judge_approver(APPROVERS, pending(), answer(responder="zed"))
    assert (refused.reason_code, refused.reason_text) == ("not_an_approver", "'zed' is not among the approvers of 'pay'.")
    assert who(domain.NOBODY, responder="ann") == "not_an_approver"


def test_only_those_who_may_approve_a_tool_may_deny_its_calls_and_a_stranger_may_not():
    for policy in (APPROVERS, domain.NOBODY):
        refused = domain.judge_approver(policy, pending(), answer(decision="deny", responder="zed"))
        assert (refused.reason_code, refused.reason_text) == (
            "not_an_approver", "'zed' is not among the approvers of 'pay'.")
        assert who(policy, decision="deny", responder="token:web", token=TOKEN) == "not_an_approver"
    assert who(APPROVERS, decision="deny", responder="ann") is None
    assert who(APPROVERS, decision="deny", responder="token:chat", token=TOKEN) is None
    # A token may deny only where it may approve: a tool that needs known people needs them to deny too.
    assert who(SEPARATED, decision="deny", responder="token:web", token=TOKEN) == "anonymous_approval"
    assert who(OPEN, decision="deny", responder="token:web", token=TOKEN) is None
    assert who(OPEN, decision="deny", responder="zed") is None


def test_separation_of_duties_and_the_count_bind_approvals_only_so_the_starter_and_an_approver_may_still_deny():
    assert who(SEPARATED, decision="deny", responder="sam") is None
    assert who(SEPARATED, pending(starters=frozenset()), decision="deny", responder="ann") is None
    assert who(FOUR_EYES, pending(approved_by_responder=True), decision="deny") is None


def test_the_starter_of_the_session_or_of_the_calls_turn_may_not_approve_a_tool_that_forbids_it_and_another_person_may():
    request = pending(starters=frozenset({"sam", "tia"}))
    refused = domain.judge_approver(SEPARATED, request, answer(responder="sam"))
    assert (refused.reason_code, refused.reason_text) == (
        "starter_may_not_approve", "'sam' started the session; 'pay' needs someone else.")
    assert who(SEPARATED, request, responder="tia") == "starter_may_not_approve"
    assert who(SEPARATED, request, responder="ann") is None


def test_when_nobody_is_on_record_as_the_starter_a_tool_that_forbids_the_starter_cannot_be_approved():
    refused = domain.judge_approver(SEPARATED, pending(starters=frozenset()), answer(responder="ann"))
    assert (refused.reason_code, refused.reason_text) == (
        "starter_unknown",
        "Who started the session is not on record, so 'pay' cannot be approved by someone other than its starter.")


def test_a_token_names_no_person_so_it_approves_only_a_tool_that_needs_no_known_person():
    assert who(OPEN, responder="token:chat", token=TOKEN) is None
    assert who(APPROVERS, responder="token:chat", token=TOKEN) is None  # listed by name
    assert who(APPROVERS, responder="token:web", token=TOKEN) == "not_an_approver"
    refused = domain.judge_approver(SEPARATED, pending(starters=frozenset({"sam"})),
                                    answer(responder="token:chat", token=TOKEN))
    assert (refused.reason_code, refused.reason_text) == (
        "anonymous_approval", "A response token names no person; 'pay' needs answers from known people.")
    assert who(FOUR_EYES, responder="token:chat", token=TOKEN) == "anonymous_approval"


def test_a_person_who_approved_a_request_already_does_not_count_twice():
    refused = domain.judge_approver(FOUR_EYES, pending(approvals=1, approved_by_responder=True), answer())
    assert (refused.reason_code, refused.reason_text) == (
        "already_approved", "'alice' approved this request already; it needs another person.")
    assert domain.judge_approver(FOUR_EYES, pending(approvals=1), answer()) is None


def test_approvals_are_counted_until_the_required_number_of_people_approved_and_the_last_of_them_decides():
    assert domain.tally(FOUR_EYES, pending(), "approve") == domain.Tally(1, 2, decides=False)
    assert domain.tally(FOUR_EYES, pending(approvals=1), "approve") == domain.Tally(2, 2, decides=True)
    assert domain.tally(domain.ApprovalPolicy(approvals_required=3), pending(approvals=1), "approve") == (
        domain.Tally(2, 3, decides=False))
    assert domain.tally(OPEN, pending(), "approve") == domain.Tally(1, 1, decides=True)


def test_one_denial_decides_whatever_approvals_came_before():
    assert domain.tally(FOUR_EYES, pending(approvals=1), "deny") == domain.Tally(1, 2, decides=True)
    assert domain.tally(FOUR_EYES, pending(), "deny") == domain.Tally(0, 2, decides=True)


def test_an_edit_makes_a_new_version_whose_count_restarts_and_whose_digest_is_the_edited_arguments():
    before = pending(approvals=1, approved_by_responder=True, approvals_required=2, card={"v": 1},
                     starters=frozenset({"sam"}), escalated=True)
    edited = domain.edited_version(before, "d2", 2, {"v": 2})
    assert edited == pending(approvals_required=2, args_digest="d2", card={"v": 2}, starters=frozenset({"sam"}),
                             escalated=True)
    # The approval at hand is the first of the edited version, and one more is needed.
    assert domain.tally(FOUR_EYES, edited, "approve") == domain.Tally(1, 2, decides=False)
    assert domain.edited_version(before, "d2", 3).card == {"v": 1}


def test_an_edit_needs_at_least_its_editors_approval_whatever_the_rule_says_for_the_edited_arguments():
    assert domain.edited_version(pending(approvals_required=2), "d2", 0).approvals_required == 1
    assert domain.edited_version(pending(), "d2", 1).approvals_required == 1
    assert domain.edited_version(pending(), "d2", 3).approvals_required == 3


def test_who_approved_the_version_before_an_edit_may_approve_the_edited_one_and_the_other_rules_still_hold():
    before = pending(approvals=1, approved_by_responder=True, starters=frozenset({"sam"}))
    assert who(FOUR_EYES, before) == "already_approved"
    assert who(FOUR_EYES, domain.edited_version(before, "d2", 2)) is None
    edited = domain.edited_version(before, "d2", 2)
    four_eyes_separated = domain.ApprovalPolicy(starter_may_approve=False, approvals_required=2)
    assert who(four_eyes_separated, edited, responder="sam") == "starter_may_not_approve"
    assert who(APPROVERS, edited, responder="zed") == "not_an_approver"
    assert who(FOUR_EYES, edited, responder="token:chat", token=TOKEN) == "anonymous_approval"


def test_the_sessions_starter_is_whoever_started_its_first_turn_that_names_one():
    assert domain.session_starter(None, "sam") == "sam"
    assert domain.session_starter("sam", "tia") == "sam"
    assert domain.session_starter("sam", None) == "sam"
    assert domain.session_starter(None, None) is None


def test_each_refused_authentication_says_why():
    def why(response):
        return domain.authenticate_response(response, CHANNELS, at=AT, window=WINDOW).reason_text

    assert why(chat_response().model_copy(update={"signature": None})) == (
        "The response carries no signature; only a registered channel may respond.")
    assert why(chat_response(key=new_private_key(), key_id="stranger")) == "No channel is registered as 'stranger'."
    assert why(chat_response(key=new_private_key())) == (
        "The signature does not match the response or the channel's key.")
    assert why(chat_response(issued_at=AT - timedelta(minutes=10))) == (
        "The response was issued at 2026-11-30T11:50:00+00:00, outside the 300 s the ledger accepts.")


# --- who may send what --------------------------------------------------------------

def test_a_command_counts_only_from_the_broker_identity_that_may_send_it():
    from shared.topology import Topology

    topology = Topology("ns")
    assert domain.refuse_sender("approval.respond", "ns.channel.cli", topology) is None
    assert domain.refuse_sender("step.completed", "ns.model-step", topology) is None
    refused = domain.refuse_sender("approval.respond", "ns.model-step", topology)
    assert (refused.reason_code, refused.reason_text) == ("unauthorized_sender",
                                                          "ns.model-step may not send approval.respond.")
    refused = domain.refuse_sender("tool.completed", None, topology)
    assert refused.reason_text == "a sender without a user id may not send tool.completed."


# --- lifetimes: deadlines, escalation, cancellation, parked messages -------------------

from services.approval_ledger.domain import ClaimOnRecord  # noqa: E402
from shared.messages import ProviderAttempt as Attempt  # noqa: E402

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_a_request_expires_after_its_tools_own_wait_or_else_the_deployments():
    assert domain.deadline(T0, 30.0, 3600.0) == T0 + timedelta(seconds=30)
    assert domain.deadline(T0, None, 3600.0) == T0 + timedelta(hours=1)


def test_a_request_has_expired_from_its_deadline_on_and_never_without_one():
    due = pending(expires_at=T0)
    assert domain.has_expired(due, T0) and domain.has_expired(due, T0 + timedelta(seconds=1))
    assert not domain.has_expired(due, T0 - timedelta(microseconds=1))
    assert not domain.has_expired(pending(expires_at=None), T0)
    assert not domain.has_expired(due, None)


def test_an_answer_to_a_request_past_its_deadline_is_refused_as_expired_even_before_the_sweep():
    assert domain.judge_response(pending(expires_at=T0), answer(), at=T0).reason_code == "expired"
    assert domain.judge_response(pending(expires_at=T0, status="expired"), answer(), at=None).reason_code == "expired"
    assert domain.judge_response(pending(expires_at=T0), answer(), at=T0 - timedelta(seconds=1)) is None
    refused = domain.judge_response(pending(expires_at=T0, status="approved"), answer(), at=T0 + timedelta(days=1))
    assert refused.reason_code == "already_decided", "a decided request stays decided, whatever the clock says"


def test_an_expired_request_closes_its_call_saying_when():
    closed = domain.closure_of_expiry(pending(expires_at=T0))
    assert (closed.kind, closed.reason_code, closed.reason_text) == (
        "expired", "expired", "Nobody decided in time: it expired at 2026-11-30T12:00:00+00:00.")


def test_the_attempt_that_produced_a_steps_calls_is_its_completed_one():
    attempts = [Attempt(number=1, status="abandoned", provider="p"), Attempt(number=2, status="failed", provider="p"),
                Attempt(number=3, status="completed", provider="p")]
    assert domain.producing_attempt(attempts) == 3
    assert domain.producing_attempt(attempts[:2]) is None


def test_a_request_is_escalated_after_its_tools_escalation_time_and_only_if_it_has_one():
    catalogue = ToolCatalogue.model_validate({"groups": {"leads": ["lee", "lou"]}, "tools": [
        {"name": "e", "label": "E", "approvers": ["ann"], "escalation": {"after_seconds": 90, "to": ["group:leads"]}},
        {"name": "plain", "label": "P", "approvers": ["ann"]},
    ]})
    assert domain.escalation_time(T0, catalogue.get("e")) == T0 + timedelta(seconds=90)
    assert domain.escalation_time(T0, catalogue.get("plain")) is None
    assert domain.approval_policy(catalogue, "e").approvers == {"ann"}
    assert domain.approval_policy(catalogue, "e", escalated=True).approvers == {"ann", "lee", "lou"}
    assert domain.approval_policy(catalogue, "plain", escalated=True).approvers == {"ann"}


def test_only_the_sessions_open_turn_can_be_cancelled_and_only_by_its_own_id():
    assert domain.refuse_cancellation(None, None) == domain.NOTHING_TO_CANCEL
    assert domain.refuse_cancellation(None, None, session_exists=False) == domain.NO_SUCH_SESSION
    assert domain.refuse_cancellation("trn_1", None) is None
    assert domain.refuse_cancellation("trn_1", "trn_1") is None
    refused = domain.refuse_cancellation("trn_1", "trn_2")
    assert (refused.reason_code, refused.reason_text) == ("unknown_turn", "Turn trn_2 is not the session's open turn.")


def cancelled(call, claim=None, effect="outward", reason="wrong day"):
    return domain.cancellation_closure(call, claim, effect, by="ann", reason=reason)


def test_a_call_waiting_for_a_person_or_not_yet_taken_by_the_executor_closes_as_cancelled_with_who_and_why():
    for call in (a_call(status="awaiting_approval"), a_call(status="executing")):
        closed = cancelled(call)
        assert (closed.kind, closed.reason_code, closed.reason_text) == ("cancelled", "cancelled",
                                                                          "Cancelled by ann: wrong day")
    assert cancelled(a_call(status="awaiting_approval"), reason="").reason_text == "Cancelled by ann."


def test_a_finished_call_closes_with_what_it_recorded_not_as_cancelled():
    output = cancelled(a_call(), ClaimOnRecord("finished", "output", {"output": {"ok": 1}}))
    assert (output.kind, output.output) == ("output", {"ok": 1})
    error = cancelled(a_call(), ClaimOnRecord("finished", "error", {"error": "boom"}))
    assert (error.kind, error.reason_code, error.reason_text) == ("error", "tool_failed", "boom")
    unknown = cancelled(a_call(), ClaimOnRecord("finished", "outcome_unknown", {"error": "?"}))
    assert (unknown.kind, unknown.reason_code) == ("outcome_unknown", "outcome_unknown")
    assert domain.needs_operator(unknown)


def test_a_running_outward_call_may_or_may_not_have_happened_but_a_running_read_is_simply_cancelled():
    running = ClaimOnRecord("claimed")
    outward = cancelled(a_call(), running, "outward")
    assert (outward.kind, outward.reason_code, outward.reason_text) == (
        "outcome_unknown", "outcome_unknown", "Cancelled by ann: wrong day It was running; whether it happened is unknown.")
    for effect in ("read", "idempotent"):
        assert cancelled(a_call(), running, effect).kind == "cancelled"


def test_only_a_parked_message_the_open_turn_waits_on_fails_it():
    requested = Step("step_1", "s1", "turn_1", "requested")
    completed = Step("step_1", "s1", "turn_1", "completed")
    executing, closed = a_call(1, status="executing"), a_call(2, status="closed")
    for kind in ("step.requested", "step.completed"):
        assert domain.stalls_the_turn(kind, {"step_id": "step_1"}, requested, [])
        assert not domain.stalls_the_turn(kind, {"step_id": "step_0"}, requested, [])
        assert not domain.stalls_the_turn(kind, {"step_id": "step_1"}, completed, [])
        assert not domain.stalls_the_turn(kind, {"step_id": "step_1"}, None, [])
    for kind in ("tool.execute", "tool.completed"):
        assert domain.stalls_the_turn(kind, {"call_id": "call_1"}, completed, [executing, closed])
        assert not domain.stalls_the_turn(kind, {"call_id": "call_2"}, completed, [executing, closed])
        assert not domain.stalls_the_turn(kind, {}, completed, [executing])
    for kind in ("approval.respond", "turn.start", "?"):
        assert not domain.stalls_the_turn(kind, {"step_id": "step_1", "call_id": "call_1"}, requested, [executing])


def test_a_session_id_from_a_parked_body_is_used_only_if_it_is_an_identifier():
    assert domain.is_identifier("ses_abc-1") and not domain.is_identifier("?")
    assert not domain.is_identifier("") and not domain.is_identifier("x" * 65) and not domain.is_identifier("a b")


# --- a turn's bound ---------------------------------------------------------------------


def test_a_turn_may_ask_for_another_step_until_it_has_taken_its_bound_of_steps():
    from services.approval_ledger.domain import TurnBounds, TurnSpend, turn_bound_reached

    bounds = TurnBounds(steps=3, tokens=1000)
    assert turn_bound_reached(bounds, TurnSpend(2, 2, 10), "still trying") is None
    reached = turn_bound_reached(bounds, TurnSpend(3, 4, 10), "still trying")
    assert reached is not None and reached.bound == "steps"
    assert reached.text == (
        "The turn reached its bound of 3 model steps (3 model steps, 4 provider calls, 10 tokens)."
        " The model's last words: 'still trying'."
    )


def test_a_turn_ends_once_its_provider_tokens_reach_the_bound_and_a_zero_bound_is_none():
    from services.approval_ledger.domain import TurnBounds, TurnSpend, turn_bound_reached

    assert turn_bound_reached(TurnBounds(steps=0, tokens=100), TurnSpend(50, 50, 99), "") is None
    reached = turn_bound_reached(TurnBounds(steps=0, tokens=100), TurnSpend(50, 50, 100), "")
    assert reached is not None and reached.bound == "tokens" and "bound of 100 provider tokens" in reached.text
    assert turn_bound_reached(TurnBounds(steps=0, tokens=0), TurnSpend(10**6, 10**6, 10**9), "") is None


def test_a_turns_spend_counts_the_provider_attempts_and_tokens_the_transition_at_hand_records():
    from services.approval_ledger.domain import TurnSpend, spent_with
    from shared.messages import Usage

    stored = TurnSpend(steps=2, provider_calls=3, tokens=100)
    now_spent = (
        (Attempt(number=1, status="failed", provider="p", usage=Usage(input_tokens=5, output_tokens=0)), "failed"),
        (Attempt(number=2, status="completed", provider="p", usage=Usage(input_tokens=7, output_tokens=11)), "completed"),
    )
    assert spent_with(stored, now_spent) == TurnSpend(steps=2, provider_calls=5, tokens=123)
    assert spent_with(stored, ()) == stored
# --- whom a channel speaks for (docs/design.md, "Trust boundaries") -------------------

SPEAKERS = {"inbox": Channel("inbox", CHANNEL_KEY.public_key(), ("alice",)),
            "cli": Channel("cli", CHANNEL_KEY.public_key(), ("root", "bob"))}


def speaker(channel_name, principal, doing="start a turn"):
    refused = domain.judge_speaker(SPEAKERS, channel_name, principal, doing)
    return refused.reason_code if refused else None


def test_a_channel_may_start_or_cancel_a_turn_only_as_a_principal_it_is_registered_for():
    assert speaker("inbox", "alice") is None
    assert speaker("cli", "bob", "cancel a turn") is None
    refused = domain.judge_speaker(SPEAKERS, "inbox", "carol", "start a turn")
    assert (refused.reason_code, refused.reason_text) == (
        "wrong_principal", "Channel 'inbox' may not start a turn as 'carol'.")
    assert speaker("inbox", "bob", "cancel a turn") == "wrong_principal"


def test_a_turn_that_names_no_starter_is_not_refused_for_it_its_starter_stays_unknown():
    assert speaker("inbox", None) is None


def test_a_sender_that_is_no_registered_channel_speaks_for_nobody_and_no_channel_may_name_a_token():
    refused = domain.judge_speaker(SPEAKERS, "stranger", "alice", "start a turn")
    assert (refused.reason_code, refused.reason_text) == (
        "wrong_principal", "'stranger' is no registered channel; it may not start a turn.")
    assert speaker(None, "alice") == "wrong_principal"
    anyone = {"cli": Channel("cli", CHANNEL_KEY.public_key(), ("*",))}
    assert domain.judge_speaker(anyone, "cli", "token:cli", "cancel a turn").reason_code == "wrong_principal"


def test_a_response_counts_only_from_the_channel_whose_key_signed_it():
    assert domain.judge_key_channel("inbox", "inbox") is None
    refused = domain.judge_key_channel("inbox", "cli")
    assert (refused.reason_code, refused.reason_text) == (
        "wrong_channel", "The response is signed with channel 'inbox''s key but was sent by channel 'cli'.")
    assert domain.judge_key_channel("inbox", None).reason_code == "wrong_channel"
    assert domain.judge_key_channel(None, None).reason_code == "wrong_channel"


def test_a_turn_that_names_no_starter_leaves_its_calls_starter_unknown_even_in_a_session_someone_started():
    assert domain.starters_of("sam", "sam") == frozenset({"sam"})
    assert domain.starters_of("sam", "tia") == frozenset({"sam", "tia"})
    assert domain.starters_of(None, "tia") == frozenset({"tia"})
    assert domain.starters_of("sam", None) == frozenset()
    refused = domain.judge_approver(SEPARATED, pending(starters=domain.starters_of("sam", None)),
                                    answer(responder="alice"))
    assert refused.reason_code == "starter_unknown"


OPERATORS_CATALOGUE = ToolCatalogue.model_validate({
    "groups": {"finance": ["ann", "bob"], "operators": ["olga"]},
    "tools": [{"name": "pay", "label": "Pay", "approvers": ["group:finance"]}, {"name": "open", "label": "Open"}]})


def canceller(who, starters=frozenset({"sam"}), pending_tools=(), catalogue=OPERATORS_CATALOGUE):
    policies = [domain.approval_policy(catalogue, tool, escalated=escalated) for tool, escalated in pending_tools]
    refused = domain.judge_canceller(who, starters, policies, domain.operators(catalogue))
    return refused.reason_code if refused else None


def test_the_operators_are_the_tools_files_group_operators_and_nobody_without_one():
    assert domain.operators(OPERATORS_CATALOGUE) == frozenset({"olga"})
    assert domain.operators(APPROVERS_CATALOGUE) == frozenset()


def test_the_starter_of_the_session_or_its_turn_and_an_operator_may_cancel_it():
    assert canceller("sam") is None
    assert canceller("tia", starters=frozenset({"sam", "tia"})) is None
    assert canceller("olga") is None
    assert canceller("olga", starters=frozenset()) is None


def test_an_approver_of_a_pending_request_may_cancel_and_anyone_else_may_not():
    assert canceller("ann", pending_tools=[("pay", False)]) is None
    refused = domain.judge_canceller("alice", frozenset({"sam"}), [domain.approval_policy(OPERATORS_CATALOGUE, "pay")],
                                     frozenset({"olga"}))
    assert refused.reason_code == "may_not_cancel"
    assert refused.reason_text == ("'alice' neither started this session or its turn, nor may approve what it waits "
                                   "on, nor is an operator; only they may cancel it.")
    # Nothing pending (the turn runs): only its starters and the operators.
    assert canceller("ann") == "may_not_cancel"
    # A tool that names no approvers lets anyone its channel vouches for approve, so cancel.
    assert canceller("alice", pending_tools=[("open", False)]) is None
    # A tool gone from the catalogue: nobody may approve it, so nobody cancels by it.
    assert canceller("ann", pending_tools=[("gone", False)]) == "may_not_cancel"


def test_once_a_request_is_escalated_its_escalation_group_may_cancel_too():
    catalogue = ToolCatalogue.model_validate({
        "groups": {"leads": ["lee"]},
        "tools": [{"name": "pay", "label": "Pay", "approvers": ["ann"],
                   "escalation": {"after_seconds": 60, "to": ["group:leads"]}}]})
    assert canceller("lee", pending_tools=[("pay", False)], catalogue=catalogue) == "may_not_cancel"
    assert canceller("lee", pending_tools=[("pay", True)], catalogue=catalogue) is None
