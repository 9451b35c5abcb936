"""The decisions a person asks for beyond approve and deny, as pure rules:
conditional approval (`verdict`), edit before approve (`judge_edit`), approve and
remember (`may_remember`, `grant_covering`). No services, no database."""

from datetime import UTC, datetime, timedelta

import pytest

from services.approval_ledger.decision_rules import (
    REASON_CHARS,
    CardOnRecord,
    EditAccepted,
    EditRefused,
    Grant,
    RememberAsked,
    Verdict,
    approvers_in_words,
    grant_covering,
    grant_expiry,
    judge_edit,
    may_remember,
    verdict,
)
from shared.catalogue import ToolSpec
from shared.redaction import REDACTED

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PAYMENT_PARAMETERS = {
    "type": "object",
    "properties": {
        "amount": {"type": "number"},
        "payee": {"type": "string"},
        "memo": {"type": "string"},
        "api_key": {"type": "string", "format": "password"},
        "account": {
            "type": "object",
            "properties": {"iban": {"type": "string"}, "pin": {"type": "string", "format": "password"}},
        },
    },
    "required": ["amount", "payee"],
}
TWO_ABOVE_A_THOUSAND = [
    {"when": "args.amount > 1000", "then": 2, "reason": "amount {amount:,} > 1,000: two approvers"},
    {"then": 1, "reason": "amount {amount:,} up to 1,000: one approver"},
]
PUBLIC_BUCKET_FREE = [
    {"when": "args.bucket == 'public'", "then": "never", "reason": "bucket {bucket} is public"},
    {"then": "always", "reason": "bucket {bucket} is not public"},
]


def tool(**declared) -> ToolSpec:
    return ToolSpec.model_validate(
        {"name": "pay", "label": "Pay an invoice", "parameters": PAYMENT_PARAMETERS, **declared}
    )


def read_tool(**declared) -> ToolSpec:
    return ToolSpec.model_validate(
        {
            "name": "read",
            "label": "Read a file",
            "effect": "read",
            "parameters": {"type": "object", "properties": {"bucket": {"type": "string"}, "size": {"type": "integer"}}},
            **declared,
        }
    )


# --- conditional approval -------------------------------------------------------------------


def test_a_payment_above_a_thousand_needs_two_approvers_and_says_why_with_the_amount_grouped():
    assert verdict(tool(approvals_required=TWO_ABOVE_A_THOUSAND), {"amount": 2500, "payee": "ACME"}) == Verdict(
        2, "amount 2,500 > 1,000: two approvers"
    )


def test_a_payment_of_a_thousand_or_less_needs_one_approver():
    assert verdict(tool(approvals_required=TWO_ABOVE_A_THOUSAND), {"amount": 1000, "payee": "ACME"}) == Verdict(
        1, "amount 1,000 up to 1,000: one approver"
    )


def test_a_read_of_the_public_bucket_needs_no_approval_and_says_why():
    decided = verdict(read_tool(approval=PUBLIC_BUCKET_FREE), {"bucket": "public"})
    assert decided == Verdict(0, "bucket public is public")
    assert not decided.needs_approval


def test_a_read_of_another_bucket_needs_one_approver_and_the_reason_names_the_rule_and_the_count():
    decided = verdict(read_tool(approval=PUBLIC_BUCKET_FREE), {"bucket": "payroll"})
    assert decided == Verdict(1, "bucket payroll is not public: one approver")
    assert decided.needs_approval


def test_a_tool_without_rules_always_asks_its_declared_number_of_approvers():
    assert verdict(tool(approvals_required=3, approvers=["a", "b", "c"]), {"amount": 1}) == Verdict(
        3, "Pay an invoice always asks: three approvers"
    )


def test_a_tool_that_never_asks_runs_without_approval():
    assert verdict(tool(approval="never"), {"amount": 1}) == Verdict(0, "Pay an invoice never asks")


def test_both_rules_give_both_reasons_the_approval_first():
    both = read_tool(
        approval=PUBLIC_BUCKET_FREE,
        approvals_required=[{"when": "args.size > 10", "then": 2, "reason": "size {size} > 10"}, {"then": 1}],
    )
    assert verdict(both, {"bucket": "hr", "size": 11}) == Verdict(2, "bucket hr is not public; size 11 > 10")
    assert verdict(both, {"bucket": "hr", "size": 1}) == Verdict(1, "bucket hr is not public; one approver")
    # No approval needed: the count's rule is not even read (a missing size is no error).
    assert verdict(both, {"bucket": "public"}) == Verdict(0, "bucket public is public")


