"""The tokens file (`tokens.yaml`, beside the users file, mode 0600): each program's name,
its token's SHA-256 (never the token) and its scopes. programs.py makes and checks tokens;
users.register_channel reads the names to register `bot:NAME` for the gateway's channel."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from shared import keyring

# A program's principal: never a person (people's names hold no `:`), never `token:` (the ledger's).
PREFIX = "bot:"


def principal_of(name: str) -> str:
    return PREFIX + name


def lookup_hash(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Program:
    name: str
    token_hash: str
    scopes: frozenset[str]
    created_at: float = 0.0
    # When it stops working (`signoff token create --expires`); None: until revoked.
    expires_at: float | None = None

    @property
    def principal(self) -> str:
        return principal_of(self.name)


@dataclass
class Tokens:
    path: Path
    programs: dict[str, Program] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Tokens:
        data = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
        programs = {
            name: Program(
                name,
                entry["hash"],
                frozenset(entry.get("scopes") or ()),
                float(entry.get("created_at", 0)),
                None if entry.get("expires_at") is None else float(entry["expires_at"]),
            )
            for name, entry in (data.get("tokens") or {}).items()
        }
        return cls(path, programs)

    def save(self) -> None:
        data = {
            "tokens": {
                p.name: {"hash": p.token_hash, "scopes": sorted(p.scopes), "created_at": p.created_at}
                | ({} if p.expires_at is None else {"expires_at": p.expires_at})
                for p in self.programs.values()
            }
        }
        keyring.replace_private(self.path, yaml.safe_dump(data, sort_keys=True).encode())

    def by_hash(self) -> dict[str, Program]:
        return {p.token_hash: p for p in self.programs.values()}


def tokens_path(users_path: Path) -> Path:
    """Beside the users file: wherever that is shared (a volume, a Secret), so is this."""
    return users_path.with_name("tokens.yaml")


def principals(users_path: Path) -> list[str]:
    return sorted(p.principal for p in Tokens.load(tokens_path(users_path)).programs.values())
