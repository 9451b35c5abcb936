"""AMQP URLs naming several brokers (the nodes of one RabbitMQ cluster), as libpq
writes several PostgreSQL hosts: `amqp://user:pass@h1:5681,h2:5682,h3:5683/vhost`.

A client connects to the first node that answers, starting at a random one (the
clients of a deployment spread over the nodes, as behind a load balancer), and when
its connection drops it reconnects to the next node, round the list, as long as it
must. aio-pika's robust connection does the reconnecting, its channels and consumers
restored; it knows one URL only, so `FailoverConnection` gives it the next node at
each attempt. A URL with one host behaves exactly as before.
"""

from __future__ import annotations

import random
import socket
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
from aio_pika import RobustConnection
from yarl import URL


def hosts_of(url: str) -> list[str]:
    """The `host:port` entries of a URL's authority (one, or several separated by commas)."""
    netloc = urlsplit(url).netloc
    return [h for h in netloc.rpartition("@")[2].split(",") if h]


def split_hosts(url: str) -> list[str]:
    """One URL per host, each with the user, virtual host and query of the original."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    return [
        urlunsplit((parts.scheme, f"{userinfo}{at}{host}", parts.path, parts.query, parts.fragment))
        for host in hosts_of(url) or [""]
    ]


def with_hosts(url: str, netloc_user: str) -> str:
    """`url` with its user-info replaced by `netloc_user` (`user:password`), its hosts kept."""
    parts = urlsplit(url)
    hosts = ",".join(hosts_of(url)) or "localhost"
    return urlunsplit((parts.scheme, f"{netloc_user}@{hosts}", parts.path, parts.query, parts.fragment))


def _answers(url: URL, timeout: float = 1.0) -> bool:
    try:
        socket.create_connection((url.host or "localhost", url.port or 5672), timeout=timeout).close()
    except OSError:
        return False
    return True


class FailoverConnection(RobustConnection):
    """A robust connection over several nodes: each connection attempt made while
    disconnected goes to the next node in the list.

    aio-pika's reconnect loop reads `self.url` once per attempt (`Connection.connect`)
    and nowhere else while disconnected (its log lines use `str(self)`, overridden
    here), so the property moves on to the next node exactly once per attempt."""

    URLS: tuple[URL, ...] = ()

    def __init__(self, url: URL, loop: Any = None, **kwargs: Any) -> None:
        self._index = random.randrange(len(self.URLS))
        self._stay = True  # the first attempt goes to the node chosen; each later one moves on
        super().__init__(url, loop=loop, **kwargs)

    @property  # type: ignore[override]
    def url(self) -> URL:
        # Connected (or still in __init__, which reads the query): the current node.
        if "connected" not in self.__dict__ or self.connected.is_set():
            return self.URLS[self._index]
        if self._stay:
            self._stay = False
        else:
            self._index = (self._index + 1) % len(self.URLS)
        return self.URLS[self._index]

    @url.setter
    def url(self, value: URL) -> None:  # Connection.__init__ sets it; the list is the class's
        pass

    async def connect(self, timeout: Any = None) -> None:
        # The first connection: the first node that answers, so a node down at start-up
        # is passed over instead of failing the start (the reconnects go round by themselves).
        for _ in self.URLS:
            if _answers(self.URLS[self._index]):
                break
            self._index = (self._index + 1) % len(self.URLS)
        self._stay = True
        await super().connect(timeout)

    @property
    def node(self) -> str:
        """`host:port` of the node this connection is on (or tries next)."""
        url = self.URLS[self._index]
        return f"{url.host}:{url.port}"

    def __str__(self) -> str:
        url = self.URLS[self._index]
        return str(url.with_password("******") if url.password else url)


def connection_class(url: str) -> type[RobustConnection]:
    """The robust connection class for `url`: aio-pika's own for one host, a
    `FailoverConnection` over its nodes for several."""
    urls = split_hosts(url)
    if len(urls) == 1:
        return RobustConnection
    return type("FailoverConnection", (FailoverConnection,), {"URLS": tuple(URL(u) for u in urls)})


async def connect_robust(url: str, **kwargs: Any) -> aio_pika.abc.AbstractRobustConnection:
    """`aio_pika.connect_robust` for a URL with one host or several."""
    return await aio_pika.connect_robust(split_hosts(url)[0], connection_class=connection_class(url), **kwargs)
