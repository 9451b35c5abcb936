"""The tool catalogue: safe defaults, argument checks, and a card that shows what a
call does without showing its credentials (invariant 6)."""

import copy

import pytest
from pydantic import ValidationError

from shared.catalogue import MissingSecret, ToolCatalogue, ToolSpec, closed, resolve_secrets
from shared.redaction import REDACTED


def tool(**declared):
    return ToolSpec.model_validate({"name": "post", "label": "Post a message", **declared})


def http(url, method="POST", **declared):
    return tool(implementation={"kind": "http", "method": method, "url": url}, **declared)


# --- policy defaults -----------------------------------------------------------


def test_a_tool_that_declares_no_approval_still_needs_one():
    assert tool().approval == "always"


def test_a_tool_that_declares_no_effect_is_treated_as_outward():
    bare = tool()
    assert bare.effect == "outward"
    assert bare.card({}).effect == "outward"


@pytest.mark.parametrize("declared", [{"approval": "sometimes"}, {"effect": "write"}, {"aproval": "never"}])
def test_a_misspelled_policy_is_refused_rather_than_read_as_something_else(declared):
    with pytest.raises(ValidationError):
        tool(**declared)


# --- argument checks -------------------------------------------------------------

SCHEMA = {
    "type": "object",
    # Declared out of path order on purpose.
    "properties": {
        "to": {"type": "string"},
        "items": {"type": "array", "items": {"type": "integer"}},
        "amount": {"type": "object", "properties": {"value": {"type": "number"}}},
    },
    "required": ["to"],
}


def test_arguments_that_fit_the_schema_have_no_errors():
    assert tool(parameters=SCHEMA).argument_errors({"to": "acme", "items": [1, 2], "amount": {"value": 5}}) == []


def test_each_argument_error_names_the_path_and_the_rule_and_they_come_in_path_order():
    errors = tool(parameters=SCHEMA).argument_errors({"to": 7, "items": [1, "two"], "amount": {"value": "five"}})
    assert errors == ['amount/value: must be of type "number"', 'items/1: must be of type "integer"',
                      'to: must be of type "string"']


def test_an_argument_error_never_repeats_the_value_it_refuses():
    schema = {"type": "object", "properties": {"password": {"type": "string", "minLength": 12},
                                               "mode": {"enum": ["a", "b"]}, "pin": {"pattern": "^[0-9]+$"}}}
    errors = tool(parameters=schema).argument_errors({"password": "hunter2", "mode": "hunter3", "pin": "hunter4"})
    assert len(errors) == 3
    assert not any("hunter" in e for e in errors), errors
    assert errors[0] == 'mode: must be one of ["a", "b"]'


def test_an_error_about_the_arguments_as_a_whole_says_so():
    [error] = tool(parameters=SCHEMA).argument_errors({})
    assert error == "(arguments): missing required 'to'"


# --- closed schemas ----------------------------------------------------------------


def test_a_schema_is_closed_by_default_and_an_extra_argument_is_unexpected_at_any_depth():
    unexpected, errors = tool(parameters=SCHEMA).argument_problems(
        {"to": "acme", "cc": "boss", "amount": {"value": 5, "currency": "EUR"}})
    assert (unexpected, errors) == (["cc", "amount/currency"], [])


def test_a_schema_that_declares_how_it_takes_other_properties_keeps_its_rule():
    open_schema = {**SCHEMA, "additionalProperties": True}
    assert tool(parameters=open_schema).argument_problems({"to": "acme", "cc": "boss"}) == ([], [])
    patterned = {"type": "object", "patternProperties": {"^x-": {"type": "string"}}}
    assert tool(parameters=patterned).argument_problems({"x-a": "1", "y": "2"}) == (["y"], []), (
        "patterns name what else it takes; what matches none is refused")


def test_a_tool_without_parameters_takes_no_arguments():
    assert tool().argument_problems({"anything": 1}) == (["anything"], [])
    assert tool().argument_problems({}) == ([], [])


def test_the_model_is_offered_the_closed_schema_it_is_held_to():
    offered = tool(parameters=SCHEMA).description_for_model().parameters
    assert offered["additionalProperties"] is False and offered["properties"]["amount"]["additionalProperties"] is False
    assert "additionalProperties" not in SCHEMA, "the declaration itself is left as written"


# --- redaction on the card (the rules themselves: tests/unit/test_redaction.py) ---------


