"""The gateway's entry point for the operator's tools (services/operations/): what `signoff
setup`, `signoff user`, `signoff token` and the demo do to the gateway's files, and where
it answers. The operator's tools use nothing else of the gateway, so its users file, its
tokens file and its settings stay the gateway's to shape.

Nothing here serves or connects; each call reads the gateway's settings from the
deployment's, as the gateway does at start."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from shared.settings import Settings

from . import programs, users
from .settings import GatewaySettings


def users_file(settings: Settings) -> Path:
    """The gateway's users file (its programs' tokens file lies beside it)."""
    return GatewaySettings(**settings.model_dump()).users_path


def url(settings: Settings) -> str:
    """Where a person on this machine reaches the gateway: a gateway that listens on every
    address answers on 127.0.0.1."""
    gateway = GatewaySettings(**settings.model_dump())
    host = "127.0.0.1" if gateway.gateway_host in ("0.0.0.0", "") else gateway.gateway_host
    return f"http://{host}:{gateway.gateway_port}"


def prepare(settings: Settings) -> list[str]:
    """`signoff setup`'s part: the gateway's channel registered for exactly its users and
    programs, and its session key, each made if missing. Says what it did."""
    return users.register_channel(settings.keys_path, users_file(settings)) + users.make_session_key(settings.keys_path)


def user_names(settings: Settings) -> set[str]:
    return set(users.Users.load(users_file(settings)).users)


def signed_in(settings: Settings, name: str, password: str) -> bool:
    """Whether `password` is the gateway user `name`'s (the users file read each time: a
    password changed or a user removed counts at once)."""
    return users.Users.load(users_file(settings)).verify(name, password) is not None


def add_user(settings: Settings, name: str, password: str | None, groups: Sequence[str], operator: bool) -> list[str]:
    """Add a user, or set their password, groups and role (no password: they log in with
    OpenID Connect only); the gateway's channel may then speak for them."""
    return users.add(settings.keys_path, users_file(settings), name, password, list(groups), operator)


def remove_user(settings: Settings, name: str) -> list[str]:
    return users.remove(settings.keys_path, users_file(settings), name)


def list_users(settings: Settings) -> list[str]:
    return users.listing(users_file(settings))


def create_token(settings: Settings, name: str, scopes: str, expires: str | None) -> tuple[str, list[str]]:
    """A program's new API token (replacing its old one), from `--scope` and `--expires` as
    typed: the token, shown once, and what was done."""
    parsed, expires_at = programs.parse_scopes(scopes), programs.parse_expiry(expires)
    return programs.create(settings.keys_path, users_file(settings), name, parsed, expires_at)


def revoke_token(settings: Settings, name: str) -> list[str]:
    return programs.revoke(settings.keys_path, users_file(settings), name)


def list_tokens(settings: Settings) -> list[str]:
    return programs.listing(users_file(settings))
