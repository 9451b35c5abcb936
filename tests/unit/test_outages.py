"""Which failures are a dependency's outage (wait and retry, holding the message)
and which are the message's own (counted towards parking it)."""

import sqlite3

import sqlalchemy.exc

from shared.consuming import is_outage


def wrapped(error: BaseException) -> BaseException:
    try:
        try:
            raise error
        except BaseException as inner:
            raise RuntimeError("handler failed") from inner
    except RuntimeError as outer:
        return outer


def test_a_refused_or_lost_connection_anywhere_in_the_chain_is_an_outage():
    assert is_outage(ConnectionRefusedError(111, "refused"))
    assert is_outage(wrapped(ConnectionResetError(104, "reset")))
    assert is_outage(sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("the database system is shutting down")))
    assert is_outage(wrapped(sqlalchemy.exc.TimeoutError("QueuePool limit reached")))


def test_a_bad_message_or_a_bug_is_not_an_outage():
    assert not is_outage(ValueError("bad"))
    assert not is_outage(wrapped(KeyError("x")))
    assert not is_outage(sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not is_outage(FileNotFoundError(2, "no such file"))


def test_a_sqlite_schema_that_does_not_match_the_code_is_not_an_outage_but_a_locked_file_is():
    def sqlite_error(text: str) -> BaseException:
        return wrapped(sqlalchemy.exc.OperationalError("SELECT x FROM t", {}, sqlite3.OperationalError(text)))

    assert not is_outage(sqlite_error("no such column: sessions.audit_hash"))
    assert not is_outage(sqlite_error("no such table: audit_log"))
    assert not is_outage(sqlite_error("table inbox has no column named message_type"))
    assert is_outage(sqlite_error("database is locked"))
    assert is_outage(sqlite_error("unable to open database file"))
