"""The tool catalogue: what each tool is, who must approve it, and what it touches.

Declared in YAML (see deploy/tools.yaml). The ledger reads it for policy, the
approval card and argument checks; the executor for the implementation; the
model-step for the descriptions it offers the model.
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.messages import ApprovalCard, ToolDescription

REDACTED = "***redacted***"
_SECRET_NAME = re.compile(
    r"(pass(word)?|secret|token|api[_-]?key|authori[sz]ation|credential|cookie|private[_-]?key)", re.I
)
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
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


class Escalation(BaseModel):
    """After `after_seconds` without a decision, the request is announced again to
    `to` (principals and `group:<name>` entries), who may then approve it too."""

    model_config = ConfigDict(extra="forbid")
    after_seconds: float = Field(gt=0)
    to: list[str] = Field(min_length=1)


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    label: str
    description: str = ""
    parameters: dict[str, Any] = {"type": "object"}
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
    approvals_required: int = Field(default=1, ge=1)
    # How long a request for this tool waits for a decision before it closes as
    # expired; None: the deployment's default (SIGNOFF_APPROVAL_TIMEOUT_SECONDS).
    expires_after_seconds: float | None = Field(default=None, gt=0)
    escalation: Escalation | None = None
    implementation: HttpImplementation | PythonImplementation | None = Field(default=None, discriminator="kind")

    def argument_errors(self, arguments: dict[str, Any]) -> list[str]:
        validator = jsonschema.Draft202012Validator(self.parameters)
        return [
            f"{'/'.join(map(str, e.absolute_path)) or '(arguments)'}: {e.message}"
            for e in sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        ]

    def target_of(self, arguments: dict[str, Any]) -> str:
        """Host, path or account the call touches; credentials never appear."""
        if self.target:
            return _render(self.target, redact(arguments))
        if isinstance(self.implementation, HttpImplementation):
            url = _render(resolve_secrets(self.implementation.url), redact(arguments))
            parts = urlsplit(url)
            port = f":{parts.port}" if parts.port else ""
            return f"{self.implementation.method.upper()} {parts.scheme}://{parts.hostname or ''}{port}{parts.path}"
        if isinstance(self.implementation, PythonImplementation):
            return f"python {self.implementation.function}"
        return "(no implementation)"

    def card(self, arguments: dict[str, Any]) -> ApprovalCard:
        return ApprovalCard(
            tool=self.name,
            label=self.label,
            description=self.description,
            arguments=redact(arguments),
            target=self.target_of(arguments),
            effect=self.effect,
        )

    def description_for_model(self) -> ToolDescription:
        return ToolDescription(name=self.name, description=self.description or self.label, parameters=self.parameters)


class ToolCatalogue(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tools: list[ToolSpec]
    # Group name -> its principals, for tools' `approvers` (`group:<name>`).
    groups: dict[str, list[str]] = {}

    @model_validator(mode="after")
    def _approvers_can_approve(self) -> ToolCatalogue:
        """A tool's approvers name only declared groups, and are enough for its
        `approvals_required`: a request nobody could ever approve is a mistake in
        the catalogue, refused when it is loaded rather than found by a waiting person."""
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

    def descriptions(self) -> list[ToolDescription]:
        return [t.description_for_model() for t in self.tools]


def load_catalogue(path: Path) -> ToolCatalogue:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"tools file not found: {path} (set SIGNOFF_TOOLS_FILE)") from None
    return ToolCatalogue.model_validate(data or {"tools": []})


def redact(value: Any, key: str = "") -> Any:
    if key and _SECRET_NAME.search(key):
        return REDACTED
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _render(template: str, arguments: dict[str, Any]) -> str:
    return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: str(arguments.get(m.group(1), m.group(0))), template)


def resolve_secrets(value: str) -> str:
    """Replace `${env:NAME}` with the environment's value, at call time only."""
    return _ENV_REF.sub(lambda m: os.environ.get(m.group(1), ""), value)


def render_url(template: str, arguments: dict[str, Any]) -> str:
    return _render(template, arguments)
