"""The tool catalogue: what each tool is, who must approve it, and what it touches.

Declared in YAML (see deploy/tools.yaml). The ledger reads it for policy, the
approval card and argument checks; the executor for the implementation; the
model-step for the descriptions it offers the model.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import celpy
import jsonschema
import lark
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared import redaction
from shared.messages import ApprovalCard, ToolDescription
from shared.redaction import REDACTED, redact_arguments, redact_url

_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# JSON Schema keywords that say how an object takes properties it does not list
# (`patternProperties` alone does not: with it, what matches no pattern is still refused).
_OPEN_KEYWORDS = ("additionalProperties", "unevaluatedProperties")
# An `approvers` entry that names a group of the catalogue's `groups:` rather than a principal.
GROUP_PREFIX = "group:"


class HttpImplementation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["http"] = "http"
    method: str = "POST"
    url: str
    headers: dict[str, str] = {}
    timeout_seconds: float = 10.0


class PythonImplementation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["python"] = "python"
    function: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    # How long a call may run; past it an outward call is closed as outcome-unknown,
    # a read or idempotent one as an error (services/tool_executor/tools.py).
    timeout_seconds: float = Field(default=60.0, gt=0)
    # The executor's environment variables this tool reads (its credentials): its own
    # process gets these and no other (services/tool_executor/tool_process.py); an
    # unset one is an error, as `${env:…}` is. The executor's own settings are not a tool's.
    env: list[str] = []

    @field_validator("env")
    @classmethod
    def _variables_a_tool_may_have(cls, names: list[str]) -> list[str]:
        for name in names:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable's name")
            if name.upper().startswith("SIGNOFF_"):
                raise ValueError(f"{name!r} is one of the executor's own settings, never a tool's")
        return names


class Escalation(BaseModel):
    """After `after_seconds` without a decision, the request is announced again to
    `to` (principals and `group:<name>` entries), who may then approve it too."""

    model_config = ConfigDict(extra="forbid")
    after_seconds: float = Field(gt=0)
    to: list[str] = Field(min_length=1)


# A rule over a call's arguments is Common Expression Language (CEL, as Kubernetes'
# admission policies use), run by cel-python's interpreter: a language made for
# policies, with no side effects and no access to anything but what it is given.
# The arguments are its one variable, `args` (`args.amount > 1000`).
ARGUMENTS = "args"
# What a condition may call besides the standard functions: the macros, which
# cel-python expands itself rather than listing them among its functions.
_MACROS = frozenset({"has", "all", "exists", "exists_one", "map", "filter"})
_COMPREHENSIONS = frozenset({"all", "exists", "exists_one", "map", "filter"})


@functools.cache
def _cel() -> celpy.Environment:
    """Made on first use, not at import. cel-python raises the process's recursion limit
    when it makes one; the limit is put back, because the services rely on it to refuse
    JSON nested too deep to walk (shared/redaction.py), and a rule is one short line."""
    limit = sys.getrecursionlimit()
    try:
        return celpy.Environment()
    finally:
        sys.setrecursionlimit(limit)


@functools.cache
def compiled_condition(text: str) -> celpy.Runner:
    """A CEL condition ready to evaluate, or ValueError naming what is wrong: a syntax
    error, or a name that is neither `args`, a standard function nor a macro's variable
    (cel-python itself would find those only when a call reaches them)."""
    try:
        tree = _cel().compile(text)
    except celpy.CELParseError as error:
        where = f"column {error.column}" if error.column is not None else "its end"
        raise ValueError(f"`{text}` is not a CEL expression (it goes wrong at {where})") from None
    if _depth(tree) > RULE_DEPTH:
        raise ValueError(f"`{text[:60]}…` is nested too deep to evaluate")
    unknown = sorted(_unknown_names(tree))
    if unknown:
        raise ValueError(f"`{text}` names {', '.join(unknown)}: a rule may read only `{ARGUMENTS}`")
    return _cel().program(tree)


# How deep a rule's syntax tree may go: cel-python evaluates it recursively, and past
# about 250 levels (some twenty nested parentheses) it runs out of Python's recursion
# limit. 150 leaves room for the stack the ledger's handler is already in; a chain of
# a hundred `&&` is about 110.
RULE_DEPTH = 150


def _depth(tree: lark.Tree) -> int:
    """Levels of the tree, counted without recursion (the tree may be deeper than the stack)."""
    depth, level = 0, [tree]
    while level:
        depth += 1
        level = [child for node in level for child in node.children if isinstance(child, lark.Tree)]
    return depth


def _unknown_names(tree: lark.Tree) -> set[str]:
    known = set(celpy.base_functions) | _MACROS | {ARGUMENTS}
    # A comprehension's variable (`args.items.all(i, i > 0)`) is a name its body may use.
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and str(node.children[1]) in _COMPREHENSIONS and node.children[2]:
            variable = node.children[2].children[0]
            known.update(str(token) for token in variable.scan_values(lambda v: isinstance(v, lark.Token)))
    unknown: set[str] = set()
    for node in tree.iter_subtrees():
        if node.data in ("ident", "ident_arg") and str(node.children[0]) not in known:
            unknown.add(str(node.children[0]))
        elif node.data == "member_dot_arg" and str(node.children[1]) not in known:
            unknown.add(str(node.children[1]))
        elif node.data in ("dot_ident", "dot_ident_arg", "member_object"):
            # Qualified names and message literals: protobuf's, which no tool has.
            unknown.add(str(node.children[0]) if isinstance(node.children[0], lark.Token) else node.data)
    return unknown


class RuleCase(BaseModel):
    """One case of a rule over the arguments. The cases are tried in order; the first
    whose `when` holds decides. The last case has no `when`: it decides every call the
    others do not, so a rule always has an answer."""

    model_config = ConfigDict(extra="forbid")
    # A CEL condition over `args`; none on the last case only.
    when: str | None = None
    # Why, as the card and the audit log say it: a template over the arguments as the
    # card shows them (`{amount}`, `{amount:,}` for 2,500), secrets hidden.
    reason: str | None = Field(default=None, max_length=200)


class ApprovalCase(RuleCase):
    then: Literal["always", "never"]


class ApprovalsCase(RuleCase):
    then: int = Field(ge=1)


class Rememberable(BaseModel):
    """`rememberable` in its explicit form: a tool that is outward, needs several
    approvers or forbids its starter may be remembered only if it says which of
    these it accepts a grant will pass by (`rememberable: {outward: true}`)."""

    model_config = ConfigDict(extra="forbid")
    outward: bool = False
    several_approvers: bool = False
    starter_forbidden: bool = False


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    label: str
    description: str = ""
    parameters: dict[str, Any] = {"type": "object"}
    # `always`, `never`, or a rule over the arguments (a list of `ApprovalCase`), which
    # is kept in `approval_rule` while `approval` reads `always`: until the ledger
    # evaluates the rule (services/approval_ledger/decision_rules.py), a tool with a
    # rule asks every time, the safe side.
    approval: Literal["always", "never"] = "always"
    approval_rule: list[ApprovalCase] | None = None
    effect: Literal["read", "idempotent", "outward"] = "outward"
    # Changing what a tool does should change this: a request's digest covers it,
    # so an approval given for one version never runs another.
    version: str = "1"
    # What the call touches, shown on the card: a template over the arguments.
    target: str | None = None
    # Who may approve (docs/design.md, "Trust boundaries"): principals and
    # `group:<name>` entries; empty: anyone a registered channel may assert.
    approvers: list[str] = []
    # False: separation of duties, whoever started the session may not approve its calls.
    starter_may_approve: bool = True
    # Four eyes and more: this many distinct people must approve; one denial denies.
    # Or a rule over the arguments (a list of `ApprovalsCase`), kept in `approvals_rule`,
    # and then `approvals_required` is the most any of its cases asks: what the
    # approvers must be enough for, what a call gets when its rule cannot be
    # evaluated, and what the ledger asks until it evaluates the rule.
    approvals_required: int = Field(default=1, ge=1)
    approvals_rule: list[ApprovalsCase] | None = None
    # Which arguments a person may change before approving: all (`true`), those
    # listed (top-level names of `parameters`), or none (the default).
    editable: bool | list[str] = False
    # Whether a person may approve and remember (a grant for the rest of the session
    # or some hours): false by default; see `Rememberable` for the explicit form.
    rememberable: bool | Rememberable = False
    # How long a request for this tool waits for a decision before it closes as
    # expired; None: the deployment's default (SIGNOFF_APPROVAL_TIMEOUT_SECONDS).
    expires_after_seconds: float | None = Field(default=None, gt=0)
    escalation: Escalation | None = None
    implementation: HttpImplementation | PythonImplementation | None = Field(default=None, discriminator="kind")

    @model_validator(mode="before")
    @classmethod
    def _rules_kept_apart(cls, data: Any) -> Any:
        """`approval` and `approvals_required` may be written as rules (lists of cases):
        each is kept in its own field, beside the plain value the ledger reads today."""
        if isinstance(data, dict):
            data = dict(data)
            if isinstance(data.get("approval"), list):
                data["approval_rule"], data["approval"] = data["approval"], "always"
            if isinstance(data.get("approvals_required"), list):
                data["approvals_rule"], data["approvals_required"] = data["approvals_required"], 1
        return data

    @model_validator(mode="after")
    def _rules_hold_together(self) -> ToolSpec:
        """Each rule compiles and has exactly one last case without `when`; the editable
        fields are parameters; a tool that may be remembered says so for what a grant
        would pass by. Each refusal names the tool: a bad catalogue stops the service."""
        for field, rule in (("approval", self.approval_rule), ("approvals_required", self.approvals_rule)):
            if rule is None:
                continue
            if rule == []:
                raise ValueError(f"tool {self.name!r}: its {field} rule has no case")
            for number, case in enumerate(rule, start=1):
                if (case.when is None) != (number == len(rule)):
                    raise ValueError(
                        f"tool {self.name!r}: case {number} of its {field} rule: "
                        + (
                            "only the last case goes without `when`"
                            if case.when is None
                            else "the last case has no `when`"
                        )
                    )
                if case.when is not None:
                    try:
                        compiled_condition(case.when)
                    except ValueError as error:
                        raise ValueError(f"tool {self.name!r}: case {number} of its {field} rule: {error}") from None
        if self.approval_rule is not None:
            self.approval = "always"
        if self.approvals_rule is not None:
            self.approvals_required = max(case.then for case in self.approvals_rule)
        if isinstance(self.editable, list):
            listed = self.parameters.get("properties") or {}
            unknown = [name for name in self.editable if name not in listed]
            if unknown:
                raise ValueError(f"tool {self.name!r}: editable names what is not a parameter: {', '.join(unknown)}")
        missing = [name for name in self.remembering_passes_by if not self._says_remembered(name)]
        if self.rememberable is not False and missing:
            said = ", ".join(f"{name}: true" for name in self.remembering_passes_by)
            raise ValueError(
                f"tool {self.name!r} is {' and '.join(what.replace('_', ' ') for what in missing)}: it may be "
                f"remembered only if it says so: `rememberable: {{{said}}}`"
            )
        return self

    @property
    def remembering_passes_by(self) -> list[str]:
        """What a grant for this tool would let a call pass by unasked."""
        return [
            name
            for name, applies in (
                ("outward", self.effect == "outward"),
                ("several_approvers", self.approvals_required > 1),
                ("starter_forbidden", not self.starter_may_approve),
            )
            if applies
        ]

    def _says_remembered(self, what: str) -> bool:
        return isinstance(self.rememberable, Rememberable) and bool(getattr(self.rememberable, what))

    @property
    def may_be_remembered(self) -> bool:
        return self.rememberable is not False

    def may_edit(self, field: str) -> bool:
        """Whether a person may change this top-level argument before approving."""
        return self.editable is True or (isinstance(self.editable, list) and field in self.editable)

    @property
    def is_editable(self) -> bool:
        return bool(self.editable)

    @cached_property
    def closed_parameters(self) -> dict[str, Any]:
        """The parameters as checked, shown and offered to the model: closed by default,
        so an argument the schema does not list is refused before anyone is asked (an
        object that declares `additionalProperties` or its kin keeps its own rule)."""
        return closed(self.parameters)

    def argument_problems(self, arguments: dict[str, Any]) -> tuple[list[str], list[str]]:
        """(arguments the schema does not take, other errors). Each error names the
        path and the rule broken, never the value: a secret that is too short must
        not be repeated in the closure, the event, the transcript or a hook."""
        validator = jsonschema.Draft202012Validator(self.closed_parameters)
        unexpected: list[str] = []
        errors: list[str] = []
        for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path)):
            where = "/".join(map(str, error.absolute_path))
            if error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(
                error.instance, dict
            ):
                unexpected += [f"{where}/{name}" if where else name for name in _unlisted(error.instance, error.schema)]
            else:
                errors.append(f"{where or '(arguments)'}: {_rule_broken(error)}")
        return unexpected, errors

    def argument_errors(self, arguments: dict[str, Any]) -> list[str]:
        unexpected, errors = self.argument_problems(arguments)
        return [f"{name}: not a parameter of this tool" for name in unexpected] + errors

    def target_of(self, arguments: dict[str, Any]) -> str:
        """What the call touches, rendered by the executor's own rules (`http_request`)
        from the declaration, its secrets hidden and `${env:…}` left as written: the
        ledger's environment is not the executor's, and its values may be secrets."""
        shown, _ = redact_arguments(arguments, self.closed_parameters)
        if self.target:
            return _render(self.target, shown)
        if isinstance(self.implementation, HttpImplementation):
            return shown_request(self.implementation, shown)
        if isinstance(self.implementation, PythonImplementation):
            return f"python {self.implementation.function}"
        return "(no implementation)"

    def card(self, arguments: dict[str, Any], reason: str | None = None) -> ApprovalCard:
        shown, hidden = redact_arguments(arguments, self.closed_parameters)
        return ApprovalCard(
            tool=self.name,
            label=self.label,
            description=self.description,
            arguments=shown,
            target=self.target_of(arguments),
            effect=self.effect,
            hidden=hidden,
            reason=reason,
        )

    def shown_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments as anyone but the executor may see them (card, transcript)."""
        shown, _ = redact_arguments(arguments, self.closed_parameters)
        return shown

    def secret_values(self, arguments: dict[str, Any]) -> list[str]:
        """This call's hidden argument values: its errors and output must not repeat them."""
        return redaction.secret_values(arguments, self.closed_parameters)

    def description_for_model(self) -> ToolDescription:
        return ToolDescription(
            name=self.name, description=self.description or self.label, parameters=self.closed_parameters
        )


