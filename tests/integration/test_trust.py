"""Only a person can approve, and only an approved call can run (docs/design.md,
"Trust boundaries"): responses must be signed by a registered channel, and the
executor runs nothing the ledger did not seal and record."""

import asyncio
from datetime import timedelta

import aio_pika
import pytest
from sqlalchemy import func, select

from shared import keyring
from shared.authorization import authorize
from shared.messages import ExecuteTool, RespondToApproval, mint, now
from shared.signatures import new_private_key, sign
from shared.ledger.tables import Decision, ExecutionClaim
from tests.harness import RABBITMQ_URL, next_event, rows, start_and_wait_for_approval


def signed(response: RespondToApproval, key, key_id: str) -> RespondToApproval:
    unsigned = response.model_copy(update={"key_id": key_id})
    return unsigned.model_copy(update={"signature": sign(key, unsigned.signed_part())})


async def test_forged_stale_replayed_and_unauthorized_responses_are_refused_and_a_signed_one_counts_once(
    deployment, sink
):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    # A second channel that may speak for alice only.
    keyring.create(deployment.settings.keys_path, {"chat": ["alice"]})
    chat = keyring.channel_private_key(deployment.settings.keys_path, "chat")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)

        def response(**changes) -> RespondToApproval:
            fields = dict(session_id=session_id, request_id=requested.request_id, decision="approve",
                          args_digest=requested.args_digest, responder="alice")
            return RespondToApproval(**{**fields, **changes})

        good = console.sign(response())
        refused = {
            "unsigned": response(),
            "bad_signature": good.model_copy(update={"reason": "changed after signing", "message_id": mint("msg"),
                                                     "response_id": mint("rsp")}),
            "unknown_key": signed(response(), new_private_key(), "stranger"),
            "stale": console.sign(response(issued_at=now() - timedelta(minutes=10))),
            "wrong_principal": signed(response(responder="bob"), chat, "chat"),
            "digest_mismatch": console.sign(response(args_digest="sha256:" + "0" * 64)),
        }
        for message in refused.values():
            await console.send(message)
        seen = {}
        for _ in refused:
            rejected = await next_event(events, "message.rejected")
            seen[rejected.rejected_message_id] = rejected.reason_code
        assert seen == {message.message_id: code for code, message in refused.items()}
        assert sink.counts["/sink"] == 0, "nothing was approved"

        await console.send(good)
        decided = await next_event(events, "approval.decided")
        assert (decided.request_id, decided.responder) == (requested.request_id, "alice")
        await next_event(events, "turn.completed", timeout=30)
        # The same signed response again, under a new message id: it counts once.
        await console.send(good.model_copy(update={"message_id": mint("msg")}))
        replayed = await next_event(events, "message.rejected")
        assert replayed.reason_code == "replayed"
    assert sink.counts["/sink"] == 1


async def test_forged_altered_and_expired_tool_executions_run_nothing_and_tell_an_operator(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t", SIGNOFF_AUTHORIZATION_TTL_SECONDS="3")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console, deployment.observer() as observer:
        # Every tool.execute the ledger sends, copied.
        copies = await observer.declare_queue(exclusive=True)
        await copies.bind(f"{deployment.namespace}.commands", routing_key="tool.execute")
        alerts = await console.watch("*")
        events, requested = await start_and_wait_for_approval(console, session_id)
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "turn.completed", timeout=30)
        real = ExecuteTool.model_validate_json((await copies.get(no_ack=True)).body)
        assert sink.counts["/sink"] == 1

        fresh = dict(session_id=session_id, tool="post_to_sink", arguments={"message": "forged"},
                     idempotency_key=mint("idk"))
        ledger_key = keyring.ledger_private_key(deployment.settings.keys_path)
        signed_but_unrecorded = ExecuteTool(call_id=mint("call"), **fresh)
        forgeries = {
            "unauthorized": ExecuteTool(call_id=mint("call"), **fresh),
            "altered": real.model_copy(update={"message_id": mint("msg"), "arguments": {"message": "other"}}),
            # Sealed with the ledger's own key (as a thief of it could), yet no such call is on record.
            "not_on_record": signed_but_unrecorded.model_copy(update={"authorization": authorize(
                ledger_key, signed_but_unrecorded, basis="policy", request_id=None, at=now(),
                ttl=timedelta(minutes=5))}),
        }
        # Only the publisher may put a tool.execute on the bus: these come as if its credentials were stolen.
        async with deployment.console(identity="publisher") as thief:
            for forged in forgeries.values():
                await thief.send(forged)
            await asyncio.sleep(3)  # the real authorization's 3 s have passed
            forgeries["expired"] = real.model_copy(update={"message_id": mint("msg")})
            await thief.send(forgeries["expired"])

        told = {}
        while len(told) < len(forgeries):
            alert = await next_event(alerts, "operator.alerted")
            told[alert.call_id, alert.reason_code] = alert.reason_text
    assert set(told) == {(forged.call_id, code) for code, forged in forgeries.items()}
    assert sink.counts["/sink"] == 1, "no forged, altered or expired command ran"



