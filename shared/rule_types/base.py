"""What every rule over a call's arguments shares: its cases, their CEL conditions, and
the interface a rule type implements (`RuleType`). The types themselves are the other
modules of this package, registered in its `RULE_TYPES`."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import celpy
import lark
from pydantic import BaseModel, ConfigDict, Field

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


# Renders a case's `reason` template over the arguments as the card shows them.
Render = Callable[[str], str]


class RuleType:
    """A field of a tool that may be written as a rule (a list of cases) instead of a
    plain value. The catalogue keeps the rule in the tool's `rules`, under `field`, and
    sets the plain field to `standing_value` (what the ledger asks until it evaluates
    the rule, the safe side); the ledger's verdict asks `plain` or `decided` for the
    field's value for one call and the words that say why."""

    # The tool's field (`approval`), and the model of one case of its rule.
    field: ClassVar[str]
    case: ClassVar[type[RuleCase]]

    def standing_value(self, cases: Sequence[Any]) -> Any:
        raise NotImplementedError

    def plain(self, label: str, value: Any) -> tuple[Any, str]:
        """The plain field's value for every call, and why in words."""
        raise NotImplementedError

    def decided(self, case: Any, render: Render) -> tuple[Any, str]:
        """The deciding case's value, and why in words."""
        raise NotImplementedError