def test_a_case_without_a_reason_is_explained_by_its_condition():
    rule = [{"when": "args.amount > 1000", "then": 2}, {"then": 1}]
    assert verdict(tool(approvals_required=rule), {"amount": 5000}) == Verdict(2, "args.amount > 1000: two approvers")
    assert verdict(tool(approvals_required=rule), {"amount": 5}) == Verdict(1, "one approver")
    approval = [{"when": "args.bucket == 'public'", "then": "never"}, {"then": "always"}]
    assert verdict(read_tool(approval=approval), {"bucket": "public"}) == Verdict(0, "args.bucket == 'public'")
    assert verdict(read_tool(approval=approval), {"bucket": "hr"}) == Verdict(1, "no condition held: one approver")


def test_the_first_case_that_holds_decides_even_when_a_later_one_holds_too():
    rule = [
        {"when": "args.amount > 10000", "then": 3, "reason": "huge"},
        {"when": "args.amount > 1000", "then": 2, "reason": "large"},
        {"then": 1, "reason": "small"},
    ]
    spec = tool(approvals_required=rule)
    assert [verdict(spec, {"amount": a}).reason for a in (20000, 2000, 20)] == ["huge", "large", "small"]
    assert [verdict(spec, {"amount": a}).approvals_required for a in (20000, 2000, 20)] == [3, 2, 1]


def test_a_missing_field_gives_the_safe_default_the_most_approvers_naming_the_field():
    decided = verdict(tool(approvals_required=TWO_ABOVE_A_THOUSAND), {"payee": "ACME"})
    assert decided.approvals_required == 2
    assert decided.error == "case 1 of the approvals_required rule could not be evaluated (no argument 'amount')"
    assert decided.reason == f"{decided.error}: two approvers, the most this tool asks"


def test_a_value_of_the_wrong_type_gives_the_safe_default_and_never_repeats_the_value():
    decided = verdict(tool(approvals_required=TWO_ABOVE_A_THOUSAND), {"amount": "s3cr3t-ish", "payee": "x"})
    assert decided.approvals_required == 2
    assert decided.error == (
        "case 1 of the approvals_required rule could not be evaluated (an argument is not of the type it compares)"
    )
    assert "s3cr3t" not in decided.reason


def test_an_approval_rule_that_fails_asks_the_most_approvers_even_if_it_might_have_said_never():
    spec = read_tool(approval=PUBLIC_BUCKET_FREE, approvals_required=3, approvers=["a", "b", "c"])
    decided = verdict(spec, {"size": 1})
    error = "case 1 of the approval rule could not be evaluated (no argument 'bucket')"
    assert decided == Verdict(3, f"{error}: three approvers, the most this tool asks", error)


def test_a_missing_key_read_through_another_argument_is_not_named():
    # The key here is an argument's value (it could be a secret): it is never repeated.
    spec = read_tool(approval=[{"when": "{'x': 1}[args.bucket] == 1", "then": "never"}, {"then": "always"}])
    decided = verdict(spec, {"bucket": "topsecret"})
    assert decided.error == "case 1 of the approval rule could not be evaluated (an argument it reads is missing)"
    assert "topsecret" not in decided.reason


def test_a_condition_that_is_not_true_or_false_gives_the_safe_default():
    spec = tool(approvals_required=[{"when": "args.amount", "then": 2}, {"then": 1}])
    decided = verdict(spec, {"amount": 5, "payee": "x"})
    assert decided.approvals_required == 2
    assert (
        decided.error
        == "case 1 of the approvals_required rule could not be evaluated (its result is not true or false)"
    )


def test_any_other_evaluation_failure_gives_the_safe_default_without_its_text():
    spec = tool(approvals_required=[{"when": "args.amount / 0 > 1", "then": 2}, {"then": 1}])
    decided = verdict(spec, {"amount": 5, "payee": "x"})
    assert decided.approvals_required == 2
    assert (
        decided.error == "case 1 of the approvals_required rule could not be evaluated (it failed on these arguments)"
    )


