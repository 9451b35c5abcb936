"""The services' own Redis users on a database index other than 0, and a Redis that
refuses a service told apart from one that is away (shared/redis_access.py)."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError

from tests.gateway_client import GatewayClient
from tests.harness import REDIS_URL, eventually, free_port
from tests.integration.test_gateway import add_people, url


def on_index(index: int, base: str = REDIS_URL) -> str:
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{index}", "", ""))


async def readyz(base: str) -> tuple[int, str]:
    """Awaited: the relay below runs on this event loop too."""
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            answer = await http.get(f"{base}/readyz")
    except httpx.HTTPError as error:
        return 0, str(error)
    return answer.status_code, answer.text


async def answers(base: str, status: int) -> bool:
    return (await readyz(base))[0] == status


async def test_on_a_non_zero_database_index_each_services_redis_user_works_there_and_may_select_no_other(
        sqlite_deployment):
    deployment = sqlite_deployment
    deployment.extra_env["SIGNOFF_REDIS_URL"] = on_index(5)
    add_people(deployment)
    deployment.setup()
    settings = deployment.settings
    namespace = settings.namespace
    for name, key in (("tool-executor", f"{namespace}:lease:probe"), ("gateway", f"{namespace}:gateway:probe")):
        async with Redis.from_url(settings.redis_login(name)) as own:
            assert await own.set(key, "1", px=60_000)
            for other in (0, 6):
                with pytest.raises(NoPermissionError):
                    await own.execute_command("SELECT", other)
        async with Redis.from_url(on_index(5)) as five, Redis.from_url(on_index(0)) as zero:
            assert await five.get(key) == b"1" and await zero.get(key) is None
    # The services themselves: the executor ready, the gateway ready and logging people in.
    deployment.metrics_ports = {"tool-executor": free_port()}
    deployment.start("tool-executor")
    deployment.start("gateway")
    executor = f"http://127.0.0.1:{deployment.metrics_ports['tool-executor']}"
    await eventually(lambda: answers(executor, 200), 10)
    assert "redis: ok" in (await readyz(executor))[1]
    async with GatewayClient(url(deployment)) as alice:
        assert (await alice.login("alice")).status_code == 200
        assert (await alice.http.get("/readyz")).status_code == 200
    log = deployment.log_path("tool-executor").read_text()
    assert "redis unavailable" not in log and "refuses" not in log


async def test_an_executor_whose_redis_user_is_refused_is_not_ready_and_says_why_and_one_whose_redis_is_away_is(
        sqlite_deployment):
    """A refusal (here: the user may not select the URL's database index, as setup's users
    once were) is a configuration nobody fixes by waiting: not ready, an error in the log.
    An outage degrades as designed: leases granted, the ledger's claim decides, ready."""
    deployment = sqlite_deployment
    deployment.extra_env["SIGNOFF_REDIS_URL"] = on_index(5)
    deployment.setup()
    settings = deployment.settings
    async with Redis.from_url(on_index(5)) as admin:
        await admin.execute_command("ACL", "SETUSER", settings.redis_user("tool-executor"), "-select")
    deployment.metrics_ports = {"tool-executor": free_port()}
    deployment.start("tool-executor")
    executor = f"http://127.0.0.1:{deployment.metrics_ports['tool-executor']}"
    await eventually(lambda: answers(executor, 503), 10)
    assert "redis: not ready" in (await readyz(executor))[1]
    log = deployment.log_path("tool-executor").read_text()
    assert "ERROR" in log and f"Redis refuses {settings.redis_user('tool-executor')}" in log, log[-2000:]
    assert "signoff setup" in log
    deployment.kill("tool-executor")
    async with Redis.from_url(on_index(5)) as admin:  # the user as setup makes it
        await admin.execute_command("ACL", "SETUSER", settings.redis_user("tool-executor"), "+select|5")
    # Away: its Redis (reached through a relay here) goes away after it started.
    async with Relay(urlsplit(REDIS_URL).port or 6379) as relay:
        deployment.extra_env["SIGNOFF_REDIS_URL"] = on_index(5, f"redis://127.0.0.1:{relay.port}")
        try:
            deployment.start("tool-executor")
            await eventually(lambda: answers(executor, 200), 10)
            await relay.close()
            for _ in range(3):
                assert await readyz(executor) == (200, "broker: ok\ndatabase: ok\nredis: ok\n")
                await asyncio.sleep(0.5)
        finally:
            deployment.extra_env["SIGNOFF_REDIS_URL"] = on_index(5)  # where cleanup deletes its users


class Relay:
    """A TCP relay to the local Redis that can be taken away, with every connection through it."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Relay:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for writer in self.writers:
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self.writers += [writer, upstream_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
