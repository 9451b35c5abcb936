"""The fields of a tool that may be written as rules over the call's arguments, one
module each, registered here. A new rule type is a new module with a `RuleType` and
its case model, one line in `RULE_TYPES`, and its tests; the catalogue checks and keeps
every registered rule alike (shared/catalogue.py) and the ledger evaluates them alike
(services/approval_ledger/decision_rules.py)."""

from __future__ import annotations

from . import approval, approvals
from .approval import ApprovalCase
from .approvals import ApprovalsCase, approvers_in_words
from .base import ARGUMENTS, RULE_DEPTH, RuleCase, RuleType, compiled_condition

# In the order a tool's rules are checked and their refusals named.
RULE_TYPES: dict[str, RuleType] = {rule.field: rule for rule in (approval.RULE, approvals.RULE)}

__all__ = [
    "ARGUMENTS",
    "RULE_DEPTH",
    "RULE_TYPES",
    "ApprovalCase",
    "ApprovalsCase",
    "RuleCase",
    "RuleType",
    "approvers_in_words",
    "compiled_condition",
]
