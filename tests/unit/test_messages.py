"""Message schemas: envelopes, validation, ids."""

import pytest
from pydantic import ValidationError

from shared.messages import ANY_MESSAGE, RespondToApproval, StartTurn, mint
from shared.topology import Topology


def test_every_message_carries_an_envelope_with_id_session_and_schema_version():
    message = StartTurn(session_id="s1", text="hi")
    decoded = ANY_MESSAGE.validate_json(message.model_dump_json())
    assert decoded == message
    assert decoded.message_id.startswith("msg_") and decoded.schema_version == 1


def test_ids_are_minted_with_128_random_bits():
    ids = {mint("apr") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == len("apr_") + 32 for i in ids)


@pytest.mark.parametrize("body", [
    b'{"type": "approval.respond", "session_id": "s", "request_id": "r", "decision": "maybe", "args_digest": "d"}',
    b'{"type": "approval.respond", "session_id": "s.with.dots", "request_id": "r", "decision": "approve", "args_digest": "d"}',
    b'{"type": "approval.respond", "session_id": "s", "request_id": "r", "decision": "approve", "args_digest": "d", "extra": 1}',
    b'{"type": "turn.start", "session_id": "s", "text": "", "schema_version": 1}',
    b'{"type": "turn.start", "session_id": "s", "text": "x", "schema_version": 2}',
    b'{"type": "no.such", "session_id": "s"}',
])
def test_malformed_or_unknown_messages_fail_validation(body):
    with pytest.raises(ValidationError):
        ANY_MESSAGE.validate_json(body)


def test_commands_go_to_their_queue_and_events_to_the_topic_exchange_by_type_and_session():
    topology = Topology("ns")
    response = RespondToApproval(session_id="s1", request_id="r", decision="approve", args_digest="d")
    assert topology.route(response) == ("ns.channels", "approval.respond")
    from shared.messages import TurnCompleted

    assert topology.route(TurnCompleted(session_id="s1", turn_id="t", text="x")) == ("ns.events", "turn.completed.s1")


def test_every_queue_is_a_quorum_queue_with_a_delivery_limit_and_a_dead_letter_exchange():
    queue = Topology("ns", delivery_limit=7).inbound_queue("approval.respond")
    assert queue.name == "ns.ledger.responses"
    assert queue.arguments["x-delivery-limit"] == 7
    assert queue.arguments["x-dead-letter-exchange"] == "ns.dead"
    assert queue.arguments["x-queue-type"] == "quorum"


def test_a_classic_queue_is_version_2_with_a_dead_letter_exchange_and_no_broker_delivery_limit():
    queue = Topology("ns", delivery_limit=7, queue_type="classic").inbound_queue("approval.respond")
    assert queue.arguments["x-queue-type"] == "classic"
    assert queue.arguments["x-queue-version"] == 2
    assert queue.arguments["x-dead-letter-exchange"] == "ns.dead"
    assert "x-delivery-limit" not in queue.arguments  # the consumer counts (shared/consuming.py)


def test_the_migration_head_read_from_file_names_is_alembics_head():
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from shared.ledger.database import MIGRATIONS, head_revision

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    assert head_revision() == ScriptDirectory.from_config(config).get_current_head()


def test_each_command_comes_through_its_senders_own_exchange_and_counts_only_from_that_sender():
    topology = Topology("ns")
    assert topology.inbound_exchange("approval.respond").name == "ns.channels"
    assert topology.inbound_exchange("step.completed").name == "ns.model-step.reports"
    assert topology.inbound_exchange("tool.completed").name == "ns.tool-executor.reports"
    assert topology.inbound_exchange("tool.execute").name == "ns.commands"
    assert topology.may_send("approval.respond", "ns.channel.cli")
    assert topology.may_send("step.completed", "ns.model-step")
    for user in ("ns.model-step", "ns.tool-executor", "ns.approval-ledger", "guest", "other.channel.cli", None):
        assert not topology.may_send("approval.respond", user), user
    assert not topology.may_send("tool.completed", "ns.model-step")
    assert not topology.may_send("step.completed", "ns.channel.cli")


def test_a_service_may_write_only_its_own_exchange_and_the_dead_letters_and_read_only_its_own_queues():
    """Reading an exchange is what binding to it needs: no service reads any exchange
    (setup binds every queue), so none can bind a queue to the commands."""
    import re

    topology = Topology("ns")
    exchanges = ("ns.channels", "ns.commands", "ns.events", "ns.dead", "ns.model-step.reports",
                 "ns.tool-executor.reports")
    model_step = topology.permissions("model-step")
    assert re.fullmatch(model_step.write, "ns.model-step.reports") and re.fullmatch(model_step.write, "ns.dead")
    for other in ("ns.channels", "ns.commands", "ns.events", "ns.tool-executor.reports", "ns.ledger.responses",
                  "ns.model-step.requests"):
        assert not re.fullmatch(model_step.write, other), other
    assert re.fullmatch(model_step.read, "ns.model-step.requests")
    for service in ("model-step", "tool-executor", "approval-ledger", "publisher", "console"):
        allowed = topology.permissions(service)
        assert allowed.configure == "^$", service
        assert not [e for e in exchanges if re.fullmatch(allowed.read, e)], service
    assert not re.fullmatch(model_step.read, "ns.ledger.responses")
    channel = topology.permissions("channel.cli")
    assert re.fullmatch(channel.write, "ns.channels") and not re.fullmatch(channel.write, "ns.commands")
    assert [e for e in exchanges if re.fullmatch(channel.read, e)] == ["ns.events"]
    for queue in topology.all_queue_names():
        assert not re.fullmatch(channel.read, queue) and not re.fullmatch(channel.write, queue), queue
    assert re.fullmatch(channel.read, "amq.gen-abc") and re.fullmatch(channel.configure, "amq.gen-abc")
    publisher = topology.permissions("publisher")
    assert {bool(re.fullmatch(publisher.write, n)) for n in ("ns.commands", "ns.events")} == {True}
    assert not re.fullmatch(publisher.write, "ns.channels") and publisher.read == "^$"
    ledger = topology.permissions("approval-ledger")
    assert not any(re.fullmatch(ledger.write, n) for n in ("ns.channels", "ns.commands", "ns.events"))
    assert all(re.fullmatch(ledger.read, n) for n in ("ns.ledger.turns", "ns.ledger.parked"))
    console = topology.permissions("console")
    assert [q for q in topology.all_queue_names() if re.fullmatch(console.read, q)] == ["ns.dead-letters"]
    assert console.write == "^$"


def test_a_counted_approval_is_an_event_that_says_how_many_approved_and_how_many_must():
    from shared.messages import EVENT, EVENT_TYPES, ApprovalCounted

    counted = ApprovalCounted(session_id="s1", request_id="apr_1", call_id="call_1", responder="ann", count=1,
                              required=2)
    assert "approval.counted" in EVENT_TYPES
    assert EVENT.validate_json(counted.model_dump_json()) == counted
    assert Topology("ns").route(counted) == ("ns.events", "approval.counted.s1")


def test_a_turn_may_name_who_started_it_and_need_not():
    assert StartTurn(session_id="s1", text="hi", started_by="sam").started_by == "sam"
    assert StartTurn(session_id="s1", text="hi").started_by is None
    with pytest.raises(ValidationError):
        StartTurn(session_id="s1", text="hi", started_by="")
