"""Redis is never the truth, even when it lies (invariant 8).

Anyone who can write Redis is an attacker here. Marking a command as already
handled, or holding a lease on a call, must never drop an approved call or
leave its session running: Redis may only ever save work the durable record
agrees is done. And each service that uses Redis logs in as its own ACL user,
which reaches only its own keys and commands."""

import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from shared.ledger.tables import OutboxRow, Session
from shared.messages import mint
from tests.harness import REDIS_URL, eventually, next_event, rows, start_and_wait_for_approval

# What a Redis writer would set to make a consumer skip a message: the `seen` mark the
# consumers once checked (`<ns>:seen:<consumer>:<message id>`), for every consumer.
CONSUMERS = ("approval-ledger", "publisher", "model-step", "tool-executor")


async def mark_as_seen(namespace: str, message_ids: list[str]) -> None:
    async with Redis.from_url(REDIS_URL) as redis:
        for message_id in message_ids:
            for consumer in CONSUMERS:
                await redis.set(f"{namespace}:seen:{consumer}:{message_id}", 1)
                await redis.set(f"{namespace}:seen:{message_id}", 1)


async def outbox_ids(deployment, session_id: str, message_type: str) -> list[str]:
    return [r.message_id for r in await rows(deployment, OutboxRow, session_id=session_id, message_type=message_type)]


async def test_a_redis_writer_marking_the_approved_call_and_the_next_step_as_seen_drops_neither(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="tok")
    deployment.start("approval-ledger", "publisher", "model-step")
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        # The model-step is away: the step after the call's result waits in its queue.
        deployment.kill("model-step")
        await console.respond(requested.request_id, "approve", "", "", "tester")
        [execute] = await eventually(lambda: outbox_ids(deployment, session_id, "tool.execute"))
        await mark_as_seen(deployment.namespace, [execute])
        # A lease that is nobody's, with no end: it may delay the call, never drop it.
        async with Redis.from_url(REDIS_URL) as redis:
            await redis.set(f"{deployment.namespace}:lease:{requested.call_id}", "attacker")
        deployment.start("tool-executor")
        await next_event(events, "tool.closed", timeout=90)
        steps = await eventually(lambda: _second(deployment, session_id))
        await mark_as_seen(deployment.namespace, steps)
        deployment.start("model-step")
        completed = await next_event(events, "turn.completed", timeout=30)
        assert completed.text == "Posted."
    assert sink.counts["/sink"] == 1, "the approved call ran exactly once"
    [session] = await rows(deployment, Session, id=session_id)
    assert session.status == "idle", "the session finished"


async def _second(deployment, session_id):
    """The step requested after the call's result (the first one asked for the call)."""
    ids = await outbox_ids(deployment, session_id, "step.requested")
    return ids if len(ids) >= 2 else None


async def test_the_executors_redis_user_reaches_only_its_own_leases(sqlite_deployment):
    deployment = sqlite_deployment
    deployment.setup()
    settings = deployment.settings
    namespace = settings.namespace
    async with Redis.from_url(settings.redis_login("tool-executor")) as executor:
        assert await executor.ping()
        assert await executor.set(f"{namespace}:lease:call_1", "me", nx=True, px=1000)
        assert await executor.get(f"{namespace}:lease:call_1") == b"me"
        script = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
        assert await executor.eval(script, 1, f"{namespace}:lease:call_1", "me") == 1
        for key in (f"{namespace}:seen:tool-executor:msg_1", "other:lease:call_1", f"{namespace}x:lease:call_1",
                    "anything"):
            with pytest.raises(NoPermissionError):
                await executor.set(key, 1)
            with pytest.raises(NoPermissionError):
                await executor.get(key)
        for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "requirepass"), ("ACL", "LIST"),
                        ("ACL", "SETUSER", f"{namespace}.tool-executor", "~*"), ("KEYS", "*"),
                        ("SCAN", "0"), ("SHUTDOWN", "NOSAVE")):
            with pytest.raises(NoPermissionError):
                await executor.execute_command(*command)
        # A script may touch only its user's keys too.
        with pytest.raises(ResponseError, match=r"(?i)no permission|noperm"):
            await executor.eval("return redis.call('get', KEYS[1])", 1, "other:lease:call_1")
    wrong = settings.redis_login("tool-executor").replace(f"{namespace}.tool-executor:", f"{namespace}.tool-executor:x")
    with pytest.raises(AuthenticationError):
        async with Redis.from_url(wrong) as stranger:
            await stranger.ping()
    # No other service has a Redis user but the gateway (its login limits and logouts): the
    # ledger, publisher and model-step use no Redis.
    async with Redis.from_url(REDIS_URL) as admin:
        users = await admin.execute_command("ACL", "USERS")
        assert {u.decode() for u in users if u.decode().startswith(f"{namespace}.")} == {
            f"{namespace}.tool-executor",
            f"{namespace}.gateway",
        }
    # The gateway's user reaches only its own keys, not the executor's leases.
    async with Redis.from_url(settings.redis_login("gateway")) as gateway:
        await gateway.set(f"{namespace}:gateway:probe", "1")
        with pytest.raises(NoPermissionError):
            await gateway.set(f"{namespace}:lease:call_1", "gateway")
    await deployment.cleanup()
    async with Redis.from_url(REDIS_URL) as admin:
        users = await admin.execute_command("ACL", "USERS")
        assert not [u for u in users if u.decode().startswith(f"{namespace}.")], "cleanup deletes the ACL users"