class ToolCatalogue(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tools: list[ToolSpec]
    # Group name -> its principals, for tools' `approvers` (`group:<name>`).
    groups: dict[str, list[str]] = {}

    @model_validator(mode="after")
    def _approvers_can_approve(self) -> ToolCatalogue:
        """A tool's approvers name only declared groups, and are enough for its
        `approvals_required`: a request nobody could ever approve is a mistake in
        the catalogue, refused when it is loaded rather than found by a waiting person.
        A rule's `approvals_required` is the most any of its cases asks (every case's
        count is a literal), so the approvers are enough for whichever case decides."""
        for tool in self.tools:
            named = [*tool.approvers, *(tool.escalation.to if tool.escalation else [])]
            unknown = [e for e in named if e.startswith(GROUP_PREFIX) and e[len(GROUP_PREFIX) :] not in self.groups]
            if unknown:
                raise ValueError(f"tool {tool.name!r} names undeclared approver groups: {', '.join(unknown)}")
            approvers = self.approvers_of(tool)
            if approvers is not None and len(approvers) < tool.approvals_required:
                raise ValueError(
                    f"tool {tool.name!r} requires {tool.approvals_required} approvals "
                    f"but names only {len(approvers)} approver(s)"
                )
        return self

    def approvers_of(self, tool: ToolSpec) -> frozenset[str] | None:
        """The principals who may approve the tool, its groups resolved; None: anyone."""
        if not tool.approvers:
            return None
        return self.principals(tool.approvers)

    def principals(self, entries: list[str]) -> frozenset[str]:
        """Principals and `group:<name>` entries, the groups resolved."""
        principals: set[str] = set()
        for entry in entries:
            if entry.startswith(GROUP_PREFIX):
                # Declared: the catalogue refuses an undeclared group when it is loaded.
                principals.update(self.groups[entry[len(GROUP_PREFIX) :]])
            else:
                principals.add(entry)
        return frozenset(principals)

    @cached_property
    def by_name(self) -> dict[str, ToolSpec]:
        return {t.name: t for t in self.tools}

    def get(self, name: str) -> ToolSpec | None:
        return self.by_name.get(name)

    def env_references(self) -> set[str]:
        """The environment variables the tools read: `${env:NAME}` in an http tool's URL
        or headers, and a python tool's declared `env`."""
        http = {
            name
            for tool in self.tools
            if isinstance(tool.implementation, HttpImplementation)
            for text in (tool.implementation.url, *tool.implementation.headers.values())
            for name in env_references(text)
        }
        python = {
            name
            for tool in self.tools
            if isinstance(tool.implementation, PythonImplementation)
            for name in tool.implementation.env
        }
        return http | python

    def descriptions(self) -> list[ToolDescription]:
        return [t.description_for_model() for t in self.tools]


def load_catalogue(path: Path) -> ToolCatalogue:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"tools file not found: {path} (set SIGNOFF_TOOLS_FILE)") from None
    return ToolCatalogue.model_validate(data or {"tools": []})


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of a JSON schema in which every object that does not say how it takes
    unlisted properties takes none (`additionalProperties: false`). Branches of
    `allOf`, `anyOf` and `oneOf` are left as declared: closing each branch of a
    composition would refuse what the whole allows."""

    def close(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        node = dict(node)
        for keyword in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
            if isinstance(node.get(keyword), dict):
                node[keyword] = {name: close(sub) for name, sub in node[keyword].items()}
        for keyword in ("items", "additionalProperties", "contains", "not", "if", "then", "else"):
            if isinstance(node.get(keyword), dict):
                node[keyword] = close(node[keyword])
        if isinstance(node.get("prefixItems"), list):
            node["prefixItems"] = [close(sub) for sub in node["prefixItems"]]
        is_object = node.get("type") == "object" or "properties" in node
        if is_object and not any(k in node for k in (*_OPEN_KEYWORDS, "allOf", "anyOf", "oneOf", "$ref")):
            node["additionalProperties"] = False
        return node

    return close(copy.deepcopy(schema))


def _unlisted(instance: dict[str, Any], schema: Any) -> list[str]:
    """The property names an object schema neither lists nor matches by pattern."""
    schema = schema if isinstance(schema, dict) else {}
    listed = schema.get("properties") or {}
    patterns = list(schema.get("patternProperties") or {})
    return [str(n) for n in instance if n not in listed and not any(re.search(p, str(n)) for p in patterns)]


def _rule_broken(error: jsonschema.ValidationError) -> str:
    """What an argument must be, from the schema alone (the value is never quoted)."""
    rule, expected = error.validator, error.validator_value
    if rule == "required":
        missing = [name for name in expected if isinstance(error.instance, dict) and name not in error.instance]
        return "missing required " + ", ".join(repr(n) for n in missing)
    if rule == "type":
        return f"must be of type {json.dumps(expected)}"
    if rule in ("enum", "const"):
        # default=str: an operator's YAML may hold a date, which JSON has no word for.
        return f"must be {'one of ' if rule == 'enum' else ''}{json.dumps(expected, default=str)[:200]}"
    if rule == "format" and expected == "password":
        return "must be a password"
    return f"must satisfy {rule}: {json.dumps(expected, default=str)[:200]}"


def _render(template: str, arguments: dict[str, Any]) -> str:
    return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: str(arguments.get(m.group(1), m.group(0))), template)


class MissingSecret(Exception):
    """A `${env:NAME}` reference whose variable is not set: an error, never an empty string."""

    def __init__(self, name: str) -> None:
        super().__init__(f"${{env:{name}}} is not set in this process's environment")
        self.name = name


def resolve_secrets(value: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace `${env:NAME}` with the environment's value, at call time only; an unset
    one raises MissingSecret. Each value is remembered as a secret (never logged)."""
    environ = os.environ if environ is None else environ

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise MissingSecret(name)
        redaction.remember(environ[name])
        return environ[name]

    return _ENV_REF.sub(value_of, value)


