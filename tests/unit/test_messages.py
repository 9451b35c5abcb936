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
    assert topology.route(response) == ("ns.commands", "approval.respond")
    from shared.messages import TurnCompleted

    assert topology.route(TurnCompleted(session_id="s1", turn_id="t", text="x")) == ("ns.events", "turn.completed.s1")


def test_every_queue_is_a_quorum_queue_with_a_delivery_limit_and_a_dead_letter_exchange():
    queue = Topology("ns", delivery_limit=7).inbound_queue("approval.respond")
    assert queue.name == "ns.ledger.responses"
    assert queue.arguments["x-delivery-limit"] == 7
    assert queue.arguments["x-dead-letter-exchange"] == "ns.dead"
    assert queue.arguments["x-queue-type"] == "quorum"


def test_the_migration_head_read_from_file_names_is_alembics_head():
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from shared.ledger.database import MIGRATIONS, head_revision

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    assert head_revision() == ScriptDirectory.from_config(config).get_current_head()
