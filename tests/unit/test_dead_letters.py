"""What an operator is told about a parked message: every one names a reason (invariant 9)."""

from datetime import UTC, datetime

import pytest

from shared.dead_letters import describe, proven_sender
from shared.topology import Topology


def test_a_message_parked_by_rabbitmq_itself_shows_the_brokers_reason_queue_and_time():
    headers = {"x-death": [{"reason": "delivery_limit", "queue": "ns.ledger.steps", "count": 1,
                            "time": datetime(2026, 11, 30, 12, 0, tzinfo=UTC)}]}
    parked = describe("m1", b'{"type": "step.completed", "session_id": "ses_1"}', headers)
    assert (parked.reason, parked.consumer, parked.parked_at) == (
        "delivery_limit", "queue ns.ledger.steps", "2026-11-30T12:00:00+00:00")
    assert parked.detail.startswith("parked by RabbitMQ from ns.ledger.steps after 1 time(s)")
    assert (parked.message_type, parked.session_id) == ("step.completed", "ses_1")


def test_a_consumers_reason_and_detail_win_over_the_brokers():
    headers = {"x-signoff-reason": "invalid", "x-signoff-detail": "decision: bad", "x-signoff-consumer": "ledger",
               "x-signoff-parked-at": "2026-11-30T12:00:01+00:00", "x-death": [{"reason": "rejected"}]}
    parked = describe("m1", b"{}", headers)
    assert (parked.reason, parked.detail, parked.consumer, parked.parked_at) == (
        "invalid", "decision: bad", "ledger", "2026-11-30T12:00:01+00:00")


def test_a_body_that_is_not_an_envelope_is_still_listed_with_what_is_known():
    parked = describe(None, b"\xff{not json", {})
    assert (parked.message_id, parked.message_type, parked.session_id, parked.reason) == ("?", "?", "?", "unknown")


# --- who parked it, proven ------------------------------------------------------------

TOPOLOGY = Topology("ns")


def consumer_parked(kind: str, parked_by: str | None, consumer: str, sender: str):
    headers = {"x-signoff-reason": "invalid", "x-signoff-consumer": consumer, "x-signoff-sender": sender}
    return describe("m1", f'{{"type": "{kind}", "session_id": "ses_1"}}'.encode(), headers, parked_by)


def broker_parked(kind: str, user_id: str | None, queue: str):
    headers = {"x-death": [{"reason": "delivery_limit", "queue": queue, "count": 1}]}
    return describe("m1", f'{{"type": "{kind}", "session_id": "ses_1"}}'.encode(), headers, user_id)


@pytest.mark.parametrize(("parked", "sender"), [
    # Parked by the consumer of its type's queue, naming a sender that may send it: that sender.
    (consumer_parked("tool.execute", "ns.tool-executor", "tool-executor", "ns.publisher"), "ns.publisher"),
    (consumer_parked("step.completed", "ns.approval-ledger", "approval-ledger", "ns.model-step"), "ns.model-step"),
    (consumer_parked("turn.start", "ns.approval-ledger", "approval-ledger", "ns.channel.cli"), "ns.channel.cli"),
    # Parked by RabbitMQ from its type's queue: the user_id it kept, if that one may send it.
    (broker_parked("tool.execute", "ns.publisher", "ns.tool-executor.requests"), "ns.publisher"),
    (broker_parked("approval.respond", "ns.channel.cli", "ns.ledger.responses"), "ns.channel.cli"),
    # Forgeries: another identity claims to be the consumer, or names a sender that may not send it.
    (consumer_parked("tool.execute", "ns.model-step", "tool-executor", "ns.publisher"), None),
    (consumer_parked("tool.completed", "ns.model-step", "approval-ledger", "ns.tool-executor"), None),
    (consumer_parked("tool.completed", None, "approval-ledger", "ns.tool-executor"), None),
    (consumer_parked("tool.completed", "ns.tool-executor", "approval-ledger", "ns.tool-executor"), None),
    (consumer_parked("step.requested", "ns.tool-executor", "model-step", "ns.publisher"), None),
    # The ledger really parked it, but a model-step sent it (a tool.completed in a step's report).
    (consumer_parked("tool.completed", "ns.approval-ledger", "approval-ledger", "ns.model-step"), None),
    # The right identity, but the wrong consumer named, or a consumer of another queue.
    (consumer_parked("tool.execute", "ns.approval-ledger", "approval-ledger", "ns.publisher"), None),
    (consumer_parked("step.completed", "ns.approval-ledger", "tool-executor", "ns.model-step"), None),
    (broker_parked("tool.execute", "ns.model-step", "ns.tool-executor.requests"), None),
    (broker_parked("tool.execute", None, "ns.tool-executor.requests"), None),
    (broker_parked("tool.execute", "ns.publisher", "ns.model-step.requests"), None),
    (broker_parked("turn.start", "ns.tool-executor", "ns.ledger.turns"), None),
    (broker_parked("turn.start", "other.channel.cli", "ns.ledger.turns"), None),
    # Not a message Signoff takes: nothing to prove it is.
    (consumer_parked("?", "ns.approval-ledger", "approval-ledger", "ns.channel.cli"), None),
])
def test_a_parked_copy_proves_its_sender_only_through_the_broker_or_its_queues_consumer(parked, sender):
    assert proven_sender(parked, TOPOLOGY) == sender
