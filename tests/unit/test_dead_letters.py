"""What an operator is told about a parked message: every one names a reason (invariant 9)."""

from datetime import UTC, datetime

from shared.dead_letters import describe


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
