"""The tool catalogue: what each tool is, who must approve it, and what it touches.

Declared in YAML (see deploy/tools.yaml). The ledger reads it for policy, the
approval card and argument checks; the executor for the implementation; the
model-step for the descriptions it offers the model.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import jsonschema
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from shared import redaction
from shared.messages import ApprovalCard, ToolDescription
from shared.redaction import REDACTED, redact_arguments, redact_url
from shared.rule_types import (  # noqa: F401  (the cases and conditions, named where tools are)
    ARGUMENTS,
    RULE_DEPTH,
    RULE_TYPES,
    ApprovalCase,
    ApprovalsCase,
    RuleCase,
    compiled_condition,
)
from shared.tool_menu import ToolMenu

log = logging.getLogger("signoff.catalogue")

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
    # The tool keeps nothing of one call that a later call may not see, and leaves no
    # process behind: its calls may then share a warm process of their own (one per tool,
    # serving its calls one at a time; services/tool_executor/tools.py `WarmWorkers`),
    # which saves a fork and the tool's imports per call. Off: a fresh process per call.
    reuse_process: bool = False

    @field_validator("env")
    @classmethod
    def _variables_a_tool_may_have(cls, names: list[str]) -> list[str]:
        for name in names:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable's name")
            if name.upper().startswith("SIGNOFF_"):
                raise ValueError(f"{name!r} is one of the executor's own settings, never a tool's")
        return names


# A credential's reference in an MCP server's connection: the executor's (or the proxy's)
# environment, or a file of the keys folder's `mcp/` (`${key:NAME}`). Never the value itself.
_CREDENTIAL_REF = re.compile(r"\$\{(env|key):([A-Za-z_][A-Za-z0-9_.-]*)\}")
# Headers that carry a credential: their value must be a reference, never written in the file.
_CREDENTIAL_HEADER = re.compile(r"authorization|cookie|token|secret|key|password|auth", re.IGNORECASE)


class McpServer(BaseModel):
    """How to reach an MCP server: a command started over stdio, or a Streamable HTTP URL.
    Its credentials are references (`${env:NAME}`, `${key:NAME}`) filled in only when it is
    reached, never values in the file: the file may be read by anyone who reads the config."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] | None = Field(default=None, min_length=1)
    url: str | None = None
    # A stdio server's environment: names passed through from this process's own environment
    # (`[GITHUB_TOKEN]`), or `NAME: ${env:OTHER}` / `NAME: ${key:file}`.
    env: list[str] | dict[str, str] = []
    cwd: str | None = None
    headers: dict[str, str] = {}
    # How long one call may take before the server is said not to have answered.
    timeout_seconds: float = Field(default=60.0, gt=0)
    # How long starting (or reaching) the server and its handshake may take.
    connect_timeout_seconds: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _one_way_in_and_no_written_secrets(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server is reached by exactly one of `command` (stdio) or `url` (Streamable HTTP)")
        if self.url is not None and not re.match(r"^https?://", self.url):
            raise ValueError(f"`url` must be http:// or https://, not {redact_url(self.url)!r}")
        if self.url is not None and self.env:
            raise ValueError("`env` is for a stdio server (`command`); an HTTP server's credentials go in `headers`")
        if self.command is not None and self.headers:
            raise ValueError("`headers` are for an HTTP server (`url`); a stdio server's credentials go in `env`")
        names = self.env if isinstance(self.env, list) else list(self.env)
        for name in names:
            if not _ENV_NAME.fullmatch(name) or name.upper().startswith("SIGNOFF_"):
                raise ValueError(f"{name!r} may not be passed to an MCP server (not a name, or one of Signoff's own)")
        if isinstance(self.env, dict):
            for name, value in self.env.items():
                if not _CREDENTIAL_REF.fullmatch(value.strip()):
                    raise ValueError(
                        f"env {name!r}: write a reference (`${{env:NAME}}` or `${{key:NAME}}`), never a value"
                    )
        for name, value in self.headers.items():
            if _CREDENTIAL_HEADER.search(name) and not _CREDENTIAL_REF.search(value):
                raise ValueError(
                    f"header {name!r} carries a credential: write a reference (`${{env:NAME}}` or "
                    "`${key:NAME}`), never a value"
                )
        return self

    def env_references(self) -> set[str]:
        """The environment variables reaching this server reads."""
        values = [*self.headers.values(), *(self.env.values() if isinstance(self.env, dict) else [])]
        passed = set(self.env) if isinstance(self.env, list) else set()
        return passed | {name for value in values for source, name in _CREDENTIAL_REF.findall(value) if source == "env"}

    @property
    def shown(self) -> str:
        """The server as a card, a log or an error may name it: no credential, no query."""
        if self.url is not None:
            return redact_url(self.url.split("?", 1)[0])
        assert self.command is not None
        return "stdio " + Path(self.command[0]).name

    def environment(self, keys_dir: Path | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """A stdio server's own variables, filled in now (each value remembered as a secret)."""
        environ = os.environ if environ is None else environ
        if isinstance(self.env, list):
            return {name: credential(f"${{env:{name}}}", keys_dir, environ) for name in self.env}
        return {name: credential(value, keys_dir, environ) for name, value in self.env.items()}

    def filled_headers(self, keys_dir: Path | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        environ = os.environ if environ is None else environ
        return {name: credential(value, keys_dir, environ) for name, value in self.headers.items()}


# The keys folder's sub-folder that holds MCP servers' credentials (`${key:NAME}`).
MCP_KEYS = "mcp"


def credential(value: str, keys_dir: Path | None, environ: Mapping[str, str]) -> str:
    """`value` with each `${env:NAME}` and `${key:NAME}` filled in; an unset variable or a
    missing key file raises MissingSecret. Each filled value is remembered as a secret, so
    no log or error of this process repeats it."""

    def fill(match: re.Match[str]) -> str:
        source, name = match.groups()
        if source == "env":
            if name not in environ:
                raise MissingSecret(name)
            found = environ[name]
        else:
            if keys_dir is None or "/" in name or name.startswith("."):
                raise MissingSecret(name, where=f"the keys folder's {MCP_KEYS}/")
            try:
                found = (keys_dir / MCP_KEYS / name).read_text().strip()
            except OSError:
                raise MissingSecret(name, where=f"the keys folder's {MCP_KEYS}/") from None
        redaction.remember(found)
        return found

    return _CREDENTIAL_REF.sub(fill, value)


class McpImplementation(BaseModel):
    """A tool of an MCP server: the executor reaches the server and calls `tool` once."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["mcp"] = "mcp"
    server: McpServer
    # The server's own name for the tool (the catalogue's name may differ).
    tool: str = Field(min_length=1, max_length=128)


class Escalation(BaseModel):
    """After `after_seconds` without a decision, the request is announced again to
    `to` (principals and `group:<name>` entries), who may then approve it too."""

    model_config = ConfigDict(extra="forbid")
    after_seconds: float = Field(gt=0)
    to: list[str] = Field(min_length=1)


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
    # `always` or `never`; or a rule over the arguments (shared/rule_types/approval.py).
    approval: Literal["always", "never"] = "always"
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
    # Or a rule over the arguments (shared/rule_types/approvals.py).
    approvals_required: int = Field(default=1, ge=1)
    # The fields written as rules over the arguments (lists of cases), by field name
    # (shared/rule_types: `approval`, `approvals_required`). While a field has a rule,
    # its plain value reads what its rule type says the ledger asks until it evaluates
    # the rule (services/approval_ledger/decision_rules.py): the safe side.
    rules: dict[str, list[SerializeAsAny[RuleCase]]] = {}
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
    implementation: HttpImplementation | PythonImplementation | McpImplementation | None = Field(
        default=None, discriminator="kind"
    )
    # The values of the catalogue's `shown_env` variables, as this process has them
    # (`ToolCatalogue.showing`): its card's target shows them instead of `${env:…}`.
    _shown_env: dict[str, str] = PrivateAttr(default_factory=dict)
    # Who runs an approved call: Signoff's tool-executor (`signoff`, the default: it needs
    # an implementation), or the program that filed it through the intake (`caller`: it
    # claims the call, runs it in its own process and reports how it ended, once).
    runs: Literal["signoff", "caller"] = "signoff"

    @model_validator(mode="before")
    @classmethod
    def _rules_kept_apart(cls, data: Any) -> Any:
        """A field of `RULE_TYPES` may be written as a rule (a list of cases): each is
        kept in `rules` under its field, as its rule type's cases."""
        if isinstance(data, dict):
            data = dict(data)
            rules = dict(data.get("rules") or {})
            for field in RULE_TYPES:
                if isinstance(data.get(field), list):
                    rules[field] = data.pop(field)
            unknown = sorted(set(rules) - set(RULE_TYPES))
            if unknown:
                raise ValueError(
                    f"no field of a tool may be a rule but {', '.join(RULE_TYPES)}: not {', '.join(unknown)}"
                )
            data["rules"] = {
                field: [RULE_TYPES[field].case.model_validate(case) for case in cases]
                if isinstance(cases, list)
                else cases
                for field, cases in rules.items()
            }
        return data

    @model_validator(mode="after")
    def _rules_hold_together(self) -> ToolSpec:
        """Each rule compiles and has exactly one last case without `when`; the editable
        fields are parameters; a tool that may be remembered says so for what a grant
        would pass by. Each refusal names the tool: a bad catalogue stops the service."""
        for field, rule_type in RULE_TYPES.items():
            rule = self.rules.get(field)
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
            setattr(self, field, rule_type.standing_value(rule))
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
        from the declaration, its secrets hidden and `${env:…}` left as written unless
        the catalogue's `shown_env` names it: the ledger's environment is not the
        executor's, and its values may be secrets; a variable named there is where a
        call goes, shown resolved (its URL's user-info and query values still hidden)."""
        shown, _ = redact_arguments(arguments, self.closed_parameters)
        if self.target:
            return _render(self.target, shown)
        if isinstance(self.implementation, HttpImplementation):
            return shown_request(self.implementation, shown, self._shown_env)
        if isinstance(self.implementation, PythonImplementation):
            return f"python {self.implementation.function}"
        if self.runs == "caller":
            return "run by the caller"
        if isinstance(self.implementation, McpImplementation):
            return f"MCP tool {self.implementation.tool} on {self.implementation.server.shown}"
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


class UnknownTools(BaseModel):
    """An origin's default for tools the catalogue does not know (the caller declares
    them): every such call asks, as this says; the card says the tool is the caller's
    word. The caller runs them (`runs: caller`): Signoff has no implementation of them."""

    model_config = ConfigDict(extra="forbid")
    approvers: list[str] = []
    approvals_required: int = Field(default=1, ge=1)
    starter_may_approve: bool = True
    expires_after_seconds: float | None = Field(default=None, gt=0)
    effect: Literal["read", "idempotent", "outward"] = "outward"


class Origin(BaseModel):
    """Where filed calls come from (`<kind>:<name>`, e.g. `langgraph:support`), as the
    operator declares it: the programs that may file for it (principals, `bot:<token
    name>`), the catalogue's tools they may file, and optionally a default for tools the
    catalogue does not know. A program can never register a tool or lower a policy."""

    model_config = ConfigDict(extra="forbid")
    programs: list[str] = Field(min_length=1)
    tools: list[str] = []
    unknown_tools: UnknownTools | None = None


# A filed call of a tool the catalogue does not know is recorded under this name: the
# origin and the caller's tool name, which no catalogue tool's name can be.
DECLARED_SEPARATOR = "/"


def declared_tool_name(origin: str, tool: str) -> str:
    return f"{origin}{DECLARED_SEPARATOR}{tool}"


class ToolCatalogue(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tools: list[ToolSpec]
    # Group name -> its principals, for tools' `approvers` (`group:<name>`).
    groups: dict[str, list[str]] = {}
    # Environment variables that say where calls go, never a credential (a base URL):
    # a card's target shows their values, not `${env:NAME}`, and every service is
    # given them (services/operations/service_users.py), so the ledger that draws the card has them.
    shown_env: list[str] = []

    @field_validator("shown_env")
    @classmethod
    def _shown_are_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not _ENV_NAME.fullmatch(name) or name.upper().startswith("SIGNOFF_"):
                raise ValueError(f"shown_env: {name!r} is not a tool's environment variable")
        return names

    def showing(self, environ: Mapping[str, str]) -> ToolCatalogue:
        """The catalogue whose cards show the `shown_env` variables' values from `environ`
        (one unset there stays `${env:NAME}`, as written)."""
        values = {name: environ[name] for name in self.shown_env if name in environ}
        for tool in self.tools:
            tool._shown_env = values
        return self

    # The intake's origins (`<kind>:<name>` -> who may file for it, and what).
    origins: dict[str, Origin] = {}

    @model_validator(mode="after")
    def _origins_name_catalogue_tools(self) -> ToolCatalogue:
        """An origin's tools are the catalogue's, and its name has the form filed calls use."""
        known = {tool.name for tool in self.tools}
        for name, origin in self.origins.items():
            if not ORIGIN_NAME.fullmatch(name):
                raise ValueError(f"origin {name!r}: not `<kind>:<name>` (e.g. `langgraph:support`)")
            unknown = [tool for tool in origin.tools if tool not in known]
            if unknown:
                raise ValueError(f"origin {name!r} names tools the catalogue does not declare: {', '.join(unknown)}")
        return self

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
        """A tool of the catalogue; or a tool a caller declared (`<origin>/<tool>`), as its
        origin's `unknown_tools` default says (None: the origin declares no default)."""
        spec = self.by_name.get(name)
        if spec is None and DECLARED_SEPARATOR in name:
            origin, _, tool = name.partition(DECLARED_SEPARATOR)
            spec = self.declared_by_caller(origin, tool)
        return spec

    def declared_by_caller(self, origin: str, tool: str) -> ToolSpec | None:
        """The spec a tool the catalogue does not know gets when its origin declares a
        default: open arguments (the caller's word, secrets hidden by their names), its
        origin's approvers and count, run by the caller. None: no such default."""
        default = self.origins[origin].unknown_tools if origin in self.origins else None
        if default is None or not CALLER_TOOL_NAME.fullmatch(tool):
            return None
        return _declared_specs(self, origin, tool)

    def env_references(self) -> set[str]:
        """The environment variables the tools read: `${env:NAME}` in an http tool's URL
        or headers, a python tool's declared `env`, and what an MCP tool's server reads."""
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
        mcp = {
            name
            for tool in self.tools
            if isinstance(tool.implementation, McpImplementation)
            for name in tool.implementation.server.env_references()
        }
        return http | python | mcp

    def descriptions(self) -> list[ToolDescription]:
        """The tools Signoff's own model is offered: those Signoff runs (a `runs: caller`
        tool lives in another agent's process, which files its calls through the intake)."""
        return [t.description_for_model() for t in self.tools if t.runs == "signoff"]

    @cached_property
    def menu(self) -> ToolMenu:
        """The descriptions as the menu a model step names by digest (shared/tool_menu.py),
        made once per catalogue: a reloaded catalogue is a new object, with its own menu."""
        return ToolMenu.of(self.descriptions())


ORIGIN_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}:[A-Za-z0-9._-]{1,64}$")
CALLER_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")


def _declared_specs(catalogue: ToolCatalogue, origin: str, tool: str) -> ToolSpec:
    default = catalogue.origins[origin].unknown_tools
    assert default is not None
    spec = ToolSpec.model_validate(
        {
            "name": "declared",
            "label": f"{tool} (declared by the caller, not in the catalogue)",
            "description": f"A tool {origin} declared itself: its name and arguments are the caller's word; "
            "the catalogue does not describe it.",
            "parameters": {"type": "object", "additionalProperties": True},
            "approval": "always",
            "effect": default.effect,
            "approvers": default.approvers,
            "approvals_required": default.approvals_required,
            "starter_may_approve": default.starter_may_approve,
            "expires_after_seconds": default.expires_after_seconds,
            "runs": "caller",
            "target": f"run by the caller ({origin})",
        }
    )
    # Its name is the origin's and the caller's (`<origin>/<tool>`), which no tool of the
    # catalogue may have: set after validation, which keeps catalogue names to their pattern.
    return spec.model_copy(update={"name": declared_tool_name(origin, tool)})


class CatalogueRefused(ValueError):
    """A tools file that cannot be used, refused whole; the message names each tool at fault."""


def read_catalogue(path: Path) -> ToolCatalogue:
    """The tools file's catalogue, or CatalogueRefused naming each tool at fault (by its
    name where it has one, else its place): a file is taken whole or not at all."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise CatalogueRefused(f"tools file not found: {path} (set SIGNOFF_TOOLS_FILE)") from None
    except (OSError, yaml.YAMLError) as error:
        raise CatalogueRefused(f"tools file {path} cannot be read: {error}") from None
    try:
        return ToolCatalogue.model_validate(data or {"tools": []}).showing(os.environ)
    except ValidationError as invalid:
        tools = data.get("tools") if isinstance(data, dict) else None
        problems = []
        for problem in invalid.errors(include_url=False):
            where = [str(part) for part in problem["loc"]]
            if len(where) >= 2 and where[0] == "tools" and where[1].isdigit():
                index = int(where[1])
                entry = tools[index] if isinstance(tools, list) and index < len(tools) else None
                name = entry.get("name") if isinstance(entry, dict) else None
                tool = f"tool {name!r}" if isinstance(name, str) else f"tool number {index + 1}"
                where = [tool, ".".join(where[2:])] if where[2:] else [tool]
            else:
                where = [".".join(where)] if where else []
            said = str(problem["msg"]).removeprefix("Value error, ")
            if where and said.startswith(where[0]):  # a rule's own message names its tool already
                where = where[1:]
            problems.append(": ".join([*where, said]))
        raise CatalogueRefused(f"tools file {path} refused: {'; '.join(problems)}") from None


def load_catalogue(path: Path) -> ToolCatalogue:
    """The catalogue a process starts with: a file that cannot be used stops it, saying why."""
    try:
        return read_catalogue(path)
    except CatalogueRefused as refused:
        raise SystemExit(str(refused)) from None


def reload_catalogue(path: Path, take: Callable[[ToolCatalogue], None]) -> None:
    """Read the tools file again (SIGHUP, `signoff reload`) and hand the new catalogue to
    `take`; a file that cannot be used is refused whole, saying why, and the catalogue in
    use stays. One line either way, which `signoff reload` reads."""
    try:
        catalogue = read_catalogue(path)
    except CatalogueRefused as refused:
        log.error("tools file not reloaded, the catalogue in use is kept: %s", refused)
        return
    take(catalogue)
    log.info("tools file reloaded: %d tools (%s)", len(catalogue.tools), path)


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

    def __init__(self, name: str, where: str | None = None) -> None:
        if where is None:
            super().__init__(f"${{env:{name}}} is not set in this process's environment")
        else:
            super().__init__(f"${{key:{name}}} is not a readable file of {where}")
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


def shown_request(
    implementation: HttpImplementation, shown_arguments: dict[str, Any], shown_env: Mapping[str, str] | None = None
) -> str:
    """`METHOD url` of an http tool's call as anyone but the executor may see it: from
    the arguments with their secrets hidden, `${env:…}` left as written (but for the
    `shown_env` values given), the URL's user-info and query values hidden, no
    fragment (it is never sent)."""
    shown = shown_env or {}
    request = http_request(implementation, shown_arguments, env=lambda name: shown.get(name, f"${{env:{name}}}"))
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
