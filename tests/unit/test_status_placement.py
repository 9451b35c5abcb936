"""`signoff status`'s "where connected" part: the servers of a cluster's database URL
each asked alone (a standby too), and what the broker or a server says shown inert."""

from collections import Counter

from services.operations.status import Placement, database_servers, render_placement
from shared.settings import Settings


def test_each_host_of_a_database_url_is_asked_alone_and_a_standby_too():
    settings = Settings(database_url="postgresql://u@10.0.0.1:5442,db2:5443/test?target_session_attrs=read-write&x=1")
    servers = database_servers(settings)
    assert [shown for shown, _ in servers] == ["10.0.0.1:5442", "db2:5443"]
    assert [one.database_url for _, one in servers] == [
        "postgresql://u@10.0.0.1:5442/test?x=1", "postgresql://u@db2:5443/test?x=1"]


def test_one_host_without_a_port_is_named_with_postgresqls_own():
    [(shown, one)] = database_servers(Settings(database_url="postgresql://u@db/test"))
    assert shown == "db:5432" and one.database_url == "postgresql://u@db/test"


def test_each_identity_is_shown_with_its_nodes_and_servers_and_nothing_from_outside_acts_on_the_terminal():
    where = Placement(broker={"approval-ledger": Counter({"rabbit@a": 1, "rabbit@b": 2}),
                              "x\x1b[2J": Counter({"n": 1})},
                      database={"approval-ledger": Counter({"db:5442": 4})},
                      servers={"db:5442": "primary", "db:5443": "no answer: OSError"})
    lines = render_placement(where)
    assert lines[1].split() == ["approval-ledger", "rabbit@a", "(1),", "rabbit@b", "(2)", "db:5442", "(4)"]
    assert "\x1b" not in "\n".join(lines)
    assert lines[-1] == "(database servers: db:5442 primary, db:5443 no answer: OSError)"
