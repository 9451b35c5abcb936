"""Signed lifecycle hooks, both sides: how the publisher signs a delivery (`sign`)
and how a receiver checks one (`verify`).

A delivery is a POST of an event's JSON with the headers `Signoff-Timestamp`
(unix seconds) and `Signoff-Signature: sha256=<hex HMAC-SHA256 of
"<timestamp>.<body>" with the hook's secret>`. A receiver verifies before it
trusts anything in the body:

    from signoff.hooks import InvalidSignature, verify

    try:
        verify(secret, request.body, request.headers)
    except InvalidSignature as refused:
        return 401, str(refused)

The comparison takes constant time, and a timestamp outside the window (five
minutes either way by default) is refused, so a captured delivery cannot be
replayed later. Standard library only: a receiver installs nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

SIGNATURE_HEADER = "Signoff-Signature"
TIMESTAMP_HEADER = "Signoff-Timestamp"
# A hook's secret is at least this long (bytes): the publisher refuses to start otherwise.
MIN_SECRET_BYTES = 32
DEFAULT_TOLERANCE_SECONDS = 300.0


class InvalidSignature(Exception):
    """The delivery is not signed with the secret, or not within the window."""


def sign(secret: str | bytes, timestamp: str, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def verify(
    secret: str | bytes,
    body: bytes,
    headers: Mapping[str, str],
    *,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> None:
    """Return if the delivery was signed with `secret` within `tolerance_seconds` of
    `now`; raise InvalidSignature otherwise. `body` is the raw request body, exactly
    as received (not re-serialized JSON); header names are matched case-insensitively."""
    lowered = {k.lower(): v for k, v in headers.items()}
    timestamp = lowered.get(TIMESTAMP_HEADER.lower())
    signature = lowered.get(SIGNATURE_HEADER.lower())
    if not timestamp or not signature:
        raise InvalidSignature(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}")
    try:
        issued = int(timestamp)
    except ValueError:
        raise InvalidSignature(f"{TIMESTAMP_HEADER} is not unix seconds") from None
    current = time.time() if now is None else now
    if abs(current - issued) > tolerance_seconds:
        raise InvalidSignature(f"{TIMESTAMP_HEADER} is outside the {tolerance_seconds:g} s window")
    if not hmac.compare_digest(sign(secret, timestamp, body).encode(), signature.encode()):
        raise InvalidSignature("the signature does not match the body and the secret")


def is_valid(secret: str | bytes, body: bytes, headers: Mapping[str, str], **window: float) -> bool:
    try:
        verify(secret, body, headers, **window)  # type: ignore[arg-type]
    except InvalidSignature:
        return False
    return True
