"""The decisions a person asks for beyond approve and deny, as pure rules:

- whether a call needs approval, and from how many, when the tool's rule depends on
  the arguments (`verdict`);
- whether a person's edit of the arguments may be approved (`judge_edit`);
- whether an approval may be remembered (`may_remember`) and which remembered grant,
  if any, authorizes a later call (`grant_covering`).

No I/O, no clock, no randomness: the ledger loads what these read and records what
they decide. All are wired into the ledger (docs/rules.md, "Decisions beyond approve and deny").
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

import celpy

from shared.catalogue import ToolSpec
from shared.redaction import REDACTED
from shared.rule_types import ARGUMENTS, RULE_TYPES, RuleCase, RuleType, approvers_in_words, compiled_condition

# --- conditional approval ------------------------------------------------------------------

# How much of one argument's value a reason or a diff repeats.
_VALUE_CHARS = 60
# How long a reason may be: it is recorded with the request and shown on the card.
REASON_CHARS = 300
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(:,)?\}")
Case = TypeVar("Case", bound=RuleCase)


@dataclass(frozen=True)
class Verdict:
    """What a call needs before it runs, and why, in words a person reads on the card
    and in the audit log. `error` names a rule that could not be evaluated: the call
    then needs the tool's most approvers, the safe side."""

    approvals_required: int
    reason: str
    error: str | None = None

    @property
    def needs_approval(self) -> bool:
        return self.approvals_required > 0


class RuleFailed(Exception):
    """A condition that could not be evaluated for these arguments; its text names
    the rule and what went wrong, never an argument's value."""


def verdict(tool: ToolSpec, arguments: Mapping[str, Any]) -> Verdict:
    """Whether this call needs approval, from how many people, and why: the tool's
    `approval` and `approvals_required`, plain or as rules over the arguments (the
    first case whose condition holds decides). A rule that cannot be evaluated (a
    missing field, a value of the wrong type) gives the safe default: approval by the
    tool's most approvers, the error named."""
    shown = tool.shown_arguments(dict(arguments))
    try:
        asks, asks_reason = _decide(RULE_TYPES["approval"], tool, arguments, shown)
        if not asks:
            return Verdict(0, asks_reason)
        count, count_reason = _decide(RULE_TYPES["approvals_required"], tool, arguments, shown)
    except RuleFailed as error:
        count = tool.approvals_required
        return Verdict(count, _cut(f"{error}: {approvers_in_words(count)}, the most this tool asks"), str(error))
    if "approvals_required" not in tool.rules:
        reason = f"{asks_reason}: {count_reason}"
    elif "approval" not in tool.rules:
        # The count's own reason says it all ("amount 2,500 > 1,000: two approvers").
        reason = count_reason
    else:
        reason = f"{asks_reason}; {count_reason}"
    return Verdict(count, _cut(reason))


def _decide(
    rule_type: RuleType, tool: ToolSpec, arguments: Mapping[str, Any], shown: Mapping[str, Any]
) -> tuple[Any, str]:
    """The field's value for this call and why: its plain value, or its rule's deciding case."""
    rule = tool.rules.get(rule_type.field)
    if rule is None:
        return rule_type.plain(tool.label, getattr(tool, rule_type.field))
    case = _deciding(rule, arguments, rule_type.field)
    return rule_type.decided(case, lambda template: _render_reason(template, shown))


def _deciding(cases: list[Case], arguments: Mapping[str, Any], field: str) -> Case:
    """The first case whose condition holds; the last has none (the catalogue refuses a
    rule whose last case has one) and decides every call the others do not."""
    for number, case in enumerate(cases[:-1], start=1):
        if _holds(str(case.when), arguments, f"case {number} of the {field} rule"):
            return case
    return cases[-1]


def _holds(condition: str, arguments: Mapping[str, Any], rule: str) -> bool:
    try:
        result = compiled_condition(condition).evaluate({ARGUMENTS: celpy.json_to_cel(dict(arguments))})
    except celpy.CELEvalError as error:
        raise RuleFailed(f"{rule} could not be evaluated ({_what_failed(error, condition)})") from None
    except Exception:  # cel-python's own failure (nesting too deep, a bug): still the safe default
        raise RuleFailed(f"{rule} could not be evaluated (the evaluator failed)") from None
    # cel-python may hand back its error as the value rather than raise it.
    if isinstance(result, celpy.CELEvalError):
        raise RuleFailed(f"{rule} could not be evaluated ({_what_failed(result, condition)})")
    if not isinstance(result, celpy.celtypes.BoolType):
        raise RuleFailed(f"{rule} could not be evaluated (its result is not true or false)")
    return bool(result)


