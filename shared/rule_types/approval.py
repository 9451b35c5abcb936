"""`approval` as a rule: whether a call asks a person at all, by its arguments
(`[{when: "args.amount < 10", then: never}, {then: always}]`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from .base import Render, RuleCase, RuleType


class ApprovalCase(RuleCase):
    then: Literal["always", "never"]


class ApprovalRule(RuleType):
    field = "approval"
    case = ApprovalCase

    def standing_value(self, cases: Sequence[ApprovalCase]) -> str:
        # Until the ledger evaluates the rule, a tool with a rule asks every time.
        return "always"

    def plain(self, label: str, value: str) -> tuple[bool, str]:
        return value == "always", f"{label} {'always' if value == 'always' else 'never'} asks"

    def decided(self, case: ApprovalCase, render: Render) -> tuple[bool, str]:
        if case.reason is not None:
            return case.then == "always", render(case.reason)
        return case.then == "always", case.when if case.when is not None else "no condition held"


RULE = ApprovalRule()
