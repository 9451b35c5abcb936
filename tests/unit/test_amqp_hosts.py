"""Several brokers in one AMQP URL (shared/amqp_hosts.py) and several PostgreSQL hosts
in one database URL (shared/ledger_urls.py:several_hosts)."""


from shared.amqp_hosts import FailoverConnection, connection_class, split_hosts, with_hosts
from shared.ledger.leadership import _where
from shared.settings import Settings

CLUSTER = "amqp://guest:pw@127.0.0.1:5681,127.0.0.1:5682,127.0.0.1:5683/vh?timeout=5"


def test_a_url_with_three_hosts_is_three_urls_with_the_same_user_vhost_and_query():
    assert split_hosts(CLUSTER) == [
        "amqp://guest:pw@127.0.0.1:5681/vh?timeout=5",
        "amqp://guest:pw@127.0.0.1:5682/vh?timeout=5",
        "amqp://guest:pw@127.0.0.1:5683/vh?timeout=5",
    ]
    assert split_hosts("amqp://u:p@h:1/") == ["amqp://u:p@h:1/"]


def test_a_service_identity_logs_in_on_every_node_of_the_cluster():
    assert with_hosts(CLUSTER, "ns.ledger:secret") == "amqp://ns.ledger:secret@127.0.0.1:5681,127.0.0.1:5682,127.0.0.1:5683/vh?timeout=5"


def test_each_reconnect_attempt_goes_to_the_next_node_round_the_list():
    cls = connection_class(CLUSTER)
    assert issubclass(cls, FailoverConnection)
    connection = cls.__new__(cls)
    connection._index, connection._stay = 0, True

    class Unset:
        def is_set(self):
            return False

    connection.__dict__["connected"] = Unset()
    ports = [connection.url.port for _ in range(4)]
    assert ports == [5681, 5682, 5683, 5681]
    assert "pw" not in str(connection)


def test_one_host_keeps_aio_pikas_own_robust_connection():
    from aio_pika import RobustConnection

    assert connection_class("amqp://u:p@h:1/") is RobustConnection


def test_a_primary_and_its_standby_in_one_database_url_become_asyncpgs_host_list():
    settings = Settings(database_url="postgresql://postgres@127.0.0.1:5442,127.0.0.1:5443/test?target_session_attrs=read-write")
    assert settings.ledger_url == (
        "postgresql+asyncpg://postgres@/test?host=127.0.0.1:5442&host=127.0.0.1:5443&target_session_attrs=read-write"
    )
    from sqlalchemy.engine import make_url

    assert _where(make_url(settings.ledger_url)) == {
        "host": ["127.0.0.1", "127.0.0.1"],
        "port": [5442, 5443],
        "target_session_attrs": "read-write",
    }
    assert Settings(database_url="postgresql://u@h:5/d").ledger_url == "postgresql+asyncpg://u@h:5/d"
