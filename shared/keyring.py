"""The keys of one deployment, as files in its keys folder (`SIGNOFF_KEYS_DIR`,
by default `<data dir>/keys`), made once by `signoff setup`.

| file | held by | what |
| --- | --- | --- |
| `ledger.key` | approval-ledger | Ed25519 private key: signs every `tool.execute` |
| `ledger.pub` | tool-executor | its public half: the executor verifies with it |
| `digest.key` | approval-ledger | HMAC key of request digests |
| `channels.yaml` | approval-ledger | each channel's public key and the principals it may assert |
| `channels/<name>.key` | that channel (the CLI: `cli`) | the channel's Ed25519 private key |
| `rabbitmq/<name>.password` | that service or channel (`channel.<name>`) | its broker password |
| `postgres/<name>.password` | that service (PostgreSQL only) | its database role's password |
| `redis/<name>.password` | that service (the executor alone uses Redis) | its Redis ACL user's password |

A container is given only the files its service holds (`HELD_BY`); so is each
service under `signoff up` run as root (services/operations/service_users.py). Nothing here is a secret
in a log: only public keys are ever printed.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import pwd
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shared.signatures import (
    load_private_key,
    load_public_key,
    new_private_key,
    private_key_bytes,
    public_key_text,
)

LEDGER_KEY = "ledger.key"
LEDGER_PUBLIC_KEY = "ledger.pub"
DIGEST_KEY = "digest.key"
CHANNELS = "channels.yaml"

# The files of the keys folder each service reads, and no other: what a container
# mounts, a Kubernetes Secret holds, and `signoff up` (as root) copies for it.
# Passwords of a store not in use (PostgreSQL on SQLite) are simply absent.
HELD_BY: dict[str, tuple[str, ...]] = {
    "approval-ledger": (
        LEDGER_KEY,
        DIGEST_KEY,
        CHANNELS,
        "rabbitmq/approval-ledger.password",
        "postgres/approval-ledger.password",
    ),
    "publisher": ("rabbitmq/publisher.password", "postgres/publisher.password"),
    # Its database role reads the transcript a step names (claim-check), nothing else.
    "model-step": ("rabbitmq/model-step.password", "postgres/model-step.password"),
    # The HTTP gateway (services/gateway): a channel of its own, its users and session key,
    # a read-only database role and its Redis user (login rate limits).
    "gateway": (
        "channels/gateway.key",
        # The ledger's public key, published at GET /v1/keys: callers verify its signed verdicts.
        LEDGER_PUBLIC_KEY,
        "gateway/users.yaml",
        "gateway/tokens.yaml",
        "gateway/session.key",
        "rabbitmq/channel.gateway.password",
        "postgres/gateway.password",
        "redis/gateway.password",
    ),
    "tool-executor": (
        LEDGER_PUBLIC_KEY,
        "rabbitmq/tool-executor.password",
        "postgres/tool-executor.password",
        "redis/tool-executor.password",
    ),
}


# The channel adapters Signoff builds in (`signoff channel run NAME`): each holds its channel's
# key and broker password, and reads the pending cards it catches up on as the console's
# read-only database role. `signoff setup --hand-out` gives each registered one its folder
# (`channel-<name>`), as it gives each service its own.
CHANNEL_ADAPTERS = ("slack", "email")


def adapter_files(name: str) -> tuple[str, ...]:
    return (f"channels/{name}.key", f"rabbitmq/channel.{name}.password", "postgres/console.password")


class MissingKey(SystemExit):
    def __init__(self, path: Path) -> None:
        super().__init__(f"signoff: no key at {path}; run `signoff setup` (or set SIGNOFF_KEYS_DIR)")


@dataclass(frozen=True)
class Channel:
    """A registered channel adapter: its public key and whom it may speak for."""

    name: str
    public_key: Ed25519PublicKey
    # Patterns of the principals it may assert (`*`: anyone; `signoff setup` never gives
    # the CLI's channel that: `cli_principals`).
    principals: tuple[str, ...]

    def may_assert(self, responder: str) -> bool:
        return any(fnmatch.fnmatchcase(responder, pattern) for pattern in self.principals)


# The responder of a response that carried a one-time token: `token:<its channel>`, no person.
TOKEN_RESPONDER_PREFIX = "token:"


def speaks_for(channel: Channel, principal: str) -> bool:
    """Whether a channel may name this principal: one it is registered for, and never
    a `token:` one (that names no person). The ledger's rule (`judge_speaker`, `may_name`
    in services/approval_ledger/domain.py), which the CLI checks before it sends."""
    return not principal.startswith(TOKEN_RESPONDER_PREFIX) and channel.may_assert(principal)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise MissingKey(path) from None


def ledger_private_key(keys_dir: Path) -> Ed25519PrivateKey:
    return load_private_key(_read(keys_dir / LEDGER_KEY))


def ledger_public_key(keys_dir: Path) -> Ed25519PublicKey:
    return load_public_key(_read(keys_dir / LEDGER_PUBLIC_KEY).decode())


def digest_key(keys_dir: Path) -> bytes:
    return bytes.fromhex(_read(keys_dir / DIGEST_KEY).decode().strip())


def channels(keys_dir: Path) -> dict[str, Channel]:
    data = yaml.safe_load(_read(keys_dir / CHANNELS)) or {}
    return {
        name: Channel(name, load_public_key(entry["public_key"]), tuple(entry.get("principals") or ()))
        for name, entry in (data.get("channels") or {}).items()
    }


class LiveChannels(Mapping[str, Channel]):
    """The registered channels as `channels.yaml` says now: read again whenever the file
    changes (its size, mtime or inode), so that a person added to or removed from a
    channel (`signoff user add`, which lists the gateway's users as its principals)
    counts from the next message on, without restarting the ledger. A file that cannot
    be read or parsed keeps the last good registry (and says so once)."""

    def __init__(self, keys_dir: Path) -> None:
        self.path = keys_dir / CHANNELS
        self._seen: tuple[int, int, int] | None = None
        self._channels = channels(keys_dir)
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def _current(self) -> dict[str, Channel]:
        stamp = self._stamp()
        if stamp is not None and stamp != self._seen:
            try:
                self._channels = channels(self.path.parent)
                self._seen = stamp
            except Exception as error:  # a half-written file: the last good registry stands
                logging.getLogger("signoff.keyring").warning("channels.yaml unreadable, kept the last: %r", error)
        return self._channels

    def __getitem__(self, name: str) -> Channel:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())


def registered_principals(keys_dir: Path, name: str) -> list[str] | None:
    """The principals a channel is registered for as `channels.yaml` lists them; None: not registered."""
    path = keys_dir / CHANNELS
    data = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    entry = (data.get("channels") or {}).get(name)
    return None if entry is None else list(entry.get("principals") or [])


def os_user() -> str:
    """Who runs this process, as the system knows them (not `$USER`, which anyone sets)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a container's user without a passwd entry
        return f"uid-{uid}"


def cli_principals(registered: list[str] | None, runner: str, listed: list[str]) -> list[str]:
    """Whom the CLI's channel may assert after `signoff setup`: those it was registered
    for before (setup keeps them: an operator may have added some), the OS user running
    setup, and those the operator lists (`--cli-principal`). Never anyone at all: a `*`
    from an older setup is dropped, since whoever can read the CLI's key could then
    approve as anybody."""
    kept = [p for p in registered or [] if p != "*"]
    return list(dict.fromkeys([*kept, runner, *listed]))


def channel_private_key(keys_dir: Path, name: str) -> Ed25519PrivateKey:
    return load_private_key(_read(keys_dir / "channels" / f"{name}.key"))


def hand_out(keys_dir: Path, service: str, folder: Path) -> list[Path]:
    """Copy the files `service` holds (HELD_BY) into `folder` (its container's keys
    volume, or its own folder under `signoff up`): mode 0700 folders, 0600 files,
    each replaced whole. The files written; those of a store not in use are skipped."""
    written = []
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    held = HELD_BY[service] if service in HELD_BY else adapter_files(service.removeprefix("channel-"))
    for name in held:
        source = keys_dir / name
        if not source.exists():
            continue
        target = folder / name
        replace_private(target, source.read_bytes())
        written.append(target)
    return written


def replace_private(path: Path, data: bytes) -> None:
    """Write `path` whole, readable by its owner alone (0600, in a 0700 folder): a
    reader sees the old file or the new one, never a part, and never a moment at a wider mode."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    partial.replace(path)


def _write_secret(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


def create(keys_dir: Path, channel_principals: dict[str, list[str]]) -> list[str]:
    """Make whatever keys are missing (never replacing one) and register the named
    channels; what was done, one line each."""
    done = []
    if not (keys_dir / LEDGER_KEY).exists():
        key = new_private_key()
        _write_secret(keys_dir / LEDGER_KEY, private_key_bytes(key))
        (keys_dir / LEDGER_PUBLIC_KEY).write_text(public_key_text(key) + "\n")
        done.append(f"made the ledger's signing key ({keys_dir / LEDGER_KEY}, public half {LEDGER_PUBLIC_KEY})")
    if not (keys_dir / DIGEST_KEY).exists():
        _write_secret(keys_dir / DIGEST_KEY, secrets.token_hex(32).encode())
        done.append(f"made the ledger's digest key ({keys_dir / DIGEST_KEY})")
    registry_path = keys_dir / CHANNELS
    registry = (yaml.safe_load(registry_path.read_text()) if registry_path.exists() else None) or {}
    registered = registry.setdefault("channels", {})
    for name, principals in channel_principals.items():
        private_path = keys_dir / "channels" / f"{name}.key"
        if not private_path.exists():
            key = new_private_key()
            _write_secret(private_path, private_key_bytes(key))
            done.append(f"made channel {name}'s key ({private_path})")
        public = public_key_text(channel_private_key(keys_dir, name))
        entry = {"public_key": public, "principals": principals}
        if registered.get(name) != entry:
            registered[name] = entry
            done.append(f"registered channel {name} (public key {public}, may assert {', '.join(principals)})")
    # Whole or not at all: the ledger reads it again when it changes (LiveChannels).
    partial = registry_path.with_name(registry_path.name + ".partial")
    partial.write_text(yaml.safe_dump(registry, sort_keys=True))
    partial.replace(registry_path)
    return done
