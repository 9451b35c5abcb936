"""What a secret is, and how it is hidden wherever a value leaves the executor.

One module, used on every path: the card (`ToolSpec.card`), the transcript the
ledger stores and sends the model, closures and their events, the executor's
errors, dead letters, `signoff session show` and every service's log lines
(docs/design.md, "Trust boundaries", "Secrets").

A value is hidden when:

- its tool's schema declares it secret (`format: password`, `writeOnly: true` or
  `x-signoff-secret: true`), wherever in the arguments it sits;
- its field's whole name is a credential's name (`password`, `api_key`,
  `access_token`, `Authorization`): the last word of the name, not a substring,
  so `bypass_review`, `max_tokens` and `passengers` are shown;
- it has the shape of a credential: a bearer or basic token, an `sk-…` key, an
  AWS access key, a JWT, a PEM block, the user-info or a query value of a URL;
- it is a value the process knows to be secret: a `${env:…}` value it resolved
  (`remember`), or a declared secret argument of the call at hand.

Pure apart from `remember`, the process's list of resolved secrets, which the
log formatter and the dead-letter path read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "***redacted***"

# The last word of a field's name that makes it a credential (after splitting
# snake_case, kebab-case and camelCase): `db_password`, `access_token`, `clientSecret`.
_CREDENTIAL_WORDS = frozenset(
    {"password", "passwd", "passphrase", "pwd", "secret", "token", "credential", "credentials", "cookie"}
)
# Whole names (words joined, lower case) that are credentials though their last word is not.
_CREDENTIAL_NAMES = frozenset(
    {
        "apikey",
        "authorization",
        "authorisation",
        "privatekey",
        "secretkey",
        "secretaccesskey",
        "accesskey",
        "signingkey",
        "clientsecret",
        "setcookie",
        "xapikey",
    }
)
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")

# Credential shapes, found anywhere in a text.
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|\Z)", re.S)
_AUTH_SCHEME = re.compile(
    r"\b(bearer)(\s+)[A-Za-z0-9._~+/=-]{6,}|\b(basic)(\s+)(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{8,}={0,2}",
    re.IGNORECASE,
)
_API_KEYS = re.compile(
    r"\b(?:sk|rk|pk)[-_](?:live[-_]|test[-_]|proj[-_]|ant[-_])?[A-Za-z0-9_-]{8,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}|\bxox[abposr]-[A-Za-z0-9-]{10,}"
)
_AWS_KEY = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA)[A-Z0-9]{16}\b")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")
_USER_INFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@]*@")
_QUERY_VALUE = re.compile(r"([?&][^=&#]*)=([^&#]*)")
_SHAPES = (_PEM, _URL, _AUTH_SCHEME, _API_KEYS, _AWS_KEY, _JWT)
# Most lines hold no credential shape, and one scan for what every shape must contain
# says so at a third of the cost of the six substitutions: each shape above needs one of
# these (`-----BEGIN `, `://`, bearer or basic in any case, a key's prefix without its
# word boundary, an AWS key's prefix, a JWT's `eyJ`). A text none of these is in passes
# through every substitution unchanged, so skipping them hides nothing less.
# tests/unit/test_redaction.py checks that wherever a shape matches, this does.
_SHAPE_CLUES = re.compile(
    r"-----BEGIN |://|(?i:bearer|basic)|[spr]k[-_]|gh[pousr]_|github_pat_|xox[abposr]-|A(?:KIA|SIA|IDA|ROA)|eyJ"
)
# Shorter than this, a known value is too likely to be an ordinary word to scrub.
_MIN_KNOWN = 4
# The shortest part of a key `hide_pieces` hides wherever it appears.
PIECE = 8

# A parked body's fields kept as they are: ids Signoff mints or checks, never a secret.
_ENVELOPE_IDS = frozenset(
    {"type", "message_id", "session_id", "causation_id", "call_id", "step_id", "turn_id", "request_id"}
)

_known: set[str] = set()


def remember(*values: str) -> None:
    """Values this process resolved from its environment as secrets: hidden in every
    text it logs or parks from now on."""
    _known.update(v for v in values if v and len(v) >= _MIN_KNOWN)


def known() -> frozenset[str]:
    return frozenset(_known)


def redact_then_cut(text: str, limit: int, secrets: Iterable[str] = ()) -> str:
    """The text redacted, then cut to `limit` characters: in that order, since a secret
    cut in two is no longer found, and its first characters would go out."""
    return redact_text(text, secrets)[:limit]


def hide_pieces(text: str, secrets: Iterable[str], size: int = PIECE) -> str:
    """The text without any run of `size` or more characters that also occurs in one of
    `secrets`: for a credential a server may quote in part (a provider's error that
    echoes the first characters of a rejected key)."""
    pieces = {s[n : n + size] for s in secrets if s and len(s) >= size for n in range(len(s) - size + 1)}
    if not pieces or len(text) < size:
        return text
    covered = [False] * len(text)
    for n in range(len(text) - size + 1):
        if text[n : n + size] in pieces:
            covered[n : n + size] = [True] * size
    if not any(covered):
        return text
    shown: list[str] = []
    for n, char in enumerate(text):
        if not covered[n]:
            shown.append(char)
        elif n == 0 or not covered[n - 1]:
            shown.append(REDACTED)
    return "".join(shown)


def is_credential_name(name: str) -> bool:
    """Whether a field's whole name says it holds a credential (never a substring)."""
    words = [w.lower() for w in _WORD.findall(name)]
    if not words:
        return False
    return words[-1] in _CREDENTIAL_WORDS or "".join(words) in _CREDENTIAL_NAMES


