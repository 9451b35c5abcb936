"""Ending a login ends its access, through the same doors an attacker and an operator use:
two real gateway replicas sharing one ledger and one Redis, the `signoff` command line,
and Redis losing its keys; on both stores. A logout, a removed user, a password reset,
a re-added name and a revoked token each end the old login's requests at once and its
open event streams within a second, on every replica; the database holds the record
of a logout, so no Redis flush brings it back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import pytest

from services.gateway import users
from shared.ledger.tables import EndedLogin
from tests.gateway_client import PASSWORD, GatewayClient
from tests.harness import rows
from tests.integration.test_command_line import signoff
from tests.integration.test_gateway import add_people, pending_card, problem, start, url
from tests.integration.test_gateway_tokens import make_token

# How soon an open stream must end after its login does (what the project promises).
WITHIN = 1.0


@pytest.fixture
def replicas(deployment, sink):
    """The four services and two gateway replicas, with the tests' people as users."""
    deployment.extra_env["SINK_URL"] = sink.url
    add_people(deployment)
    deployment.start()
    deployment.start("gateway", "gateway#2")
    return deployment


class Stream:
    """An open `GET /v1/events` (from now): the events it delivers, and when it ended."""

    def __init__(self, base: str, headers: dict[str, str]) -> None:
        self.http = httpx.AsyncClient(base_url=base, timeout=None)
        self.headers = headers
        self.events: list[tuple[str | None, dict]] = []
        self.opened = asyncio.Event()
        self.ended_at: float | None = None
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        fields: dict[str, str] = {}
        try:
            async with self.http.stream("GET", "/v1/events", params={"since": "now"}, headers=self.headers) as answer:
                assert answer.status_code == 200, await answer.aread()
                async for line in answer.aiter_lines():
                    if line.startswith(":"):
                        continue
                    if line:
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
                        continue
                    if "id" in fields:
                        self.opened.set()  # the first block: the id to resume from
                        if "event" in fields:
                            self.events.append((fields["event"], json.loads(fields["data"])))
                    fields = {}
        finally:
            self.ended_at = time.monotonic()
            await self.http.aclose()

    async def open(self) -> Stream:
        await asyncio.wait_for(self.opened.wait(), 20)
        return self

    async def ended_within(self, since: float, seconds: float = WITHIN) -> float:
        """How long after `since` it ended; fails when it is still open `seconds` after."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), max(0.1, since + seconds + 0.5 - time.monotonic()))
        assert self.task.done(), f"the stream is still open {seconds} s after its login ended"
        assert self.ended_at is not None
        took = self.ended_at - since
        assert took <= seconds, f"the stream ended {took:.2f} s after its login did"
        return took

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def cookie_of(client: GatewayClient) -> dict[str, str]:
    return client.headers(csrf=False)


async def as_of(base: str, client: GatewayClient) -> GatewayClient:
    """The same login (cookie and CSRF token) at another replica."""
    other = GatewayClient(base)
    other.cookie, other.csrf = client.cookie, client.csrf
    return other


async def refused_everywhere(deployment, client: GatewayClient) -> None:
    """Its cookie is refused by both replicas, for a read and for a stream."""
    for name in ("gateway", "gateway#2"):
        async with await as_of(url(deployment, name), client) as there:
            problem(await there.get("/v1/me"), 401, "unauthenticated")
            problem(await there.get("/v1/events", params={"since": "now"}), 401, "unauthenticated")


async def test_a_logout_ends_the_logins_streams_on_both_replicas_within_a_second_and_a_redis_flush_undoes_nothing(
        replicas):
    one, two = url(replicas), url(replicas, "gateway#2")
    async with GatewayClient(one) as ann, GatewayClient(one) as alice:
        await ann.login("ann")  # an operator: every event, arguments included
        await alice.login("alice")
        streams = [await Stream(base, cookie_of(ann)).open() for base in (one, two)]
        session_id = await start(alice, "reviewed")
        await pending_card(alice, session_id)
        for stream in streams:  # both deliver while the login holds
            await _until(lambda s=stream: any(kind == "approval.requested" for kind, _ in s.events))

        assert (await ann.post("/v1/logout")).status_code == 204
        logged_out = time.monotonic()
        for stream in streams:
            await stream.ended_within(logged_out)
        seen = [len(stream.events) for stream in streams]
        await start(alice, "reviewed")  # a new card after the logout reaches neither stream
        await asyncio.sleep(0.5)
        assert [len(stream.events) for stream in streams] == seen

        # The database holds the logout: with every Redis key of the deployment gone, the
        # cookie is still refused by both replicas (and a stream does not open).
        [ended] = await rows(replicas, EndedLogin, principal="ann")
        assert await replicas.forget_redis() > 0
        await refused_everywhere(replicas, ann)
        # Another login of the same person is not touched by this one's end.
        assert (await alice.get("/v1/me")).status_code == 200
        async with GatewayClient(two) as ann_again:
            assert (await ann_again.login("ann")).status_code == 200
            assert (await ann_again.get("/v1/me")).status_code == 200
            assert ann_again.cookie != ann.cookie
        assert ended.expires_at.timestamp() > time.time()


async def test_a_removed_user_and_a_revoked_token_lose_their_open_streams_on_both_replicas_within_a_second(
        replicas):
    one, two = url(replicas), url(replicas, "gateway#2")
    token = make_token(replicas, "watcher", "requests:read")
    async with GatewayClient(one) as bob:
        await bob.login("bob")
        people = [await Stream(base, cookie_of(bob)).open() for base in (one, two)]
        bots = [await Stream(base, {"Authorization": f"Bearer {token}"}).open() for base in (one, two)]

        await asyncio.to_thread(signoff, replicas, "user", "remove", "bob")
        removed = time.monotonic()
        for stream in people:
            await stream.ended_within(removed)
        assert all(not stream.task.done() for stream in bots), "a program's stream ended with someone else's login"

        await asyncio.to_thread(signoff, replicas, "token", "revoke", "watcher")
        revoked = time.monotonic()
        for stream in bots:
            await stream.ended_within(revoked)
        await refused_everywhere(replicas, bob)
        async with httpx.AsyncClient(base_url=two, headers={"Authorization": f"Bearer {token}"}) as program:
            problem(await program.get("/v1/events"), 401, "unauthenticated")


async def test_a_password_reset_or_a_re_added_name_ends_every_session_of_the_old_credential(replicas):
    one, two = url(replicas), url(replicas, "gateway#2")
    async with GatewayClient(one) as alice, GatewayClient(two) as alice_elsewhere, GatewayClient(one) as sam:
        await alice.login("alice")
        await alice_elsewhere.login("alice")  # a second session of the same credential
        await sam.login("sam")
        stream = await Stream(two, cookie_of(alice)).open()

        # A reset (`signoff user add` again, a new password): every session of the old one ends.
        new_password = "a brand new passphrase"
        await asyncio.to_thread(signoff, replicas, "user", "add", "alice", "--password-stdin", answer=new_password)
        reset = time.monotonic()
        await stream.ended_within(reset)
        await refused_everywhere(replicas, alice)
        await refused_everywhere(replicas, alice_elsewhere)
        problem(await alice.login("alice", PASSWORD), 401, "bad-login")
        assert (await alice.login("alice", new_password)).status_code == 200
        assert (await alice.get("/v1/me")).json()["principal"] == "alice"

        # A name removed and added again (the same password) does not bring its old sessions back.
        # (What `signoff user remove` and `signoff user add` run, without two more interpreters' start.)
        keys = replicas.data_dir / "keys"
        users.remove(keys, keys / "gateway" / "users.yaml", "sam")
        users.add(keys, keys / "gateway" / "users.yaml", "sam", PASSWORD, [], False)
        await refused_everywhere(replicas, sam)
        async with GatewayClient(two) as sam_again:
            assert (await sam_again.login("sam")).status_code == 200
            assert (await sam_again.get("/v1/me")).status_code == 200


async def _until(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.05)


async def test_on_postgresql_the_gateways_role_writes_its_ended_logins_and_nothing_of_the_ledgers(pg_deployment):
    """The one table the gateway writes; every other write of its role is refused."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from shared.ledger.gateway_logins import EndedLogins

    pg_deployment.start("approval-ledger")  # migrated; `signoff setup` granted each role its tables
    record = EndedLogins.opened(pg_deployment.settings)
    try:
        await record.end("s-1", "alice", time.time() + 60)
        await record.end("s-1", "alice", time.time() + 60)  # again: nothing changes
        await record.end("s-old", "bob", time.time() - 1)  # its session expired already: pruned
        assert await record.ended("s-1") and await record.ended_among(["s-1", "s-2", "s-old"]) == {"s-1"}
        for statement in ("DELETE FROM outbox", "UPDATE sessions SET status = 'idle'",
                          "INSERT INTO inbox (message_id, message_type, session_id, received_at) "
                          "VALUES ('m', 't', 's', CURRENT_TIMESTAMP)", "UPDATE ended_logins SET principal = 'x'"):
            with pytest.raises(DBAPIError):
                async with record.engine.begin() as conn:
                    await conn.execute(text(statement))
    finally:
        await record.close()