def test_an_error_absorbed_by_an_or_that_is_true_anyway_is_no_error():
    # CEL's own rule: `error || true` is true.
    spec = tool(approvals_required=[{"when": "args.missing > 1 || args.amount > 1", "then": 2}, {"then": 1}])
    assert verdict(spec, {"amount": 5, "payee": "x"}) == Verdict(
        2, "args.missing > 1 || args.amount > 1: two approvers"
    )


def test_a_later_case_is_reached_only_when_the_earlier_ones_do_not_hold():
    spec = tool(
        approvals_required=[
            {"when": "args.amount > 10", "then": 2, "reason": "big"},
            {"when": "args.payee == 'me'", "then": 2, "reason": "to me"},
            {"then": 1, "reason": "small"},
        ]
    )
    assert verdict(spec, {"amount": 5, "payee": "me"}).reason == "to me"
    # The second case would fail (no payee) but the first decides before it is read.
    assert verdict(spec, {"amount": 50}).reason == "big"
    assert verdict(spec, {"amount": 5}).error == (
        "case 2 of the approvals_required rule could not be evaluated (no argument 'payee')"
    )


def test_a_reason_shows_a_secret_as_the_card_does_hidden():
    spec = tool(
        approvals_required=[{"when": "size(args.api_key) > 3", "then": 2, "reason": "key {api_key}"}, {"then": 1}]
    )
    decided = verdict(spec, {"amount": 1, "payee": "x", "api_key": "hunter2"})
    assert decided.reason == f"key {REDACTED}"


def test_a_reason_keeps_a_placeholder_the_call_lacks_and_groups_only_numbers():
    spec = tool(approvals_required=[{"then": 1, "reason": "{memo:,} {payee:,} {amount:,} {nothing} {flag:,}"}])
    assert (
        verdict(spec, {"amount": 1234567.5, "payee": "ACME", "memo": "x"}).reason
        == "x ACME 1,234,567.5 {nothing} {flag:,}"
    )


def test_a_reason_does_not_group_a_boolean_and_shows_structures_as_json():
    spec = read_tool(
        parameters={"type": "object", "properties": {"flag": {"type": "boolean"}, "tags": {"type": "array"}}},
        approvals_required=[{"then": 1, "reason": "{flag:,} {tags}"}],
    )
    assert verdict(spec, {"flag": True, "tags": ["a", "b"]}).reason == 'true ["a", "b"]'


def test_a_long_value_in_a_reason_is_cut_and_a_long_reason_is_cut_to_its_limit():
    spec = tool(approvals_required=[{"then": 1, "reason": "to {payee}"}])
    assert verdict(spec, {"amount": 1, "payee": "p" * 100}).reason == "to " + "p" * 59 + "…"
    exactly = tool(approvals_required=[{"then": 1, "reason": "{payee}{memo}{amount}"}])
    fits = verdict(exactly, {"payee": "a" * 60, "memo": "b" * 60, "amount": 1})
    assert fits.reason == "a" * 60 + "b" * 60 + "1"  # exactly the limit: whole
    long_label = ToolSpec(name="t", label="L" * (REASON_CHARS + 10))
    reason = verdict(long_label, {}).reason
    assert len(reason) == REASON_CHARS and reason.endswith("…") and reason.startswith("L" * (REASON_CHARS - 1))
    at_limit = ToolSpec(name="t", label="L" * (REASON_CHARS - len(" always asks: one approver")))
    assert len(verdict(at_limit, {}).reason) == REASON_CHARS and not verdict(at_limit, {}).reason.endswith("…")


def test_approvers_are_counted_in_words_up_to_ten_then_in_figures():
    assert [approvers_in_words(n) for n in (1, 2, 10, 11)] == [
        "one approver",
        "two approvers",
        "ten approvers",
        "11 approvers",
    ]


def test_conditions_see_nested_arguments_lists_and_the_standard_functions():
    spec = tool(
        approval=[
            {"when": "has(args.account) && args.account.iban.startsWith('DE')", "then": "never", "reason": "domestic"},
            {"when": "args.payee in ['me', 'myself'] || size(args.memo) > 5", "then": "never", "reason": "listed"},
            {"then": "always", "reason": "other"},
        ]
    )
    assert verdict(spec, {"amount": 1, "payee": "x", "account": {"iban": "DE12"}}).reason == "domestic"
    assert verdict(spec, {"amount": 1, "payee": "me", "memo": ""}).reason == "listed"
    assert verdict(spec, {"amount": 1, "payee": "x", "memo": "abc"}).reason == "other: one approver"


