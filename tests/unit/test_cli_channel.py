"""Whom the CLI's channel may assert after `signoff setup` (shared/keyring.py): the OS
user running setup and the people an operator lists, kept across runs; never anyone."""

import os
import pwd

from shared import keyring


def test_setup_registers_the_os_user_and_the_listed_people_after_those_registered_before():
    assert keyring.cli_principals(None, "root", []) == ["root"]
    assert keyring.cli_principals(None, "root", ["alice", "bob"]) == ["root", "alice", "bob"]
    assert keyring.cli_principals(["alice", "dev"], "root", ["bob", "alice"]) == ["alice", "dev", "root", "bob"]


def test_a_cli_that_could_assert_anyone_no_longer_can_after_setup():
    assert keyring.cli_principals(["*"], "root", []) == ["root"]
    assert keyring.cli_principals(["*", "alice"], "ops", ["bob"]) == ["alice", "ops", "bob"]


def test_the_os_user_is_the_systems_name_for_this_process_not_the_user_environment_variable(monkeypatch):
    monkeypatch.setenv("USER", "somebody-else")
    monkeypatch.setenv("LOGNAME", "somebody-else")
    assert keyring.os_user() == pwd.getpwuid(os.geteuid()).pw_name


def test_the_registry_says_whom_a_channel_is_registered_for_and_none_for_a_channel_it_does_not_know(tmp_path):
    keyring.create(tmp_path, {"cli": ["root", "alice"], "inbox": ["alice"]})
    assert keyring.registered_principals(tmp_path, "cli") == ["root", "alice"]
    assert keyring.registered_principals(tmp_path, "inbox") == ["alice"]
    assert keyring.registered_principals(tmp_path, "chat") is None
    assert keyring.registered_principals(tmp_path / "elsewhere", "cli") is None