def test_the_card_hides_declared_secrets_and_credential_names_at_any_depth_and_lists_them():
    schema = {"type": "object", "additionalProperties": True, "properties": {
        "accounts": {"type": "array", "items": {"type": "object", "additionalProperties": True,
                                                 "properties": {"pin": {"type": "string", "writeOnly": True}}}}}}
    arguments = {
        "to": "acme",
        "accounts": [{"name": "a", "pin": "1234", "password": "p1"}, {"name": "b", "auth": {"token": "t"}}],
        "tags": ["x", 2, None],
        "max_tokens": 5,
    }
    card = tool(parameters=schema).card(arguments)
    assert card.arguments == {
        "to": "acme",
        "accounts": [{"name": "a", "pin": REDACTED, "password": REDACTED}, {"name": "b", "auth": {"token": REDACTED}}],
        "tags": ["x", 2, None],
        "max_tokens": 5,
    }
    assert card.hidden == ["accounts/0/pin", "accounts/0/password", "accounts/1/auth/token"]


def test_the_card_redacts_a_copy_and_leaves_the_arguments_the_digest_binds_untouched():
    arguments = {"to": "acme", "auth": [{"password": "p"}]}
    before = copy.deepcopy(arguments)
    tool(target="account {to}").card(arguments)
    assert arguments == before


# --- the card --------------------------------------------------------------------


def test_the_card_shows_the_tools_name_label_description_and_declared_effect():
    card = tool(description="Posts to the channel.", effect="idempotent", target="channel {to}").card({"to": "ops"})
    assert (card.tool, card.label, card.description, card.effect, card.target) == (
        "post", "Post a message", "Posts to the channel.", "idempotent", "channel ops")


def test_a_target_template_is_filled_with_the_redacted_arguments():
    card = tool(target="account {Account} as {user} with {api_key}").card(
        {"Account": "acme", "user": "ann", "api_key": "k"})
    assert card.target == f"account acme as ann with {REDACTED}"


def test_a_placeholder_with_no_such_argument_stays_as_written():
    assert tool(target="account {to} at {Bank}").card({"to": "acme"}).target == "account acme at {Bank}"


def test_an_http_target_is_the_method_and_url_with_user_info_and_query_values_hidden():
    look = http("https://user:pw@api.example.com/v1/look/{what}?key=abc&lang=en#frag", method="get")
    assert look.card({"what": "weather"}).target == (
        f"GET https://{REDACTED}@api.example.com/v1/look/weather?key={REDACTED}&lang={REDACTED}")


def test_an_http_target_shows_a_port_only_when_the_url_names_one():
    assert http("http://api.example.com:8443/x").card({}).target == "POST http://api.example.com:8443/x"
    assert http("http://api.example.com/x").card({}).target == "POST http://api.example.com/x"


def test_an_http_target_names_an_executor_only_variable_as_written_never_the_ledgers_value(monkeypatch):
    # The ledger may have no such variable, or another value: the executor's decides.
    monkeypatch.setenv("API_HOST", "https://wrong.example.com")
    post = http("${env:API_HOST}/v1/send/{to}", parameters={"type": "object", "properties": {"to": {}}})
    assert post.card({"to": "ops team"}).target == "POST ${env:API_HOST}/v1/send/ops%20team"
    monkeypatch.delenv("API_HOST")
    assert post.card({"to": "ops"}).target == "POST ${env:API_HOST}/v1/send/ops"


def test_a_secret_argument_in_an_http_url_is_redacted_in_the_target():
    schema = {"type": "object", "properties": {"token": {"type": "string"}, "chat": {"x-signoff-secret": True}}}
    assert http("https://api.example.com/{token}/send/{chat}", parameters=schema).card(
        {"token": "t0k", "chat": "c1"}).target == f"POST https://api.example.com/{REDACTED}/send/{REDACTED}"


def test_a_credential_from_the_environment_never_appears_in_an_http_target(monkeypatch):
    monkeypatch.setenv("SIGNOFF_TEST_BOT_TOKEN", "123:s3cret")
    target = http("https://api.telegram.org/bot${env:SIGNOFF_TEST_BOT_TOKEN}/sendMessage").card({}).target
    assert "s3cret" not in target
    assert target == "POST https://api.telegram.org/bot${env:SIGNOFF_TEST_BOT_TOKEN}/sendMessage"


def test_a_python_tools_target_names_its_function():
    assert tool(implementation={"kind": "python", "function": "tools.chat:post"}).card({}).target == (
        "python tools.chat:post")


def test_a_tool_with_neither_target_nor_implementation_says_so_on_its_card():
    assert tool().card({"to": "acme"}).target == "(no implementation)"


# --- secrets from the environment ---------------------------------------------------