# --- edit before approve --------------------------------------------------------------------

ORIGINAL = {"amount": 2500, "payee": "ACME", "memo": "invoice 7", "api_key": "k-123456"}


def shown(arguments):
    return {**arguments, "api_key": REDACTED}


def test_an_edit_of_an_editable_field_binds_the_edited_arguments_and_keeps_a_hidden_value_sent_as_shown():
    edited = judge_edit(tool(editable=["amount"]), ORIGINAL, {**shown(ORIGINAL), "amount": 250})
    assert edited == EditAccepted({**ORIGINAL, "amount": 250}, ("amount",), "amount: 2500 → 250")


def test_a_tool_that_is_not_editable_refuses_every_edit_even_one_that_changes_nothing():
    for declared in ({}, {"editable": False}, {"editable": []}):
        refused = judge_edit(tool(**declared), ORIGINAL, ORIGINAL)
        assert refused == EditRefused("tool_not_editable", "pay does not let a person edit its arguments")


def test_a_change_to_a_field_not_listed_as_editable_is_refused_naming_the_field():
    assert judge_edit(tool(editable=["amount"]), ORIGINAL, {**ORIGINAL, "amount": 1, "payee": "Mallory"}) == (
        EditRefused("field_not_editable", "not editable: payee")
    )


def test_removing_or_adding_a_field_not_listed_is_refused_too():
    without = {k: v for k, v in ORIGINAL.items() if k != "memo"}
    assert judge_edit(tool(editable=["amount"]), ORIGINAL, without) == EditRefused(
        "field_not_editable", "not editable: memo"
    )
    added = {**ORIGINAL, "account": {"iban": "X"}}
    assert judge_edit(tool(editable=["amount"]), ORIGINAL, added) == EditRefused(
        "field_not_editable", "not editable: account"
    )


def test_an_edit_that_breaks_the_schema_is_refused_naming_the_rule_and_never_the_value():
    refused = judge_edit(tool(editable=True), ORIGINAL, {**ORIGINAL, "amount": "lots"})
    assert refused == EditRefused("edit_breaks_schema", 'amount: must be of type "number"')
    assert judge_edit(tool(editable=True), ORIGINAL, {**ORIGINAL, "extra": 1}) == EditRefused(
        "edit_breaks_schema", "extra: not a parameter of this tool"
    )
    removed = {k: v for k, v in ORIGINAL.items() if k != "payee"}
    assert judge_edit(tool(editable=True), ORIGINAL, removed) == EditRefused(
        "edit_breaks_schema", "(arguments): missing required 'payee'"
    )


def test_every_field_of_a_tool_editable_as_a_whole_may_change_and_the_diff_lists_each_in_order():
    edited = {"amount": 10, "payee": "ACME", "api_key": REDACTED, "account": {"iban": "DE1"}}
    accepted = judge_edit(tool(editable=True), ORIGINAL, edited)
    assert accepted == EditAccepted(
        {"amount": 10, "payee": "ACME", "api_key": "k-123456", "account": {"iban": "DE1"}},
        ("amount", "memo", "account"),
        'amount: 2500 → 10; memo: removed; account: set to {"iban": "DE1"}',
    )


def test_an_edit_that_changes_nothing_is_accepted_as_no_change():
    assert judge_edit(tool(editable=True), ORIGINAL, shown(ORIGINAL)) == EditAccepted(ORIGINAL, (), "no change")


def test_a_new_secret_replacing_a_hidden_one_is_accepted_and_the_diff_hides_both():
    accepted = judge_edit(tool(editable=["api_key"]), ORIGINAL, {**shown(ORIGINAL), "api_key": "k-new"})
    assert accepted == EditAccepted({**ORIGINAL, "api_key": "k-new"}, ("api_key",), "api_key: changed (hidden)")


