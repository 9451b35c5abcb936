"""Signoff's slim client for agents (`pip install ./sdk`: httpx and pydantic only):
file a tool call for a person's sign-off, wait for the decision, and get the output,
or run the approved call yourself exactly once. See docs/bring-your-own-agent.md."""

from .client import AsyncClient, Client
from .errors import (
    Answered,
    BadSignature,
    CallClosed,
    Cancelled,
    Denied,
    Expired,
    NoRunner,
    OutcomeUnknown,
    Refused,
    SignoffError,
    ToolFailed,
    Unreachable,
)
from .models import ClaimShown, Closed, FiledShown, Verdict
from .verdicts import verified

__all__ = [
    "Answered",
    "AsyncClient",
    "BadSignature",
    "CallClosed",
    "Cancelled",
    "ClaimShown",
    "Client",
    "Closed",
    "Denied",
    "Expired",
    "FiledShown",
    "NoRunner",
    "OutcomeUnknown",
    "Refused",
    "SignoffError",
    "ToolFailed",
    "Unreachable",
    "Verdict",
    "verified",
]
