"""Read permission is bind permission: RabbitMQ lets whoever may read an exchange bind a
queue (or an exchange) it may write to it. So no service reads any exchange (setup
binds every queue), and a channel reads only `<ns>.events` and its private queues
(shared/topology.py `Topology.permissions`). Attacked with the real identities."""

import aio_pika
import pytest

from shared.ledger.tables import Decision
from shared.messages import mint
from tests.harness import next_event, rows, start_and_wait_for_approval


async def refused(connection: aio_pika.abc.AbstractConnection, attempt) -> str:
    """Try one operation on a channel of its own (RabbitMQ closes a channel that was refused)."""
    channel = await connection.channel()
    with pytest.raises(Exception, match="ACCESS_REFUSED") as error:
        await attempt(channel)
    return str(error.value)


async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    pass


async def test_no_agent_side_identity_nor_a_channel_may_bind_to_the_commands_or_read_another_services_queue(
    deployment, sink
):
    """The model-step, the executor (a python tool runs inside it) and a channel each try:
    to bind their own queue, the dead-letter exchange, a new queue or their own exchange
    to `<ns>.commands` (to receive every `tool.execute`, secret arguments and the
    ledger's authorization included), and to take a person's approval from
    `<ns>.ledger.responses` or a command from `<ns>.tool-executor.requests`. RabbitMQ
    refuses every one; the approval is then recorded and the tool runs once."""
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    ns = deployment.namespace
    session_id = mint("ses")
    commands = f"{ns}.commands"
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        deployment.kill("approval-ledger")  # the person's approval waits in its queue, for the taking
        await console.respond(requested.request_id, "approve", "", "", "tester")

        async def bind_queue(name: str):
            async def attempt(channel):
                queue = await channel.declare_queue(name, passive=True)
                await queue.bind(commands, routing_key="tool.execute")
            return attempt

        async def bind_a_new_queue(channel):
            queue = await channel.declare_queue(exclusive=True)
            await queue.bind(commands, routing_key="tool.execute")

        async def bind_exchange(name: str):
            async def attempt(channel):
                exchange = await channel.get_exchange(name, ensure=False)
                await exchange.bind(commands, routing_key="tool.execute")
            return attempt

        async def take(name: str, how: str):
            async def attempt(channel):
                queue = await channel.declare_queue(name, passive=True)
                if how == "get":
                    await queue.get(no_ack=True, fail=False)
                else:
                    await queue.consume(ignore, no_ack=True)
            return attempt

        attacks = {
            "model-step": [await bind_queue(f"{ns}.model-step.requests"), bind_a_new_queue,
                           await bind_exchange(f"{ns}.dead"), await bind_exchange(f"{ns}.model-step.reports"),
                           await take(f"{ns}.tool-executor.requests", "get"),
                           await take(f"{ns}.tool-executor.requests", "consume")],
            "tool-executor": [await bind_queue(f"{ns}.tool-executor.requests"), bind_a_new_queue,
                              await bind_exchange(f"{ns}.dead"), await bind_exchange(f"{ns}.tool-executor.reports")],
            "channel.cli": [bind_a_new_queue, await bind_exchange(f"{ns}.channels"),
                            await take(f"{ns}.tool-executor.requests", "get"),
                            await take(f"{ns}.tool-executor.requests", "consume")],
        }
        for identity in ("model-step", "tool-executor", "channel.cli"):
            attacks[identity] += [await take(f"{ns}.ledger.responses", "get"),
                                  await take(f"{ns}.ledger.responses", "consume")]
        tried = 0
        for identity, attempts in attacks.items():
            async with deployment.console(identity=identity) as attacker:
                for attempt in attempts:
                    await refused(attacker.connection, attempt)
                    tried += 1
        assert tried == 20

        deployment.start("approval-ledger")
        decided = await next_event(events, "approval.decided", timeout=30)
        assert (decided.request_id, decided.responder) == (requested.request_id, "tester")
        await next_event(events, "turn.completed", timeout=30)
    [decision] = await rows(deployment, Decision, request_id=requested.request_id)
    assert decision.decision == "approve"
    assert sink.counts["/sink"] == 1