def test_the_marker_left_inside_a_changed_field_is_refused_a_hidden_value_cannot_be_partly_edited():
    original = {**ORIGINAL, "account": {"iban": "DE1", "pin": "1234"}}
    edited = {**shown(original), "account": {"iban": "DE2", "pin": REDACTED}}
    assert judge_edit(tool(editable=True), original, edited) == EditRefused(
        "hidden_value_edited", "account: a hidden value may be replaced whole or left as it was"
    )
    in_a_list = judge_edit(tool(editable=True), ORIGINAL, {**shown(ORIGINAL), "memo": [REDACTED]})
    assert in_a_list == EditRefused(
        "hidden_value_edited", "memo: a hidden value may be replaced whole or left as it was"
    )
    # The whole nested field sent back as the card showed it is unchanged: the real pin is kept.
    unchanged = {**shown(original), "account": {"iban": "DE1", "pin": REDACTED}, "amount": 1}
    assert judge_edit(tool(editable=True), original, unchanged) == EditAccepted(
        {**original, "amount": 1}, ("amount",), "amount: 2500 → 1"
    )


def test_one_and_true_are_different_arguments_to_an_edit():
    refused = judge_edit(tool(editable=True), {"amount": 1, "payee": "x"}, {"amount": True, "payee": "x"})
    assert refused == EditRefused("edit_breaks_schema", 'amount: must be of type "number"')


def test_a_long_value_in_a_diff_is_cut():
    accepted = judge_edit(tool(editable=True), ORIGINAL, {**shown(ORIGINAL), "memo": "m" * 100})
    assert isinstance(accepted, EditAccepted)
    assert accepted.diff == 'memo: "invoice 7" → "' + "m" * 58 + "…"


def test_an_editable_field_named_in_the_refusal_is_cut_when_long():
    name = "n" * 100
    refused = judge_edit(tool(editable=["amount"]), ORIGINAL, {**ORIGINAL, name: 1})
    assert refused == EditRefused("field_not_editable", "not editable: " + "n" * 59 + "…")


# --- approve and remember -------------------------------------------------------------------

CARD = CardOnRecord(session_id="ses_1", tool="read", target="bucket hr")


def rememberable_read(**declared) -> ToolSpec:
    return read_tool(rememberable=True, target="bucket {bucket}", **declared)


def test_a_rememberable_tool_may_be_remembered_for_its_card_with_or_without_the_target_and_a_duration():
    spec = rememberable_read()
    assert may_remember(spec, CARD, RememberAsked("ses_1", "read", "bucket hr")) is None
    assert may_remember(spec, CARD, RememberAsked("ses_1", "read", None, hours=8)) is None
    assert may_remember(spec, CARD, RememberAsked("ses_1", "read", None, hours=0.5)) is None


def test_a_tool_that_is_not_rememberable_is_refused():
    assert may_remember(read_tool(), CARD, RememberAsked("ses_1", "read", None)) == "tool_not_rememberable"


def test_a_grant_wider_than_the_card_is_refused_with_what_it_widens():
    spec = rememberable_read()
    assert may_remember(spec, CARD, RememberAsked("ses_2", "read", None)) == "other_session"
    assert may_remember(spec, CARD, RememberAsked("ses_1", "pay", None)) == "other_tool"
    assert may_remember(spec, CARD, RememberAsked("ses_1", "read", "bucket payroll")) == "other_target"


@pytest.mark.parametrize("hours", [0, -1, float("inf"), float("nan")])
def test_a_grant_for_no_time_negative_time_or_forever_in_hours_is_refused(hours):
    assert may_remember(rememberable_read(), CARD, RememberAsked("ses_1", "read", None, hours)) == "bad_duration"


def test_a_grant_may_last_up_to_a_year_of_hours_and_no_longer():
    """Longer is refused; a time past the calendar's end would fail the transition instead."""
    from services.approval_ledger.decision_rules import MAX_GRANT_HOURS

    assert MAX_GRANT_HOURS == 24 * 366
    spec = rememberable_read()
    assert may_remember(spec, CARD, RememberAsked("ses_1", "read", None, float(MAX_GRANT_HOURS))) is None
    assert may_remember(spec, CARD, RememberAsked("ses_1", "read", None, MAX_GRANT_HOURS + 0.01)) == "bad_duration"
    assert may_remember(spec, CARD, RememberAsked("ses_1", "read", None, 1e300)) == "bad_duration"