def env_references(value: str) -> list[str]:
    return _ENV_REF.findall(value)


def shown_request(implementation: HttpImplementation, shown_arguments: dict[str, Any]) -> str:
    """`METHOD url` of an http tool's call as anyone but the executor may see it: from
    the arguments with their secrets hidden, `${env:…}` left as written, the URL's
    user-info and query values hidden, no fragment (it is never sent)."""
    request = http_request(implementation, shown_arguments, env=lambda name: f"${{env:{name}}}")
    return f"{request.method} {redact_url(request.url.split('#', 1)[0])}"


@dataclass(frozen=True)
class HttpRequest:
    method: str
    url: str
    headers: dict[str, str]
    params: dict[str, Any] | None
    json: dict[str, Any] | None


def http_request(
    implementation: HttpImplementation, arguments: dict[str, Any], *, env: Callable[[str], str]
) -> HttpRequest:
    """The request an http tool makes, from its declaration: `${env:NAME}` filled by
    `env` first (the executor: its environment; the card: the reference as written),
    then each `{argument}` placeholder of the URL with the argument, quoted; the other
    arguments go in the query (GET, DELETE) or the JSON body. The card and the call
    are rendered by this one function, so the card shows the request that is made."""
    url = _ENV_REF.sub(lambda m: env(m.group(1)), implementation.url)
    used = set()
    for key, value in arguments.items():
        if "{" + key + "}" in url:
            # A hidden value is shown as the marker, not as its percent-encoding.
            url = url.replace("{" + key + "}", REDACTED if value == REDACTED else quote(str(value), safe=""))
            used.add(key)
    rest = {k: v for k, v in arguments.items() if k not in used}
    headers = {k: _ENV_REF.sub(lambda m: env(m.group(1)), v).strip() for k, v in implementation.headers.items()}
    method = implementation.method.upper()
    query = method in ("GET", "DELETE")
    return HttpRequest(method, url, headers, rest if query else None, None if query else rest)
