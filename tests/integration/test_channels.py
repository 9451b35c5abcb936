"""A channel speaks only for its people (docs/design.md, "Trust boundaries"): a turn's
starter, a cancel's canceller and a response's responder must be principals the
sending channel (its broker user, which RabbitMQ vouches for) is registered for; a
response counts only from the channel whose key signed it; and only a turn's
starter, an approver of what it waits on, or an operator may cancel it.

Each attack is made as the attacker would be: channel `inbox`, registered for alice
alone, with its own broker user and key from the deployment's keys folder."""

import asyncio
import re

from sqlalchemy import func, select

from shared import keyring
from shared.ledger.tables import ApprovalRequest, Decision, Session, Turn
from shared.messages import CancelTurn, RespondToApproval, StartTurn, mint
from shared.signatures import sign
from tests.harness import CLI_PRINCIPALS, drain_events, next_event, rows
from tests.integration.test_command_line import signoff


def register_inbox_for_alice(deployment):
    """Channel `inbox`, for alice only: its key, and (at start) its broker user."""
    keyring.create(deployment.settings.keys_path, {"inbox": ["alice"]})
    return keyring.channel_private_key(deployment.settings.keys_path, "inbox")


def signed_by(key, key_id: str, response: RespondToApproval) -> RespondToApproval:
    unsigned = response.model_copy(update={"key_id": key_id})
    return unsigned.model_copy(update={"signature": sign(key, unsigned.signed_part())})


async def rejected_as(events, message) -> str:
    rejected = await next_event(events, "message.rejected")
    assert rejected.rejected_message_id == message.message_id, rejected
    return rejected.reason_code


