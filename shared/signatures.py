"""Who may say what, in bytes: Ed25519 signatures over canonical JSON (RFC 8785),
and the ledger's keyed digest of a request's arguments.

Three uses (docs/design.md, "Trust boundaries"):
- a channel adapter signs each response with its own key; the ledger holds only
  public keys, so not even the ledger can forge an approval;
- the ledger signs each `tool.execute` (an authorization); the executor holds
  only the ledger's public key and runs nothing without a valid one;
- the ledger alone computes a request's digest (HMAC under its own key over the
  request id, the tool and the arguments): cards and responses carry it, and it
  reveals nothing about the redacted values it covers.

Pure: keys come in as objects, nothing is read or written here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from datetime import datetime
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

DIGEST_PREFIX = "hmac-sha256:"


class Unverified(Exception):
    """A signature or token that does not hold; `code` says why, machine-readably."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def canonical(value: Any) -> bytes:
    """RFC 8785 canonical JSON: the same bytes for the same value, wherever it is made.
    For what seals and the audit chain hold (strings, ASCII keys, integers within
    JavaScript's safe range, booleans, null), RFC 8785's bytes are exactly the standard
    library's sorted, compact, non-ASCII-kept JSON, which costs a fifth of `rfc8785`'s
    (pure Python): taken then. Anything else (a float, a larger integer, a key beyond
    ASCII, whose RFC 8785 order is by UTF-16 code units) goes through `rfc8785`."""
    simple = [True]
    plain = _plain(value, simple)
    if simple[0]:
        try:
            return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError):  # a lone surrogate, a type JSON has not: rfc8785 says why
            pass
    return rfc8785.dumps(plain)


# JavaScript's safe integers: RFC 8785 writes numbers as ECMAScript does.
_SAFE_INTEGER = 2**53 - 1


def _plain(value: Any, simple: list[bool]) -> Any:
    """`value` as JSON values (datetimes as ISO text, keys as text); `simple[0]` set False
    for anything the standard library would not write as RFC 8785 does."""
    if isinstance(value, str) or value is None or value is True or value is False:
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        plain = {}
        for k, v in value.items():
            key = str(k)
            if not key.isascii():
                simple[0] = False
            plain[key] = _plain(v, simple)
        return plain
    if isinstance(value, list | tuple):
        return [_plain(v, simple) for v in value]
    if type(value) is not int or not -_SAFE_INTEGER <= value <= _SAFE_INTEGER:
        simple[0] = False
    return value


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# --- keys ---------------------------------------------------------------------------


def new_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_key_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def load_private_key(pem: bytes) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("not an Ed25519 private key")
    return key


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return _b64(public.public_bytes(Encoding.Raw, PublicFormat.Raw))


def load_public_key(text: str) -> Ed25519PublicKey:
    try:
        return Ed25519PublicKey.from_public_bytes(_unb64(text.strip()))
    except (ValueError, binascii.Error) as error:
        raise ValueError(f"not an Ed25519 public key ({error})") from None


# --- signatures -------------------------------------------------------------------


def sign(key: Ed25519PrivateKey, payload: dict[str, Any]) -> str:
    return _b64(key.sign(canonical(payload)))


def verify(key: Ed25519PublicKey, payload: dict[str, Any], signature: str) -> bool:
    try:
        key.verify(_unb64(signature), canonical(payload))
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


def seal(key: Ed25519PrivateKey, claims: dict[str, Any]) -> str:
    """A self-contained token: the claims and the signature over them."""
    body = canonical(claims)
    return f"{_b64(body)}.{_b64(key.sign(body))}"


def unseal(key: Ed25519PublicKey, token: str) -> dict[str, Any]:
    """The claims of a token this key sealed; Unverified otherwise."""
    try:
        body_text, signature = token.split(".")
        body = _unb64(body_text)
        key.verify(_unb64(signature), body)
        claims = json.loads(body)
    except (ValueError, binascii.Error, InvalidSignature):
        raise Unverified("bad_signature", "the authorization is not signed by the ledger") from None
    if not isinstance(claims, dict):
        raise Unverified("bad_signature", "the authorization holds no claims")
    return claims


# --- the ledger's digest of a request ------------------------------------------------


def request_digest(key: bytes, *, request_id: str, tool: str, version: str, arguments: dict[str, Any]) -> str:
    """What a response must echo to approve exactly this request: a keyed hash over
    its id, its tool and the canonical arguments (invariant 6). Without the ledger's
    key nobody can compute it, so it reveals nothing about redacted values, and it
    names one request only, so an approval cannot be replayed onto another."""
    message = canonical({"request_id": request_id, "tool": tool, "version": version, "arguments": arguments})
    return DIGEST_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


def arguments_fingerprint(arguments: dict[str, Any]) -> str:
    """A plain hash of the canonical arguments, inside the ledger's signed
    authorization only: it binds the arguments a `tool.execute` carries."""
    return "sha256:" + hashlib.sha256(canonical(arguments)).hexdigest()