def test_a_secret_reference_is_replaced_by_the_environments_value_and_an_unset_one_is_an_error(monkeypatch):
    monkeypatch.setenv("SIGNOFF_TEST_KEY", "k1")
    monkeypatch.delenv("SIGNOFF_TEST_UNSET", raising=False)
    assert resolve_secrets("Bearer ${env:SIGNOFF_TEST_KEY}") == "Bearer k1"
    with pytest.raises(MissingSecret, match=r"\$\{env:SIGNOFF_TEST_UNSET\} is not set"):
        resolve_secrets("a${env:SIGNOFF_TEST_UNSET}b")
    assert resolve_secrets("no ${reference} here") == "no ${reference} here"


# --- what the model is offered -----------------------------------------------------------


def test_the_model_is_offered_each_tools_name_description_and_parameters_with_the_label_when_there_is_no_description():
    catalogue = ToolCatalogue.model_validate({"tools": [
        {"name": "send", "label": "Send money", "description": "Sends money.", "parameters": SCHEMA},
        {"name": "look", "label": "Look around"},
    ]})
    assert [(d.name, d.description, d.parameters) for d in catalogue.descriptions()] == [
        ("send", "Sends money.", closed(SCHEMA)), ("look", "Look around", {"type": "object",
                                                                           "additionalProperties": False})]


def test_a_tool_is_found_by_its_name_and_an_unknown_name_finds_nothing():
    catalogue = ToolCatalogue.model_validate({"tools": [{"name": "send", "label": "Send"}]})
    assert catalogue.get("send").label == "Send"
    assert catalogue.get("nope") is None


# --- who may approve ------------------------------------------------------------------


def approving(groups=None, **declared):
    """A catalogue of one tool, `pay`, declared with these approval rules."""
    return ToolCatalogue.model_validate({"tools": [{"name": "pay", "label": "Pay", **declared}],
                                         "groups": groups or {}})


def test_a_tool_that_names_no_approvers_may_be_approved_by_anyone_once_and_by_its_starter():
    catalogue = approving()
    pay = catalogue.get("pay")
    assert catalogue.approvers_of(pay) is None
    assert (pay.approvals_required, pay.starter_may_approve) == (1, True)


def test_a_tools_approvers_are_its_principals_and_the_members_of_its_groups_each_once():
    catalogue = approving(groups={"finance": ["ann", "bob"], "audit": ["bob", "cy"], "other": ["dee"]},
                          approvers=["zoe", "group:finance", "group:audit"])
    assert catalogue.approvers_of(catalogue.get("pay")) == frozenset({"zoe", "ann", "bob", "cy"})


def test_a_principal_is_not_taken_for_a_group_of_the_same_name():
    catalogue = approving(groups={"finance": ["ann"]}, approvers=["finance"])
    assert catalogue.approvers_of(catalogue.get("pay")) == frozenset({"finance"})


def test_an_approver_group_the_catalogue_does_not_declare_is_refused_when_it_is_loaded():
    with pytest.raises(ValidationError, match=r"tool 'pay' names undeclared approver groups: group:finance"):
        approving(groups={"audit": ["cy"]}, approvers=["group:audit", "group:finance"])


def test_a_tool_needing_more_approvals_than_it_has_approvers_is_refused_when_it_is_loaded_and_as_many_is_not():
    with pytest.raises(ValidationError, match=r"tool 'pay' requires 3 approvals but names only 2 approver\(s\)"):
        approving(groups={"finance": ["ann", "bob"]}, approvers=["group:finance", "bob"], approvals_required=3)
    catalogue = approving(groups={"finance": ["ann", "bob"]}, approvers=["group:finance"], approvals_required=2)
    assert catalogue.get("pay").approvals_required == 2
    # Anyone may approve: any number of people can.
    assert approving(approvals_required=5).get("pay").approvals_required == 5


@pytest.mark.parametrize("declared", [{"approvals_required": 0}, {"starter_may_approve": "sometimes"},
                                      {"approver": ["ann"]}])
def test_a_misdeclared_approval_rule_is_refused(declared):
    with pytest.raises(ValidationError):
        approving(**declared)


def test_a_card_shows_a_shown_env_value_resolved_with_credentials_hidden_and_other_variables_as_written():
    http = {"kind": "http", "method": "POST", "url": "${env:BASE}/x/{id}?t=${env:TOKEN}"}
    tool = {"name": "t", "label": "T", "implementation": http}
    environ = {"BASE": "https://u:pw@example.test/api", "TOKEN": "tok-secret"}
    shown = ToolCatalogue.model_validate({"tools": [tool], "shown_env": ["BASE"]}).showing(environ)
    assert shown.tools[0].target_of({"id": "7"}) == "POST https://***redacted***@example.test/api/x/7?t=***redacted***"
    plain = ToolCatalogue.model_validate({"tools": [tool]}).showing(environ)
    assert plain.tools[0].target_of({"id": "7"}) == "POST ${env:BASE}/x/7?t=***redacted***"