def test_a_grant_expires_after_its_hours_or_lasts_the_session():
    assert grant_expiry(NOW, 2) == NOW + timedelta(hours=2)
    assert grant_expiry(NOW, None) is None


def grant(**fields) -> Grant:
    values = {
        "grant_id": "grt_1",
        "granted_by": "alice",
        "session_id": "ses_1",
        "tool": "read",
        "tool_version": "1",
        "target": "bucket hr",
        "granted_at": NOW - timedelta(hours=1),
        **fields,
    }
    return Grant(**values)


def covering(grants, *, target="bucket hr", now=NOW, approvals_required=1, spec=None, session_id="ses_1"):
    return grant_covering(
        grants, session_id, spec or rememberable_read(), target, now, approvals_required=approvals_required
    )


def test_a_grant_for_the_session_tool_and_target_covers_a_matching_call():
    given = grant()
    assert covering([given]) is given


def test_a_grant_for_any_target_covers_every_target_of_its_tool():
    given = grant(target=None)
    assert covering([given], target="bucket payroll") is given


def test_a_grant_covers_no_other_session_tool_version_or_target():
    assert covering([grant(session_id="ses_2")]) is None
    assert covering([grant(tool="pay")]) is None
    assert covering([grant(tool_version="2")]) is None
    assert covering([grant()], target="bucket payroll") is None


def test_a_grant_covers_nothing_before_it_was_given_and_covers_from_that_very_moment():
    assert covering([grant(granted_at=NOW + timedelta(seconds=1))]) is None
    assert covering([grant(granted_at=NOW)]) is not None


def test_a_grant_covers_until_it_expires_and_not_at_its_expiry():
    assert covering([grant(expires_at=NOW + timedelta(seconds=1))]) is not None
    assert covering([grant(expires_at=NOW)]) is None


def test_a_revocation_counts_for_every_call_decided_at_or_after_it():
    assert covering([grant(revoked_at=NOW)]) is None
    assert covering([grant(revoked_at=NOW - timedelta(seconds=1))]) is None
    assert covering([grant(revoked_at=NOW + timedelta(seconds=1))]) is not None


def test_a_grant_covers_no_call_that_requires_more_approvals_than_the_request_it_was_given_on():
    assert covering([grant(approvals_required=1)], approvals_required=2) is None
    assert covering([grant(approvals_required=2)], approvals_required=2) is not None
    assert covering([grant(approvals_required=2)], approvals_required=1) is not None


def test_a_tool_no_longer_rememberable_is_covered_by_none_of_its_grants():
    assert covering([grant()], spec=read_tool(target="bucket {bucket}")) is None


def test_of_several_grants_the_one_for_this_target_wins_then_the_longest_then_the_oldest():
    any_target = grant(grant_id="grt_any", target=None)
    this_target = grant(grant_id="grt_this", expires_at=NOW + timedelta(minutes=1))
    assert covering([any_target, this_target]) is this_target
    assert covering([this_target, any_target]) is this_target
    # Ids against the expected order: the expiry decides, not the id.
    short = grant(grant_id="grt_a", expires_at=NOW + timedelta(hours=1))
    long = grant(grant_id="grt_b", expires_at=NOW + timedelta(hours=5))
    forever = grant(grant_id="grt_c")
    assert covering([short, long]) is long
    assert covering([long, short]) is long
    assert covering([short, forever, long]) is forever
    old = grant(grant_id="grt_b", granted_at=NOW - timedelta(hours=3))
    new = grant(grant_id="grt_a", granted_at=NOW - timedelta(hours=1))
    assert covering([new, old]) is old
    twin = grant(grant_id="grt_0", granted_at=NOW - timedelta(hours=3))
    assert covering([old, twin]) is twin


def test_no_grant_covers_nothing():
    assert covering([]) is None


def test_a_failure_of_the_evaluator_itself_gives_the_safe_default(monkeypatch):
    class Broken:
        def evaluate(self, context):
            raise RecursionError

    monkeypatch.setattr("services.approval_ledger.decision_rules.compiled_condition", lambda text: Broken())
    decided = verdict(tool(approvals_required=TWO_ABOVE_A_THOUSAND), {"amount": 5, "payee": "x"})
    assert decided.approvals_required == 2
    assert decided.error == "case 1 of the approvals_required rule could not be evaluated (the evaluator failed)"


