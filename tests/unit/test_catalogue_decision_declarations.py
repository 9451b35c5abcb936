"""What a tool declares about the decisions beyond approve and deny, checked when the catalogue
loads: approval rules over the arguments (CEL), editable fields, and whether a tool
may be remembered. A bad declaration stops the load, naming the tool. Pure."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from services.approval_ledger.decision_rules import Verdict, verdict
from shared.catalogue import (
    ApprovalCase,
    ApprovalsCase,
    Rememberable,
    ToolCatalogue,
    ToolSpec,
    compiled_condition,
    load_catalogue,
)

PARAMETERS = {"type": "object", "properties": {"amount": {"type": "number"}, "payee": {"type": "string"}}}
TWO_ABOVE_A_THOUSAND = [{"when": "args.amount > 1000", "then": 2}, {"then": 1}]


@pytest.fixture(autouse=True)
def _compiled_afresh():
    # compiled_condition is cached per text: a cached answer would hide the check it makes
    # (and mutation testing, which forks after a clean run, would never see it run).
    compiled_condition.cache_clear()


def tool(**declared) -> ToolSpec:
    return ToolSpec.model_validate({"name": "pay", "label": "Pay", "parameters": PARAMETERS, **declared})


def refusal(**declared) -> str:
    with pytest.raises(ValidationError) as caught:
        tool(**declared)
    return str(caught.value)


# --- approval rules -----------------------------------------------------------------------


def test_an_approval_rule_is_kept_apart_and_the_plain_approval_reads_always_until_the_ledger_evaluates_it():
    spec = tool(approval=[{"when": "args.amount < 10", "then": "never"}, {"then": "always"}])
    assert spec.approval == "always"
    assert spec.rules["approval"] == [ApprovalCase(when="args.amount < 10", then="never"), ApprovalCase(then="always")]


def test_a_plain_approval_has_no_rule():
    assert tool(approval="never").rules == {}
    assert tool().rules == {}


def test_an_approvals_rule_is_kept_apart_and_the_plain_count_is_the_most_any_case_asks():
    spec = tool(approvals_required=[{"when": "args.amount > 10", "then": 2}, {"when": "true", "then": 3}, {"then": 1}])
    assert spec.approvals_required == 3
    assert [case.then for case in spec.rules["approvals_required"]] == [2, 3, 1]


def test_a_rule_given_directly_overrides_a_plain_value_that_disagrees_with_it():
    spec = ToolSpec(
        name="pay",
        label="Pay",
        approval="never",
        approvals_required=1,
        rules={"approval": [ApprovalCase(then="never")], "approvals_required": [ApprovalsCase(then=4)]},
    )
    assert (spec.approval, spec.approvals_required) == ("always", 4)


def test_a_tool_with_rules_survives_a_round_trip_through_its_dump():
    spec = tool(approvals_required=TWO_ABOVE_A_THOUSAND, approval=[{"then": "always", "reason": "r"}])
    assert ToolSpec.model_validate(spec.model_dump()) == spec


def test_a_rule_with_no_case_is_refused_naming_the_tool():
    assert "tool 'pay': its approval rule has no case" in refusal(approval=[])
    assert "tool 'pay': its approvals_required rule has no case" in refusal(approvals_required=[])


def test_only_the_last_case_goes_without_a_condition():
    assert "tool 'pay': case 1 of its approvals_required rule: only the last case goes without `when`" in refusal(
        approvals_required=[{"then": 2}, {"then": 1}]
    )
    assert "tool 'pay': case 2 of its approval rule: the last case has no `when`" in refusal(
        approval=[{"when": "true", "then": "never"}, {"when": "false", "then": "always"}]
    )


def test_a_condition_that_is_not_cel_is_refused_at_load_naming_the_tool_case_and_column():
    said = refusal(approvals_required=[{"when": "args.amount >", "then": 2}, {"then": 1}])
    assert (
        "tool 'pay': case 1 of its approvals_required rule: `args.amount >` is not a CEL expression "
        "(it goes wrong at column 13)"
    ) in said


def test_a_condition_naming_anything_but_the_arguments_is_refused_at_load():
    said = refusal(approval=[{"when": "user == 'root' || os.system('x')", "then": "never"}, {"then": "always"}])
    assert (
        "tool 'pay': case 1 of its approval rule: `user == 'root' || os.system('x')` names os, system, user: "
        "a rule may read only `args`" in said
    )


@pytest.mark.parametrize(
    "condition",
    [
        "args.amount > 1000",
        "has(args.payee) && args.payee.startsWith('A') && size(args.payee) < 9",
        "type(args.amount) == int || type(args.amount) == double",
        "args.tags.all(t, t != 'x') && args.tags.exists(u, u == 'y') && args.tags.exists_one(v, v == 'y')",
        "args.tags.map(t, t + '!').filter(w, w == 'y!').size() == 1",
        "args['amount'] in [1, 2] && {'a': 1}['a'] == 1",
    ],
)
def test_a_condition_over_the_arguments_with_standard_functions_and_macros_compiles(condition):
    compiled_condition(condition)


@pytest.mark.parametrize(
    ("condition", "named"),
    [
        ("args.payee.shell()", "shell"),
        ("eval('1')", "eval"),
        ("args.tags.all(t, u > 1)", "u"),
        (".args.amount > 1", "args"),
        ("google.protobuf.Int32Value{value: 1} == 1", "google"),
        ("args.tags.sort(t, t)", "sort"),
    ],
)
def test_a_condition_naming_an_unknown_function_method_variable_or_message_is_refused(condition, named):
    with pytest.raises(ValueError, match=rf"names [^:]*\b{named}\b") as caught:
        compiled_condition(condition)
    assert "a rule may read only `args`" in str(caught.value)


def test_a_message_literal_is_refused_even_when_its_name_is_known():
    with pytest.raises(ValueError, match=r"names .*member_object"):
        compiled_condition("args{amount: 1} == 1")


def test_a_comprehension_variable_belongs_to_its_comprehension_only_by_name_not_the_whole_rule():
    # A name bound by one comprehension is known anywhere in the rule (a looser check than
    # CEL's scope; evaluation still refuses it outside): here it compiles.
    compiled_condition("args.tags.all(t, t != '') && args.more.all(t, t > 0)")


def test_a_reason_longer_than_two_hundred_characters_is_refused():
    assert "String should have at most 200 characters" in refusal(approvals_required=[{"then": 1, "reason": "r" * 201}])
    tool(approvals_required=[{"then": 1, "reason": "r" * 200}])


def test_a_case_count_below_one_or_an_approval_other_than_always_or_never_is_refused():
    refusal(approvals_required=[{"then": 0}])
    refusal(approval=[{"then": "sometimes"}])


def test_approvers_must_be_enough_for_the_most_any_case_asks():
    with pytest.raises(ValidationError, match="tool 'pay' requires 2 approvals but names only 1 approver"):
        ToolCatalogue.model_validate(
            {
                "tools": [
                    {
                        "name": "pay",
                        "label": "Pay",
                        "parameters": PARAMETERS,
                        "approvers": ["alice"],
                        "approvals_required": TWO_ABOVE_A_THOUSAND,
                    }
                ]
            }
        )
    ToolCatalogue.model_validate(
        {
            "tools": [
                {
                    "name": "pay",
                    "label": "Pay",
                    "parameters": PARAMETERS,
                    "approvers": ["alice", "bob"],
                    "approvals_required": TWO_ABOVE_A_THOUSAND,
                }
            ]
        }
    )


def test_a_bad_rule_in_the_catalogue_file_stops_the_load_naming_the_tool(tmp_path: Path):
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n  - name: pay_invoice\n    label: Pay\n    approval:\n"
        "      - {when: 'args.amount >>', then: never}\n      - {then: always}\n"
    )
    with pytest.raises(SystemExit, match="refused: tool 'pay_invoice': case 1 of its approval rule"):
        load_catalogue(path)


def test_the_example_in_the_shipped_catalogue_loads_and_decides_as_its_comment_says():
    text = (Path(__file__).parents[2] / "deploy" / "tools.yaml").read_text()
    example = text.split("# --- example ---\n", 1)[1].split("# --- end of example ---", 1)[0]
    tools = yaml.safe_load("\n".join(line[1:] for line in example.splitlines()))
    catalogue = ToolCatalogue.model_validate({"tools": tools, "groups": {"finance": ["ann", "bo"]}})
    pay, read = catalogue.get("pay_invoice"), catalogue.get("read_object")
    assert pay is not None and read is not None
    assert verdict(pay, {"amount": 2500, "payee": "ACME"}) == Verdict(2, "amount 2,500 > 1,000: two approvers")
    assert verdict(read, {"bucket": "public", "key": "a"}) == Verdict(0, "bucket public: anyone may read it")
    assert pay.may_edit("memo") and not pay.may_edit("payee") and read.may_be_remembered


def test_the_shipped_catalogue_still_loads():
    load_catalogue(Path(__file__).parents[2] / "deploy" / "tools.yaml")


# --- editable -------------------------------------------------------------------------------


def test_nothing_is_editable_by_default():
    spec = tool()
    assert not spec.is_editable and not spec.may_edit("amount")


def test_a_tool_editable_as_a_whole_lets_every_field_be_edited():
    spec = tool(editable=True)
    assert spec.is_editable and spec.may_edit("amount") and spec.may_edit("anything")


def test_a_tool_that_lists_editable_fields_lets_only_those_be_edited():
    spec = tool(editable=["amount"])
    assert spec.is_editable and spec.may_edit("amount") and not spec.may_edit("payee")
    assert not tool(editable=[]).is_editable and not tool(editable=False).may_edit("amount")


def test_an_editable_field_that_is_not_a_parameter_is_refused_naming_the_tool():
    assert "tool 'pay': editable names what is not a parameter: amuont, x" in refusal(
        editable=["amount", "amuont", "x"]
    )
    with pytest.raises(ValidationError, match="editable names what is not a parameter: amount"):
        ToolSpec(name="pay", label="Pay", editable=["amount"])


# --- rememberable ---------------------------------------------------------------------------


def test_nothing_is_rememberable_by_default():
    assert not tool().may_be_remembered


def test_a_read_tool_anyone_may_approve_once_may_be_remembered_by_saying_true():
    spec = tool(effect="read", rememberable=True)
    assert spec.may_be_remembered and spec.remembering_passes_by == []


def test_an_outward_tool_may_be_remembered_only_if_it_says_so_explicitly():
    assert "tool 'pay' is outward: it may be remembered only if it says so: `rememberable: {outward: true}`" in refusal(
        rememberable=True
    )
    assert tool(rememberable={"outward": True}).may_be_remembered


def test_a_tool_needing_several_approvers_even_by_a_rule_may_be_remembered_only_if_it_says_so():
    said = refusal(effect="read", approvals_required=TWO_ABOVE_A_THOUSAND, approvers=["a", "b"], rememberable=True)
    assert (
        "tool 'pay' is several approvers: it may be remembered only if it says so: "
        "`rememberable: {several_approvers: true}`"
    ) in said
    assert tool(effect="idempotent", approvals_required=2, rememberable={"several_approvers": True}).may_be_remembered


def test_a_tool_that_forbids_its_starter_may_be_remembered_only_if_it_says_so():
    assert "it may be remembered only if it says so: `rememberable: {starter_forbidden: true}`" in refusal(
        effect="read", starter_may_approve=False, rememberable={"outward": True}
    )
    assert tool(effect="read", starter_may_approve=False, rememberable={"starter_forbidden": True}).may_be_remembered


def test_a_tool_with_all_three_must_say_all_three_and_the_error_names_each_missing_one():
    declared = {"approvals_required": 2, "starter_may_approve": False}
    said = refusal(**declared, rememberable={"several_approvers": True})
    assert (
        "tool 'pay' is outward and starter forbidden: it may be remembered only if it says so: "
        "`rememberable: {outward: true, several_approvers: true, starter_forbidden: true}`"
    ) in said
    everything = Rememberable(outward=True, several_approvers=True, starter_forbidden=True)
    assert tool(**declared, rememberable=everything).remembering_passes_by == [
        "outward",
        "several_approvers",
        "starter_forbidden",
    ]


def test_an_explicit_form_saying_false_is_not_saying_so():
    assert "it may be remembered only if it says so" in refusal(rememberable={"outward": False})


def test_a_tool_that_is_not_rememberable_needs_no_acknowledgement():
    assert not tool(approvals_required=2, starter_may_approve=False).may_be_remembered


def test_compiling_a_rule_leaves_the_processes_recursion_limit_as_it_was():
    # cel-python raises it when it makes its environment; the services rely on the limit
    # to refuse JSON nested too deep to walk (tests/unit/test_redaction_rules.py).
    import sys

    from shared.rule_types import base

    base._cel.cache_clear()
    compiled_condition.cache_clear()
    before = sys.getrecursionlimit()
    compiled_condition("args.amount > 1")
    assert sys.getrecursionlimit() == before


def test_a_condition_nested_deeper_than_the_evaluator_can_go_is_refused_at_load():
    compiled_condition("(" * 13 + "args.a > 1" + ")" * 13)
    compiled_condition(" && ".join(f"args.a{i} == {i}" for i in range(100)))
    with pytest.raises(ValueError, match=r"^`\({14}args\.a > 1\){14}…` is nested too deep to evaluate$"):
        compiled_condition("(" * 14 + "args.a > 1" + ")" * 14)


def test_a_rules_depth_counts_its_levels():
    from lark import Token, Tree

    from shared.rule_types.base import _depth

    assert _depth(Tree("a", [])) == 1
    assert _depth(Tree("a", [Token("IDENT", "x"), Tree("b", [Tree("c", [])]), Tree("d", [])])) == 3


def test_a_qualified_function_call_is_refused():
    with pytest.raises(ValueError, match=r"names foo: "):
        compiled_condition(".foo(1) == 1")


def test_every_registered_rule_type_names_a_field_of_a_tool_and_no_other_field_may_be_a_rule():
    from shared.rule_types import RULE_TYPES

    assert set(RULE_TYPES) <= set(ToolSpec.model_fields)
    assert "a rule but approval, approvals_required: not expires_after_seconds" in refusal(
        rules={"expires_after_seconds": [{"then": 60}]}
    )