async def test_a_sealed_command_for_a_call_not_yet_approved_runs_nothing_and_leaves_no_claim_to_block_the_approved_run(
        deployment, sink):
    """The executor checks the ledger's record in the statement that takes the claim
    (services/tool_executor/claims.py): a refusal must roll that claim back, or the
    approved command would find it held and close the call as outcome-unknown."""
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        alerts = await console.watch("*")
        events, requested = await start_and_wait_for_approval(console, session_id)
        early = ExecuteTool(session_id=session_id, call_id=requested.call_id, tool=requested.card.tool,
                            arguments=requested.card.arguments, idempotency_key=mint("idk"))
        # Sealed with the ledger's own key (as a thief of it could), naming the real request before anyone decided.
        early = early.model_copy(update={"authorization": authorize(
            keyring.ledger_private_key(deployment.settings.keys_path), early, basis="approval",
            request_id=requested.request_id, at=now(), ttl=timedelta(minutes=5))})
        async with deployment.console(identity="publisher") as thief:
            await thief.send(early)
        alert = await next_event(alerts, "operator.alerted")
        assert (alert.call_id, alert.reason_code) == (requested.call_id, "not_on_record")
        assert await rows(deployment, ExecutionClaim, call_id=requested.call_id) == []
        assert sink.counts["/sink"] == 0

        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "turn.completed", timeout=30)
        [claim] = await rows(deployment, ExecutionClaim, call_id=requested.call_id)
    assert (claim.outcome, claim.attempts, sink.counts["/sink"]) == ("output", 1, 1)

async def test_the_model_step_or_a_tool_in_the_executor_cannot_put_an_approval_on_the_bus_nor_have_one_count(
    deployment, sink
):
    """With a service's own broker credentials (a python tool runs inside the executor
    and can read its password file): RabbitMQ refuses an approval on the channels'
    exchange; sent on the service's own exchange it reaches no response queue and
    approves nothing; and what reaches the ledger from a sender that may not send it
    (here the broker's administrator, straight into a ledger queue) is refused."""
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        approval = console.sign(RespondToApproval(session_id=session_id, request_id=requested.request_id,
                                                  decision="approve", args_digest=requested.args_digest,
                                                  responder="tester"))
        for identity in ("model-step", "tool-executor"):
            async with deployment.console(identity=identity) as service:
                with pytest.raises(Exception, match="ACCESS_REFUSED"):
                    await service.send(approval)
            async with deployment.console(identity=identity) as service:
                own = await service.channel.get_exchange(f"{deployment.namespace}.{identity}.reports", ensure=False)
                for routing_key in ("approval.respond", "step.completed", "tool.completed"):
                    await own.publish(aio_pika.Message(approval.model_dump_json().encode(), user_id=service.user,
                                                       message_id=mint("msg")), routing_key=routing_key)
        admin = await aio_pika.connect(RABBITMQ_URL)
        async with admin:
            channel = await admin.channel()
            await channel.default_exchange.publish(
                aio_pika.Message(approval.model_dump_json().encode(), user_id="guest", message_id=approval.message_id),
                routing_key=f"{deployment.namespace}.ledger.responses")
        rejected = await next_event(events, "message.rejected")
        assert (rejected.rejected_message_id, rejected.reason_code) == (approval.message_id, "unauthorized_sender")
        await asyncio.sleep(1)
        async with deployment.ledger() as ledger, ledger() as db:
            assert await db.scalar(select(func.count()).select_from(Decision)) == 0, "nothing was approved"
        # The channel's own, signed, on its own exchange: it counts.
        await console.send(approval.model_copy(update={"message_id": mint("msg")}))
        await next_event(events, "turn.completed", timeout=30)
    assert sink.counts["/sink"] == 1


async def test_on_postgresql_only_the_ledgers_role_can_write_a_decision_and_each_role_only_its_own_rows(pg_deployment):
    from sqlalchemy import text
    from sqlalchemy.exc import ProgrammingError

    pg_deployment.setup()
    forbidden = {
        "tool-executor": ["INSERT INTO decisions (request_id, decision, reason, message, responder, message_id, "
                          "decided_at) VALUES ('apr_x', 'approve', '', '', 'x', 'm', now())",
                          "UPDATE tool_calls SET arguments = '{}'", "UPDATE approval_requests SET status = 'approved'"],
        "publisher": ["UPDATE outbox SET body = ''", "INSERT INTO decisions (request_id) VALUES ('apr_x')",
                      "DELETE FROM outbox"],
        "console": ["UPDATE approval_requests SET status = 'approved'", "DELETE FROM inbox"],
        # It reads a step's transcript and tool menu (claim-check) and nothing else.
        "model-step": ["UPDATE transcript SET entry = '{}'", "UPDATE tool_menus SET descriptions = '[]'",
                       "INSERT INTO tool_menus (digest, descriptions, created_at) VALUES ('d', '[]', now())",
                       "SELECT count(*) FROM decisions",
                       "SELECT count(*) FROM outbox", "INSERT INTO decisions (request_id) VALUES ('apr_x')"],
    }
    allowed = {
        "tool-executor": ["SELECT count(*) FROM decisions", "UPDATE execution_claims SET attempts = attempts"],
        "publisher": ["UPDATE outbox SET sent_at = sent_at", "SELECT count(*) FROM hook_deliveries"],
        "console": ["SELECT count(*) FROM decisions"],
        "model-step": ["SELECT count(*) FROM transcript", "SELECT count(*) FROM tool_menus"],
        "approval-ledger": ["UPDATE approval_requests SET status = status"],
    }
    for identity, statements in forbidden.items():
        async with pg_deployment.engine(identity) as engine:
            for statement in statements:
                with pytest.raises(ProgrammingError, match="permission denied"):
                    async with engine.begin() as conn:
                        await conn.execute(text(statement))
    for identity, statements in allowed.items():
        async with pg_deployment.engine(identity) as engine, engine.begin() as conn:
            for statement in statements:
                await conn.execute(text(statement))
