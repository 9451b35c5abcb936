"""A gateway session belongs to one credential of one person (services/gateway/users.py,
auth.py): pure parts, no services. The same doors with real replicas, the CLI and Redis
are tests/integration/test_gateway_logins.py."""

from __future__ import annotations

import secrets

import yaml

from services.gateway import programs, users
from services.gateway.auth import Login, Logins, Sessions


def make(tmp_path):
    keys = tmp_path / "keys"
    return keys, keys / "gateway" / "users.yaml"


def test_every_user_add_makes_a_new_credential_and_a_cookie_carries_the_one_it_logged_in_with(tmp_path):
    keys, path = make(tmp_path)
    users.add(keys, path, "alice", "first password", [], False)
    first = users.Users.load(path).users["alice"].credential
    sessions = Sessions(secrets.token_bytes(32), 3600)
    cookie, login = sessions.issue("alice", first)
    read = sessions.read(cookie)
    assert read is not None and read.credential == first == login.credential
    live = Logins(users.LiveUsers(path), None, record=None, cache=None)  # type: ignore[arg-type]
    assert live.credential_holds(read) is not None

    users.add(keys, path, "alice", "first password", [], False)  # a reset, even to the same password
    assert users.Users.load(path).users["alice"].credential not in ("", first)
    assert live.credential_holds(read) is None
    users.remove(keys, path, "alice")
    users.add(keys, path, "alice", "first password", [], False)  # a re-add
    assert live.credential_holds(read) is None
    # The cookie's credential is signed with the rest: naming another one breaks the signature.
    payload, mac = cookie.split(".")
    assert sessions.read(payload[:-2] + "xx." + mac) is None


def test_an_entry_written_before_credentials_keeps_one_derived_from_its_password_hash(tmp_path):
    keys, path = make(tmp_path)
    users.add(keys, path, "bob", "a password of bob", [], False)
    data = yaml.safe_load(path.read_text())
    del data["users"]["bob"]["credential"]
    path.write_text(yaml.safe_dump(data))
    derived = users.Users.load(path).users["bob"].credential
    assert derived and derived == users.Users.load(path).users["bob"].credential
    assert derived == users.legacy_credential("bob", data["users"]["bob"]["password"])


def test_a_programs_login_holds_while_its_token_is_the_one_on_file(tmp_path):
    keys, path = make(tmp_path)
    token, _ = programs.create(keys, path, "ci-bot", programs.parse_scopes("requests:read"))
    tokens = programs.LiveTokens(programs.tokens_path(path))
    live = Logins(users.LiveUsers(path), tokens, record=None, cache=None)  # type: ignore[arg-type]
    login = Login("bot:ci-bot", "token:ci-bot", float("inf"), credential=programs.lookup_hash(token))
    assert live.credential_holds(login) is not None
    programs.create(keys, path, "ci-bot", programs.parse_scopes("requests:read"))  # a new token, same name
    assert live.credential_holds(login) is None