def test_an_error_handed_back_as_the_value_gives_the_safe_default(monkeypatch):
    import celpy

    class Erring:
        def evaluate(self, context):
            return celpy.CELEvalError("no such member in mapping: 'amount'", KeyError, None)

    monkeypatch.setattr("services.approval_ledger.decision_rules.compiled_condition", lambda text: Erring())
    decided = verdict(tool(approvals_required=TWO_ABOVE_A_THOUSAND), {"payee": "x"})
    assert decided.error == "case 1 of the approvals_required rule could not be evaluated (no argument 'amount')"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("no such member in mapping: 'amount'", KeyError), "no argument 'amount'"),
        (("no such member in mapping: 'amount'",), "it failed on these arguments"),
        ((), "it failed on these arguments"),
    ],
)
def test_an_error_of_any_shape_from_the_evaluator_is_named_only_as_far_as_it_says(monkeypatch, args, said):
    import celpy

    class Erring:
        def evaluate(self, context):
            raise celpy.CELEvalError(*args)

    monkeypatch.setattr("services.approval_ledger.decision_rules.compiled_condition", lambda text: Erring())
    decided = verdict(tool(approvals_required=TWO_ABOVE_A_THOUSAND), {"payee": "x"})
    assert decided.error == f"case 1 of the approvals_required rule could not be evaluated ({said})"


def test_a_missing_field_with_capitals_in_its_name_is_named():
    spec = read_tool(
        parameters={"type": "object", "properties": {"Bucket_2": {"type": "string"}}},
        approval=[{"when": "args.Bucket_2 == 'x'", "then": "never"}, {"then": "always"}],
    )
    assert verdict(spec, {}).error == "case 1 of the approval rule could not be evaluated (no argument 'Bucket_2')"


def test_a_structure_in_a_reason_is_shown_with_its_keys_sorted():
    spec = read_tool(
        parameters={"type": "object", "properties": {"meta": {"type": "object", "additionalProperties": True}}},
        approvals_required=[{"then": 1, "reason": "{meta}"}],
    )
    assert verdict(spec, {"meta": {"b": 1, "a": 2}}).reason == '{"a": 2, "b": 1}'


def test_an_object_sent_back_with_its_keys_in_another_order_is_unchanged():
    original = {**ORIGINAL, "account": {"iban": "DE1", "pin": "1234"}}
    reordered = {**shown(original), "account": {"pin": REDACTED, "iban": "DE1"}}
    assert judge_edit(tool(editable=True), original, reordered) == EditAccepted(original, (), "no change")
    edited = {**shown(original), "account": {"iban": "DE1", "pin": "1234"}}
    assert judge_edit(tool(editable=True), original, edited) == EditAccepted(original, (), "no change")
    unsorted = {**ORIGINAL, "account": {"pin": "1234", "iban": "DE1"}}
    sorted_back = {**shown(unsorted), "account": {"iban": "DE1", "pin": REDACTED}}
    assert judge_edit(tool(editable=True), unsorted, sorted_back) == EditAccepted(unsorted, (), "no change")


def test_a_diff_shows_a_structure_with_its_keys_sorted():
    accepted = judge_edit(tool(editable=True), ORIGINAL, {**shown(ORIGINAL), "account": {"pin": "9", "iban": "DE"}})
    assert isinstance(accepted, EditAccepted)
    assert accepted.diff == f'account: set to {{"iban": "DE", "pin": "{REDACTED}"}}'


def test_every_refused_field_and_every_schema_error_is_listed():
    assert judge_edit(tool(editable=["memo"]), ORIGINAL, {**ORIGINAL, "amount": 1, "payee": "y"}) == EditRefused(
        "field_not_editable", "not editable: amount, payee"
    )
    both = {**shown(ORIGINAL), "memo": [REDACTED], "payee": {"x": REDACTED}}
    assert judge_edit(tool(editable=True), ORIGINAL, both) == EditRefused(
        "hidden_value_edited", "payee, memo: a hidden value may be replaced whole or left as it was"
    )
    broken = {**ORIGINAL, "amount": "x", "payee": 3}
    assert judge_edit(tool(editable=True), ORIGINAL, broken) == EditRefused(
        "edit_breaks_schema", 'amount: must be of type "number"; payee: must be of type "string"'
    )
