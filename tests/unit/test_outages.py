"""Which failures are a dependency's outage (wait and retry, holding the message)
and which are the message's own (counted towards parking it)."""

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