async def test_a_channel_for_alice_cannot_start_a_turn_as_carol_and_alice_starts_hers(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    register_inbox_for_alice(deployment)
    deployment.start()
    async with deployment.console(identity="channel.inbox") as inbox:
        # As carol, in a session whose tool forbids its starter to approve: alice would approve "someone else's" call.
        forged_session = f"separated-{mint('ses')}"
        events = await inbox.watch(forged_session)
        as_carol = StartTurn(session_id=forged_session, text="go", started_by="carol")
        await inbox.send(as_carol)
        assert await rejected_as(events, as_carol) == "wrong_principal"
        await asyncio.sleep(0.5)
        assert [e.type async for e in drain_events(events)] == [], "no turn, no request"
        assert await rows(deployment, Turn, session_id=forged_session) == []
        assert await rows(deployment, Session, id=forged_session) == [], "a refused turn opens no session"

        own = mint("ses")
        events = await inbox.watch(own)
        await inbox.send(StartTurn(session_id=own, text="go", started_by="alice"))
        requested = await next_event(events, "approval.requested")
    [turn] = await rows(deployment, Turn, session_id=own)
    assert (turn.started_by, requested.session_id) == ("alice", own)
    assert sink.counts["/sink"] == 0


async def test_a_channel_for_alice_cannot_cancel_bobs_session_as_bob_nor_as_alice_and_the_rightful_cancel(
        deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    register_inbox_for_alice(deployment)
    deployment.start()
    async with deployment.console() as cli, deployment.console(identity="channel.inbox") as inbox:
        # Bob's session waits on a call only ann may approve: alice is neither its starter, an approver nor
        # an operator.
        bobs = f"escalated-{mint('ses')}"
        events = await cli.watch(bobs)
        await cli.send(StartTurn(session_id=bobs, text="go", started_by="bob"))
        requested = await next_event(events, "approval.requested")
        in_bobs_name = CancelTurn(session_id=bobs, cancelled_by="bob", reason="mine now")
        await inbox.send(in_bobs_name)
        assert await rejected_as(events, in_bobs_name) == "wrong_principal"
        as_alice = CancelTurn(session_id=bobs, cancelled_by="alice")
        await inbox.send(as_alice)
        assert await rejected_as(events, as_alice) == "may_not_cancel"
        await asyncio.sleep(0.5)
        assert "turn.cancelled" not in [e.type async for e in drain_events(events)]
        [session] = await rows(deployment, Session, id=bobs)
        [request] = await rows(deployment, ApprovalRequest, id=requested.request_id)
        assert (session.status, request.status) == ("waiting", "pending"), "bob's session still runs"

        # Alice cancels her own session.
        hers = mint("ses")
        events = await inbox.watch(hers)
        await inbox.send(StartTurn(session_id=hers, text="go", started_by="alice"))
        await next_event(events, "approval.requested")
        await inbox.send(CancelTurn(session_id=hers, cancelled_by="alice"))
        cancelled = await next_event(events, "turn.cancelled", "message.rejected")
        assert (cancelled.type, cancelled.cancelled_by) == ("turn.cancelled", "alice")

        # Bob, an approver of the call sam's session waits on (a reviewer), cancels it.
        sams = f"reviewed-{mint('ses')}"
        events = await cli.watch(sams)
        await cli.send(StartTurn(session_id=sams, text="go", started_by="sam"))
        await next_event(events, "approval.requested")
        await cli.send(CancelTurn(session_id=sams, cancelled_by="bob"))
        cancelled = await next_event(events, "turn.cancelled", "message.rejected")
        assert (cancelled.type, cancelled.cancelled_by) == ("turn.cancelled", "bob")
    assert sink.counts["/escalated"] == sink.counts["/sink"] == sink.counts["/reviewed"] == 0


async def test_a_response_signed_with_one_channels_key_is_refused_from_another_channels_broker_user(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    inbox_key = register_inbox_for_alice(deployment)
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as cli, deployment.console(identity="channel.inbox") as inbox:
        events = await cli.watch(session_id)
        await cli.send(StartTurn(session_id=session_id, text="go", started_by="bob"))
        requested = await next_event(events, "approval.requested")

        def approval(responder: str) -> RespondToApproval:
            return RespondToApproval(session_id=session_id, request_id=requested.request_id, decision="approve",
                                     args_digest=requested.args_digest, responder=responder)

        # The CLI's signed approval, sent on by the inbox channel (as one it took off the bus would be).
        cli_signed = cli.sign(approval("tester"))
        await inbox.send(cli_signed)
        assert await rejected_as(events, cli_signed) == "wrong_channel"
        # And the other way round.
        inbox_signed = signed_by(inbox_key, "inbox", approval("alice"))
        await cli.send(inbox_signed)
        assert await rejected_as(events, inbox_signed) == "wrong_channel"
        async with deployment.ledger() as ledger, ledger() as db:
            assert await db.scalar(select(func.count()).select_from(Decision)) == 0, "nothing was decided"
        [request] = await rows(deployment, ApprovalRequest, id=requested.request_id)
        assert request.status == "pending" and sink.counts["/sink"] == 0

        # Alice's approval, signed by her channel and sent by it: it counts.
        await inbox.send(signed_by(inbox_key, "inbox", approval("alice")))
        decided = await next_event(events, "approval.decided")
        assert decided.responder == "alice"
        await next_event(events, "turn.completed", timeout=30)
    assert sink.counts["/sink"] == 1


async def test_the_cli_refuses_to_approve_as_someone_its_channel_is_not_registered_for_before_sending(
        sqlite_deployment, sink):
    deployment = sqlite_deployment
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    async with deployment.console() as cli:
        session_id = mint("ses")
        events = await cli.watch(session_id)
        await cli.send(StartTurn(session_id=session_id, text="go", started_by="bob"))
        requested = await next_event(events, "approval.requested")
        said = await asyncio.to_thread(signoff, deployment, "approve", requested.request_id, "--as", "carol", "--yes",
                                       check=False)
        assert "signoff: channel 'cli' may not act as 'carol'" in said and "Nothing was sent." in said, said
        assert "signoff setup --cli-principal carol" in said
        await asyncio.sleep(0.5)
        assert [e.type async for e in drain_events(events)] == [], "nothing reached the ledger"
        [request] = await rows(deployment, ApprovalRequest, id=requested.request_id)
        assert request.status == "pending"
        # By default the CLI acts as the OS user running it, whom setup registered.
        said = await asyncio.to_thread(signoff, deployment, "approve", requested.request_id, "--yes")
        assert f"approve sent for {requested.request_id}" in said
        decided = await next_event(events, "approval.decided")
        assert decided.responder == keyring.os_user()
    assert sink.counts["/sink"] == 1


def test_signoff_setup_registers_the_cli_for_the_os_user_and_the_listed_people_and_keeps_them_when_run_again(
        sqlite_deployment):
    deployment = sqlite_deployment
    deployment.setup()
    keys = deployment.settings.keys_path
    said = signoff(deployment, "setup", "--cli-principal", "zoe", "--cli-principal", "yan")
    assert re.search(r"registered channel cli \(public key .*, may assert .*zoe, yan\)", said), said
    assert keyring.registered_principals(keys, "cli") == list(dict.fromkeys([*CLI_PRINCIPALS, "zoe", "yan"]))
    again = signoff(deployment, "setup")
    assert "registered channel cli" not in again, "nothing changed"
    assert keyring.registered_principals(keys, "cli") == list(dict.fromkeys([*CLI_PRINCIPALS, "zoe", "yan"]))
    refused = signoff(deployment, "setup", "--cli-principal", "*", check=False)
    assert "--cli-principal '*': name one person" in refused
    assert "*" not in keyring.registered_principals(keys, "cli")
