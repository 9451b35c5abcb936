"""`approvals_required` as a rule: how many distinct people must approve, by the
call's arguments (`[{when: "args.amount > 1000", then: 2}, {then: 1}]`)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from .base import Render, RuleCase, RuleType

_NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def approvers_in_words(count: int) -> str:
    number = _NUMBER_WORDS[count] if count < len(_NUMBER_WORDS) else str(count)
    return f"{number} approver{'' if count == 1 else 's'}"


class ApprovalsCase(RuleCase):
    then: int = Field(ge=1)


class ApprovalsRule(RuleType):
    field = "approvals_required"
    case = ApprovalsCase

    def standing_value(self, cases: Sequence[ApprovalsCase]) -> int:
        # The most any case asks: what the approvers must be enough for, what a call
        # gets when its rule cannot be evaluated, and what the ledger asks until it
        # evaluates the rule.
        return max(case.then for case in cases)

    def plain(self, label: str, value: int) -> tuple[int, str]:
        return value, approvers_in_words(value)

    def decided(self, case: ApprovalsCase, render: Render) -> tuple[int, str]:
        words = approvers_in_words(case.then)
        if case.reason is not None:
            return case.then, render(case.reason)
        return case.then, words if case.when is None else f"{case.when}: {words}"


RULE = ApprovalsRule()
