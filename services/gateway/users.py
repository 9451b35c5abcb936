"""The gateway's people: a users file (YAML, mode 0600) of names, argon2id password
hashes, groups and whether each is an operator, managed by `signoff user add|remove|list`.

The gateway signs responses as whoever logged in, so its channel entry in
`channels.yaml` lists exactly these names as the principals it may assert
(`register_channel`, run by every change and by `signoff setup`): a stolen gateway
key still cannot speak for anyone who is not one of its users, since the ledger
refuses it as `wrong_principal`.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from shared import keyring

from .tokenstore import principals as program_principals

CHANNEL = "gateway"
# A person's name as the ledger records it: no pattern characters (the channel entry's
# principals are patterns), no `token:` (that names no person), nothing a log line bends.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
HASHER = PasswordHasher()  # argon2id, the library's defaults (RFC 9106's second choice)
# Verified against when the name is unknown, so that an unknown name costs as long as a wrong password.
_DUMMY = HASHER.hash(secrets.token_urlsafe(16))


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str
    groups: tuple[str, ...] = ()
    operator: bool = False
    # Which credential this is: new at every `signoff user add` (a reset, a re-add), and
    # bound into each session cookie, so a session outlives neither (auth.Logins.holds).
    credential: str = ""


@dataclass
class Users:
    path: Path
    users: dict[str, User] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Users:
        data = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
        users = {
            name: User(
                name,
                entry["password"],
                tuple(entry.get("groups") or ()),
                bool(entry.get("operator", False)),
                str(entry.get("credential") or legacy_credential(name, entry["password"])),
            )
            for name, entry in (data.get("users") or {}).items()
        }
        return cls(path, users)

    def save(self) -> None:
        data = {
            "users": {
                u.name: {
                    "password": u.password_hash,
                    "groups": list(u.groups),
                    "operator": u.operator,
                    "credential": u.credential,
                }
                for u in self.users.values()
            }
        }
        keyring.replace_private(self.path, yaml.safe_dump(data, sort_keys=True).encode())

    def verify(self, name: str, password: str) -> User | None:
        """The user, if the password is theirs; None otherwise (the same work either way)."""
        user = self.users.get(name)
        if user is not None and not user.password_hash:
            user = None  # logs in only through OpenID Connect (`signoff user add --oidc`)
        try:
            HASHER.verify(user.password_hash if user else _DUMMY, password)
        except (VerificationError, InvalidHashError):
            return None
        return user


def legacy_credential(name: str, password_hash: str) -> str:
    """The credential of an entry written before credentials were: its password hash's
    digest (a reset salts a new hash, so it changes too)."""
    return "h" + hashlib.sha256(f"{name}\0{password_hash}".encode()).hexdigest()[:24]


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise SystemExit(f"signoff user: {name!r} is no valid name (letters, digits, . _ @ -; at most 64)")
    return name


def register_channel(keys_dir: Path, users_path: Path) -> list[str]:
    """The gateway's channel registered (its key made if missing) for exactly its users
    (people with a password or an OpenID Connect login) and its programs' tokens (`bot:NAME`)."""
    principals = {CHANNEL: sorted(Users.load(users_path).users)}
    principals[CHANNEL] += program_principals(users_path)
    return keyring.create(keys_dir, principals)


def make_session_key(keys_dir: Path) -> list[str]:
    """The key that signs the gateway's session cookies and CSRF tokens (shared by its replicas)."""
    path = keys_dir / "gateway" / "session.key"
    if path.exists():
        return []
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    return [f"made the gateway's session key ({path})"]


def add(
    keys_dir: Path, users_path: Path, name: str, password: str | None, groups: list[str], operator: bool
) -> list[str]:
    """Add or update a user. `password` None: one who logs in only through OpenID Connect
    (its principal claim must be this name); the password login refuses them."""
    check_name(name)
    if password is not None and len(password) < 8:
        raise SystemExit("signoff user add: a password needs at least 8 characters")
    users = Users.load(users_path)
    made = name not in users.users
    hashed = HASHER.hash(password) if password is not None else ""
    # A new credential every time: the sessions of the old one (a reset) or of a removed
    # user of the same name (a re-add) end on every replica.
    credential = secrets.token_urlsafe(12)
    users.users[name] = User(name, hashed, tuple(dict.fromkeys(groups)), operator, credential)
    users.save()
    done = [f"user {name} " + ("added" if made else "updated") + (" (operator)" if operator else "")]
    return done + make_session_key(keys_dir) + register_channel(keys_dir, users_path)


def remove(keys_dir: Path, users_path: Path, name: str) -> list[str]:
    users = Users.load(users_path)
    if users.users.pop(name, None) is None:
        raise SystemExit(f"signoff user remove: no user {name!r}")
    users.save()
    return [f"user {name} removed (their sessions and event streams end)", *register_channel(keys_dir, users_path)]


def listing(users_path: Path) -> list[str]:
    return [
        f"{u.name}"
        + ("" if u.password_hash else "  (OpenID Connect)")
        + (f"  groups: {', '.join(u.groups)}" if u.groups else "")
        + ("  operator" if u.operator else "")
        for u in Users.load(users_path).users.values()
    ]


class LiveUsers:
    """The users file as it is now (read again when it changes): a removed user's, or
    a reset credential's, session ends at its next request and its event streams within
    a second (auth.OpenStreams), on every replica."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._users = Users(path)

    def current(self) -> Users:
        try:
            stat = self.path.stat()
            stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        except OSError:
            stamp = None
        if stamp != self._stamp:
            self._users = Users.load(self.path) if stamp else Users(self.path)
            self._stamp = stamp
        return self._users
