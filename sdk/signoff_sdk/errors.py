"""How a filed call can end other than with its output, as exceptions an agent catches."""

from __future__ import annotations

from typing import Any


class SignoffError(Exception):
    """Anything the SDK raises."""


class CallClosed(SignoffError):
    """The call closed without an output; `kind` says how (`closure.kind`), `reason` why."""

    def __init__(self, kind: str, reason: str = "", reason_code: str | None = None, call: Any = None) -> None:
        super().__init__(f"{kind}: {reason}" if reason else kind)
        self.kind, self.reason, self.reason_code, self.call = kind, reason, reason_code, call


class Denied(CallClosed):
    """A person denied the call; `reason` is theirs."""


class Answered(CallClosed):
    """A person answered in the tool's place: it did not run, and `reason` is their answer
    (the tool's result for the model)."""


class Expired(CallClosed):
    """Nobody decided in time."""


class Cancelled(CallClosed):
    """The call was cancelled before it ran."""


class OutcomeUnknown(CallClosed):
    """It may or may not have run (a claim whose lease ended with no result, an executor
    lost mid-call): a person was asked to find out. Never retried by itself."""


class ToolFailed(CallClosed):
    """The tool ran and failed (`error`)."""


class Refused(SignoffError):
    """The gateway refused the request: a problem document (`kind`, `status`, `detail`)."""

    def __init__(self, status: int, kind: str, detail: str = "", document: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {kind}: {detail}" if detail else f"{status} {kind}")
        self.status, self.kind, self.detail, self.document = status, kind, detail, document or {}


class Unreachable(SignoffError):
    """The gateway did not answer within the caller's deadline (retried with backoff until then)."""


class BadSignature(SignoffError):
    """A verdict that is not the ledger's, or that does not say what the call says: nothing is run."""


class NoRunner(SignoffError):
    """An approved `runs: caller` call, and `call()` was given nothing to run it with (`run=`)."""


CLOSURES: dict[str, type[CallClosed]] = {
    "denied": Denied,
    "answered": Answered,
    "expired": Expired,
    "cancelled": Cancelled,
    "outcome_unknown": OutcomeUnknown,
    "error": ToolFailed,
}
