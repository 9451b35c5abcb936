"""The catalogue's rules that mutation testing showed no test stated:
how a schema is closed, how a broken rule is named, the request an http tool makes,
and how the catalogue file is loaded. Pure: no services."""

import copy
import datetime
import json

import jsonschema
import pytest
from pydantic import ValidationError

from shared import redaction
from shared.catalogue import (
    HttpImplementation,
    MissingSecret,
    ToolCatalogue,
    ToolSpec,
    _rule_broken,
    closed,
    http_request,
    load_catalogue,
    resolve_secrets,
    shown_request,
)
from shared.redaction import REDACTED

OBJECT = {"type": "object", "properties": {"a": {"type": "string"}}}
CLOSED_OBJECT = {**OBJECT, "additionalProperties": False}


def tool(**declared):
    return ToolSpec.model_validate({"name": "post", "label": "Post a message", **declared})


# --- closed: an argument the schema does not list is refused ------------------------------


@pytest.mark.parametrize("keyword", ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"])
def test_an_object_schema_named_under_a_keyword_that_maps_names_to_schemas_is_closed(keyword):
    assert closed({keyword: {"x": OBJECT}}) == {keyword: {"x": CLOSED_OBJECT}, **(
        {"additionalProperties": False} if keyword == "properties" else {})}


@pytest.mark.parametrize("keyword", ["items", "additionalProperties", "contains", "not", "if", "then", "else"])
def test_an_object_schema_under_a_keyword_that_holds_one_schema_is_closed(keyword):
    assert closed({"type": "array", keyword: OBJECT}) == {"type": "array", keyword: CLOSED_OBJECT}


def test_each_object_schema_of_prefix_items_is_closed_and_other_entries_are_kept():
    assert closed({"type": "array", "prefixItems": [OBJECT, True, {"type": "string"}]}) == {
        "type": "array", "prefixItems": [CLOSED_OBJECT, True, {"type": "string"}]}


def test_a_keyword_whose_value_is_not_a_schema_is_left_as_declared():
    declared = {"type": "array", "items": True, "not": False, "prefixItems": {"a": OBJECT},
                "properties": ["a"], "$defs": "x"}
    # `properties` that is not a mapping still makes it an object: closed, its value kept.
    assert closed(declared) == {**declared, "additionalProperties": False}


def test_closing_reaches_any_depth():
    deep = {"type": "object", "properties": {"a": {"type": "array", "items": {"$defs": {"d": OBJECT}}}}}
    assert closed(deep)["properties"]["a"]["items"]["$defs"]["d"] == CLOSED_OBJECT


def test_a_schema_is_an_object_when_its_type_says_so_or_it_lists_properties_and_only_then():
    assert closed({"type": "object"}) == {"type": "object", "additionalProperties": False}
    assert closed({"properties": {}}) == {"properties": {}, "additionalProperties": False}
    assert closed({"type": "string"}) == {"type": "string"}
    assert closed({"type": ["object", "null"]}) == {"type": ["object", "null"]}
    assert closed({}) == {}


@pytest.mark.parametrize("keyword", ["additionalProperties", "unevaluatedProperties", "allOf", "anyOf", "oneOf",
                                     "$ref"])
def test_an_object_that_says_how_it_takes_other_properties_or_composes_schemas_is_not_closed(keyword):
    declared = {**OBJECT, keyword: [] if keyword.endswith("Of") else ("#/x" if keyword == "$ref" else True)}
    assert closed(declared) == declared


def test_the_branches_of_a_composition_are_left_open_so_the_whole_may_take_what_each_branch_lists():
    declared = {"type": "object", "allOf": [OBJECT, {"properties": {"b": {}}}]}
    assert closed(declared) == declared
    assert tool(parameters=declared).argument_problems({"a": "x", "b": 1}) == ([], [])


def test_closing_a_schema_leaves_the_declaration_untouched_at_every_depth():
    declared = {"type": "object", "properties": {"a": copy.deepcopy(OBJECT)}, "items": copy.deepcopy(OBJECT)}
    before = copy.deepcopy(declared)
    closed(declared)
    assert declared == before


def test_a_schema_that_is_not_a_mapping_is_returned_as_it_is():
    assert closed(True) is True  # type: ignore[arg-type]


# --- the arguments a schema does not take -----------------------------------------------


def test_an_argument_a_closed_schema_does_not_list_is_named_as_not_a_parameter_of_this_tool():
    assert tool(parameters=OBJECT).argument_errors({"a": "x", "b": 1, "c": 2}) == [
        "b: not a parameter of this tool", "c: not a parameter of this tool"]


def test_properties_refused_by_unevaluated_properties_are_unexpected_arguments_too():
    schema = {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False}
    assert tool(parameters=schema).argument_problems({"a": 1, "b": 2}) == (["b"], [])


def test_a_nested_unlisted_argument_matching_no_pattern_is_named_by_its_path():
    schema = {"type": "object", "properties": {"o": {"type": "object", "patternProperties": {"^x": {}}}}}
    assert tool(parameters=schema).argument_problems({"o": {"xa": 1, "b": 2}}) == (["o/b"], [])


# --- the rule an argument breaks, never its value ------------------------------------------


def errors_of(schema, arguments):
    return tool(parameters={"type": "object", "properties": {"v": schema}}).argument_errors({"v": arguments})


def test_a_missing_required_argument_is_named_and_only_the_missing_ones():
    schema = {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "required": ["a", "b", "c"]}
    # (jsonschema reports one error per missing name; each names them all.)
    assert set(tool(parameters=schema).argument_errors({"b": 1})) == {"(arguments): missing required 'a', 'c'"}


def test_a_type_rule_names_every_type_allowed():
    assert errors_of({"type": ["string", "null"]}, 3) == ['v: must be of type ["string", "null"]']


def test_an_enum_says_one_of_and_a_const_says_the_one_value():
    assert errors_of({"enum": ["a", "b"]}, "c") == ['v: must be one of ["a", "b"]']
    assert errors_of({"const": "a"}, "c") == ['v: must be "a"']


def test_an_enum_of_dates_as_yaml_reads_them_is_named_without_failing():
    when = datetime.date(2024, 1, 2)
    assert errors_of({"enum": [when]}, "2023-12-31") == ['v: must be one of ["2024-01-02"]']


def test_a_long_enum_or_rule_is_cut_at_200_characters():
    many = [f"value-{n:03d}" for n in range(100)]
    [error] = errors_of({"enum": many}, "c")
    assert error == "v: must be one of " + json.dumps(many)[:200]
    pattern = "^" + "a" * 300 + "$"
    [error] = errors_of({"pattern": pattern}, "b")
    assert error == "v: must satisfy pattern: " + ('"' + pattern)[:200]


def test_any_other_rule_is_named_with_its_declared_value():
    assert errors_of({"minLength": 12}, "short") == ["v: must satisfy minLength: 12"]
    assert errors_of({"maximum": 5}, 9) == ["v: must satisfy maximum: 5"]


def test_a_rule_whose_declaration_holds_no_json_value_is_named_with_its_text():
    when = datetime.date(2024, 1, 2)  # what YAML reads `2024-01-02` as
    assert errors_of({"not": {"type": "string", "x-since": when}}, "s") == [
        'v: must satisfy not: {"type": "string", "x-since": "2024-01-02"}']


def test_a_password_format_error_says_only_that_it_must_be_a_password():
    error = jsonschema.ValidationError("'hunter2' is not a 'password'", validator="format",
                                       validator_value="password", instance="hunter2")
    assert _rule_broken(error) == "must be a password"
    other = jsonschema.ValidationError("'x' is not a 'email'", validator="format", validator_value="email",
                                       instance="x")
    assert _rule_broken(other) == 'must satisfy format: "email"'


# --- the request an http tool makes ------------------------------------------------------


def request(url="https://api.example.com/send", method="POST", headers=None, arguments=None, env=None):
    implementation = HttpImplementation(url=url, method=method, headers=headers or {})
    return http_request(implementation, arguments or {}, env=env or (lambda name: f"<{name}>"))


def test_each_url_placeholder_takes_its_argument_percent_encoded_and_the_rest_go_in_the_body():
    made = request(url="https://api.example.com/{chat}/send/{to}",
                   arguments={"to": "ops team/a", "chat": 7, "text": "hi"})
    assert made.url == "https://api.example.com/7/send/ops%20team%2Fa"
    assert (made.method, made.params, made.json) == ("POST", None, {"text": "hi"})


@pytest.mark.parametrize("method", ["GET", "DELETE", "get", "delete"])
def test_a_get_or_delete_sends_the_other_arguments_in_the_query_and_no_body(method):
    made = request(url="https://api.example.com/{id}", method=method, arguments={"id": "1", "q": "x"})
    assert (made.method, made.url, made.params, made.json) == (
        method.upper(), "https://api.example.com/1", {"q": "x"}, None)


@pytest.mark.parametrize("method", ["PUT", "PATCH", "post"])
def test_any_other_method_sends_the_other_arguments_as_the_json_body(method):
    made = request(method=method, arguments={"q": "x"})
    assert (made.method, made.params, made.json) == (method.upper(), None, {"q": "x"})


def test_a_hidden_value_is_put_in_the_url_as_the_marker_not_its_percent_encoding():
    assert request(url="https://a.example/{k}", arguments={"k": REDACTED}).url == f"https://a.example/{REDACTED}"


def test_environment_references_are_filled_by_the_callers_env_in_the_url_and_each_header_which_is_trimmed():
    made = request(url="${env:HOST}/x/${env:PATH_KEY}", headers={"Authorization": "Bearer ${env:KEY} ",
                                                                 "X-Plain": " plain"})
    assert made.url == "<HOST>/x/<PATH_KEY>"
    assert made.headers == {"Authorization": "Bearer <KEY>", "X-Plain": "plain"}


def test_an_argument_whose_placeholder_the_url_lacks_is_not_put_in_the_url():
    made = request(url="https://a.example/{to}", arguments={"too": "x"})
    assert (made.url, made.json) == ("https://a.example/{to}", {"too": "x"})


def test_the_request_shown_has_no_fragment_and_its_query_values_hidden():
    implementation = HttpImplementation(url="https://a.example/{to}?k=v#part", method="get")
    assert shown_request(implementation, {"to": "x"}) == f"GET https://a.example/x?k={REDACTED}"


# --- the catalogue file ----------------------------------------------------------------------


def test_the_catalogue_is_loaded_from_its_yaml_file(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - name: send\n    label: Send\n    approval: never\ngroups:\n  ops: [ann]\n")
    catalogue = load_catalogue(path)
    assert [(t.name, t.label, t.approval) for t in catalogue.tools] == [("send", "Send", "never")]
    assert catalogue.groups == {"ops": ["ann"]}


def test_an_empty_catalogue_file_is_a_catalogue_of_no_tools(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("")
    assert load_catalogue(path).tools == []


def test_a_missing_catalogue_file_stops_the_service_naming_the_file_and_the_setting(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(SystemExit, match=r"^tools file not found: .*absent\.yaml \(set SIGNOFF_TOOLS_FILE\)$"):
        load_catalogue(path)


def test_a_catalogue_file_that_misdeclares_a_tool_is_refused(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - name: send\n")
    # Whole, naming the tool (a process that starts with it stops, saying so).
    with pytest.raises(SystemExit, match=r"refused: tool 'send': label: Field required"):
        load_catalogue(path)


# --- the catalogue as a whole -------------------------------------------------------------


def test_the_environment_variables_read_are_those_in_http_tools_urls_and_header_values_only():
    catalogue = ToolCatalogue.model_validate({"tools": [
        {"name": "a", "label": "A", "target": "${env:NOT_READ}", "implementation": {
            "kind": "http", "url": "${env:HOST}/x", "headers": {"${env:NOT_A_VALUE}": "Bearer ${env:KEY}"}}},
        {"name": "b", "label": "B", "implementation": {"kind": "python", "function": "m:f"}},
    ]})
    assert catalogue.env_references() == {"HOST", "KEY"}


def test_an_escalation_to_an_undeclared_group_is_refused_when_the_catalogue_is_loaded():
    with pytest.raises(ValidationError, match=r"tool 'pay' names undeclared approver groups: group:night"):
        ToolCatalogue.model_validate({"tools": [{"name": "pay", "label": "Pay", "escalation": {
            "after_seconds": 60, "to": ["ann", "group:night"]}}], "groups": {"day": ["bob"]}})


def test_a_group_entry_resolves_to_its_members_and_a_principal_to_itself():
    catalogue = ToolCatalogue.model_validate({"tools": [], "groups": {"ops": ["ann", "bob"]}})
    assert catalogue.principals(["group:ops", "cy", "ann"]) == frozenset({"ann", "bob", "cy"})


def test_a_resolved_secret_is_remembered_so_every_later_text_hides_it(monkeypatch):
    monkeypatch.setenv("SIGNOFF_TEST_REMEMBERED", "remembered-value-91")
    assert resolve_secrets("x ${env:SIGNOFF_TEST_REMEMBERED}") == "x remembered-value-91"
    assert "remembered-value-91" in redaction.known()


def test_secrets_are_resolved_from_the_mapping_given_rather_than_the_process_environment(monkeypatch):
    monkeypatch.setenv("SIGNOFF_TEST_GIVEN", "from-process")
    assert resolve_secrets("${env:SIGNOFF_TEST_GIVEN}", {"SIGNOFF_TEST_GIVEN": "from-mapping"}) == "from-mapping"
    with pytest.raises(MissingSecret) as missing:
        resolve_secrets("${env:SIGNOFF_TEST_GIVEN}", {})
    assert missing.value.name == "SIGNOFF_TEST_GIVEN"
    assert str(missing.value) == "${env:SIGNOFF_TEST_GIVEN} is not set in this process's environment"


def test_a_calls_secret_values_are_its_hidden_arguments():
    schema = {"type": "object", "properties": {"to": {}, "key": {"writeOnly": True}}}
    assert tool(parameters=schema).secret_values({"to": "ops", "key": "k-123", "api_token": "t-9"}) == [
        "k-123", "t-9"]


def test_the_arguments_shown_hide_what_the_schema_declares_secret_whatever_its_name():
    schema = {"type": "object", "properties": {"chat": {"writeOnly": True}, "to": {}}}
    assert tool(parameters=schema).shown_arguments({"chat": "c1", "to": "ops"}) == {"chat": REDACTED, "to": "ops"}


def test_the_request_shown_ends_at_the_first_hash_however_many_the_url_holds():
    implementation = HttpImplementation(url="https://a.example/x#one#two")
    assert shown_request(implementation, {}) == "POST https://a.example/x"


def test_the_closed_copy_shares_nothing_with_the_declaration_so_changing_one_never_changes_the_other():
    declared = {"type": "object", "allOf": [{"properties": {"a": {"type": "string"}}}], "enum": [["x"]]}
    copy_ = closed(declared)
    copy_["allOf"][0]["properties"]["a"]["type"] = "number"
    copy_["enum"][0].append("y")
    assert declared == {"type": "object", "allOf": [{"properties": {"a": {"type": "string"}}}], "enum": [["x"]]}