def _what_failed(error: celpy.CELEvalError, condition: str) -> str:
    """What went wrong, never a value: cel-python's own text can quote the arguments.
    A missing field is named when the condition itself names it."""
    kind = error.args[1] if len(error.args) > 1 else None
    if kind is KeyError:
        named = re.search(r"no such member in mapping: '([A-Za-z_][A-Za-z0-9_]*)'", str(error.args[0]))
        if named and re.search(rf"\b{named.group(1)}\b", condition):
            return f"no argument {named.group(1)!r}"
        return "an argument it reads is missing"
    if kind is TypeError:
        return "an argument is not of the type it compares"
    return "it failed on these arguments"


def _render_reason(template: str, shown: Mapping[str, Any]) -> str:
    """`{name}` is the argument as the card shows it (secrets hidden), `{name:,}` a
    number with thousands separators (2,500); a placeholder the call lacks is kept."""

    def value_of(match: re.Match[str]) -> str:
        name, grouped = match.group(1), match.group(2)
        if name not in shown:
            return match.group(0)
        value = shown[name]
        if grouped and isinstance(value, int | float) and not isinstance(value, bool):
            return f"{value:,}"
        return _short(value)

    return _PLACEHOLDER.sub(value_of, template)


def _cut(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def _short(value: Any) -> str:
    # Arguments are JSON (they arrived in a validated message): no `default` is needed.
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


# --- edit before approve -------------------------------------------------------------------

EditRefusal = Literal["tool_not_editable", "field_not_editable", "edit_breaks_schema", "hidden_value_edited"]


@dataclass(frozen=True)
class EditAccepted:
    """The arguments the decision binds (the ledger digests these, the executor runs
    these), the top-level fields changed, and the change as the model and the audit
    log are told it, secrets hidden."""

    arguments: dict[str, Any]
    changed: tuple[str, ...]
    diff: str


@dataclass(frozen=True)
class EditRefused:
    reason: EditRefusal
    detail: str


def judge_edit(tool: ToolSpec, original: Mapping[str, Any], edited: Mapping[str, Any]) -> EditAccepted | EditRefused:
    """A person's edit of a call's arguments before approving it. `edited` is the whole
    argument object as the person sent it, built from the card: a field sent as the
    card showed it (a secret as the redaction marker) is unchanged and keeps its real
    value. Refused: an edit of a tool that is not editable, a change to a field the
    tool does not list as editable, the marker left inside a changed field (a hidden
    value cannot be partly edited), arguments the schema refuses."""
    if not tool.is_editable:
        return EditRefused("tool_not_editable", f"{tool.name} does not let a person edit its arguments")
    shown = tool.shown_arguments(dict(original))
    result: dict[str, Any] = {}
    changed: list[str] = []
    for name in [*original, *(n for n in edited if n not in original)]:
        if (
            name in edited
            and name in original
            and (_same(edited[name], original[name]) or _same(edited[name], shown[name]))
        ):
            result[name] = original[name]
            continue
        changed.append(name)
        if name in edited:
            result[name] = edited[name]
    if not changed:
        return EditAccepted(result, (), "no change")
    refused = [name for name in changed if not tool.may_edit(name)]
    if refused:
        return EditRefused("field_not_editable", f"not editable: {', '.join(_short(n) for n in refused)}")
    marked = [name for name in changed if name in result and _holds_marker(result[name])]
    if marked:
        return EditRefused(
            "hidden_value_edited", f"{', '.join(marked)}: a hidden value may be replaced whole or left as it was"
        )
    errors = tool.argument_errors(result)
    if errors:
        return EditRefused("edit_breaks_schema", "; ".join(errors))
    return EditAccepted(result, tuple(changed), _diff(tool, original, result, changed))


def _same(a: Any, b: Any) -> bool:
    # As JSON: 1 and true are different arguments, though Python says they are equal.
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _holds_marker(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_marker(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_marker(v) for v in value)
    return value == REDACTED


def _diff(tool: ToolSpec, before: Mapping[str, Any], after: Mapping[str, Any], changed: Iterable[str]) -> str:
    """`amount: 2500 → 250; note: removed; priority: set to "high"`, secrets hidden."""
    old, new = tool.shown_arguments(dict(before)), tool.shown_arguments(dict(after))
    lines = []
    for name in changed:
        if name not in new:
            lines.append(f"{name}: removed")
        elif name not in old:
            lines.append(f"{name}: set to {_shown(new[name])}")
        elif _same(old[name], new[name]):
            lines.append(f"{name}: changed (hidden)")
        else:
            lines.append(f"{name}: {_shown(old[name])} → {_shown(new[name])}")
    return "; ".join(lines)


def _shown(value: Any) -> str:
    return _short(json.dumps(value, sort_keys=True))


# --- approve and remember ------------------------------------------------------------------

RememberRefusal = Literal["tool_not_rememberable", "other_session", "other_tool", "other_target", "bad_duration"]
# The longest a grant may last (a year): longer is refused, and a time past the
# calendar's end would fail the transition instead of being answered.
MAX_GRANT_HOURS = 24 * 366


@dataclass(frozen=True)
class Grant:
    """A remembered approval: calls of `tool` (at `tool_version`) in `session_id`, on
    `target` (None: any target), run without a card until `expires_at` (None: for the
    rest of the session) or its revocation. `approvals_required` is what the request
    it was given on required: it covers no call that requires more."""

    grant_id: str
    granted_by: str
    session_id: str
    tool: str
    tool_version: str
    target: str | None
    granted_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    approvals_required: int = 1


@dataclass(frozen=True)
class CardOnRecord:
    """The request a person approves and asks to remember, as the ledger holds it."""

    session_id: str
    tool: str
    target: str


@dataclass(frozen=True)
class RememberAsked:
    """What the person asked to remember: `target` None for any target of the tool,
    `hours` None for the rest of the session."""

    session_id: str
    tool: str
    target: str | None
    hours: float | None = None


def may_remember(tool: ToolSpec, card: CardOnRecord, asked: RememberAsked) -> RememberRefusal | None:
    """None if the grant asked for may be given with this approval, else why not: the
    tool is not rememberable, or the grant is wider than the card (another session,
    tool or target; a grant for any target of the card's tool is the one widening a
    person may choose), or its duration is not a positive number of hours up to a year
    (`MAX_GRANT_HOURS`)."""
    if not tool.may_be_remembered:
        return "tool_not_rememberable"
    if asked.session_id != card.session_id:
        return "other_session"
    if asked.tool != card.tool:
        return "other_tool"
    if asked.target is not None and asked.target != card.target:
        return "other_target"
    if asked.hours is not None and not (math.isfinite(asked.hours) and 0 < asked.hours <= MAX_GRANT_HOURS):
        return "bad_duration"
    return None


def grant_expiry(now: datetime, hours: float | None) -> datetime | None:
    return None if hours is None else now + timedelta(hours=hours)


def grant_covering(
    grants: Iterable[Grant], session_id: str, tool: ToolSpec, target: str, now: datetime, *, approvals_required: int
) -> Grant | None:
    """The grant that authorizes this call without a card, or None. It must be for this
    session, this tool at its current version, this target or any; given by now, not
    expired nor revoked by now (a revocation counts for every call decided after it);
    given on a request that required at least the `approvals_required` of this call's
    own verdict; and the tool must still be rememberable. Of several, the one for this
    very target, then the one lasting longest, then the oldest."""
    if not tool.may_be_remembered:
        return None
    covering = [
        grant
        for grant in grants
        if grant.session_id == session_id
        and grant.tool == tool.name
        and grant.tool_version == tool.version
        and grant.target in (None, target)
        and grant.granted_at <= now
        and (grant.expires_at is None or now < grant.expires_at)
        and (grant.revoked_at is None or now < grant.revoked_at)
        and approvals_required <= grant.approvals_required
    ]
    if not covering:
        return None
    return min(
        covering,
        key=lambda g: (
            g.target is None,
            -g.expires_at.timestamp() if g.expires_at else -math.inf,
            g.granted_at,
            g.grant_id,
        ),
    )