def declares_secret(schema: Any) -> bool:
    """A schema that marks its value secret: `format: password`, `writeOnly: true` or
    `x-signoff-secret: true`."""
    return isinstance(schema, dict) and (
        schema.get("format") == "password" or schema.get("writeOnly") is True or schema.get("x-signoff-secret") is True
    )


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """The text with every known secret and every credential shape replaced."""
    for value in sorted({*_known, *(s for s in secrets if s and len(s) >= _MIN_KNOWN)}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    if _SHAPE_CLUES.search(text) is None:
        return text
    text = _PEM.sub(REDACTED, text)
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m.group(1) or m.group(3)}{m.group(2) or m.group(4)}{REDACTED}", text)
    text = _API_KEYS.sub(REDACTED, text)
    text = _AWS_KEY.sub(REDACTED, text)
    return _JWT.sub(REDACTED, text)


def redact_url(url: str) -> str:
    """A URL without its user-info and with its query values hidden (names kept)."""
    url = _USER_INFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", url)
    base, mark, rest = url.partition("?")
    if not mark:
        return url
    query, hash_mark, fragment = rest.partition("#")
    query = _QUERY_VALUE.sub(lambda m: f"{m.group(1)}={REDACTED}", "?" + query)[1:]
    return f"{base}?{query}{hash_mark}{fragment}"


def redact_value(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A copy of a JSON value with credential-named fields and credential-shaped
    strings hidden (no schema: for values whose tool is not known here)."""
    return _redact(value, None, tuple(secrets), [], ())


def redact_arguments(arguments: dict[str, Any], schema: Any, secrets: Iterable[str] = ()) -> tuple[Any, list[str]]:
    """A copy of a call's arguments with its secrets hidden, and the paths of the
    fields hidden in it (`api_token`, `auth/password`, `accounts/0/key`)."""
    hidden: list[str] = []
    return _redact(arguments, schema, tuple(secrets), hidden, ()), hidden


def secret_values(arguments: Any, schema: Any) -> list[str]:
    """The text of every argument hidden on the card: what the call's errors and
    output must never repeat."""
    found: list[str] = []

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, list):
            for v in value:
                collect(v)
        elif value is not None and not isinstance(value, bool):
            found.append(str(value))

    def walk(value: Any, sub: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                child = _property(sub, str(k))
                if declares_secret(child) or is_credential_name(str(k)):
                    collect(v)
                else:
                    walk(v, child)
        elif isinstance(value, list):
            for v in value:
                walk(v, _items(sub))

    walk(arguments, schema)
    return found


def redact_message_body(body: bytes, secrets: Iterable[str] = ()) -> bytes:
    """A parked message's body as the dead-letter queue may keep it: every call's
    arguments hidden (the ledger holds them), credential shapes and known secrets
    hidden everywhere else. A body that is not JSON is kept as redacted text."""
    secrets = tuple(secrets)
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return redact_text(body.decode("utf-8", "replace"), secrets).encode()
    try:
        shown = _hide_arguments(redact_value(value, secrets))
    except RecursionError:
        return b'"(too deep to redact)"'
    if isinstance(value, dict) and isinstance(shown, dict):
        # The envelope's ids as they were: the ledger finds the turn a parked message stalled by them.
        shown.update({k: v for k, v in value.items() if k in _ENVELOPE_IDS and isinstance(v, str)})
    return json.dumps(shown).encode()


def _hide_arguments(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: ({n: REDACTED for n in v} if k == "arguments" and isinstance(v, dict) else _hide_arguments(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_hide_arguments(v) for v in value]
    return value


def _redact(value: Any, schema: Any, secrets: tuple[str, ...], hidden: list[str], path: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        copy = {}
        for key, item in value.items():
            child = _property(schema, str(key))
            where = (*path, str(key))
            # An empty secret field hides nothing; "hidden" there would only corrupt the
            # value (a parked response with no token could no longer be replayed).
            if item is not None and (declares_secret(child) or is_credential_name(str(key))):
                copy[key] = REDACTED
                hidden.append("/".join(where))
            else:
                copy[key] = _redact(item, child, secrets, hidden, where)
        return copy
    if isinstance(value, list):
        return [_redact(item, _items(schema), secrets, hidden, (*path, str(n))) for n, item in enumerate(value)]
    if isinstance(value, str):
        shown = redact_text(value, secrets)
        if shown != value and path:
            hidden.append("/".join(path))
        return shown
    return value


def _property(schema: Any, name: str) -> Any:
    if not isinstance(schema, dict):
        return None
    properties = schema.get("properties")
    if isinstance(properties, dict) and name in properties:
        return properties[name]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _items(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return None
    items = schema.get("items")
    return items if isinstance(items, dict) else None
