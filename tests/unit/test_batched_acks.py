"""Acks in batches (shared/bus.py): the acks one turn of the loop asks for go out as
one `multiple` ack only as far as every earlier delivery of the channel was acked by
its own handler (or nacked). A `multiple` ack acks every unacked delivery up to its
tag, so reaching one still being handled would ack a message whose effect is not
durable: after a crash it would be lost instead of redelivered."""

import asyncio

from shared.bus import Bus


class Channel:
    """Records the frames; with `slow`, each takes a few turns of the loop to go out."""

    def __init__(self, slow: bool = False) -> None:
        self.frames: list[tuple[str, int, bool]] = []
        self.slow = slow

    async def send(self, frame: tuple[str, int, bool]) -> None:
        for _ in range(6 if self.slow else 0):
            await asyncio.sleep(0)
        self.frames.append(frame)


def as_the_broker_takes(frames: list[tuple[str, int, bool]], delivered: int) -> set[int]:
    """Apply the frames as RabbitMQ does (a tag it no longer holds unacked closes the
    channel: PRECONDITION_FAILED, unknown delivery tag); what stays unacked."""
    unacked = set(range(1, delivered + 1))
    for kind, tag, multiple in frames:
        assert tag in unacked, f"{kind} {tag}: unknown delivery tag (frames {frames})"
        unacked -= {t for t in unacked if t <= tag} if multiple else {tag}
    return unacked


class Delivery:
    def __init__(self, channel: Channel, tag: int) -> None:
        self.channel = channel
        self.delivery_tag = tag

    async def ack(self, multiple: bool = False) -> None:
        await self.channel.send(("ack", self.delivery_tag, multiple))

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        await self.channel.send(("nack", self.delivery_tag, multiple))


def bus() -> Bus:
    return Bus("amqp://nobody@127.0.0.1:1/", prefetch=64)


async def test_a_multiple_ack_never_reaches_a_delivery_its_handler_has_not_acked():
    the_bus, channel = bus(), Channel()
    d = {tag: Delivery(channel, tag) for tag in range(1, 8)}
    # 3 is still being handled (another lane's group): 1 and 2 go together, 4 alone.
    await asyncio.gather(*(the_bus.ack(d[tag]) for tag in (1, 2, 4)))  # type: ignore[arg-type]
    assert channel.frames == [("ack", 2, True), ("ack", 4, False)]
    channel.frames.clear()
    # 3 and 5 together reach 5: 4 was acked already, nothing below 5 is unhandled.
    await asyncio.gather(*(the_bus.ack(d[tag]) for tag in (5, 3)))  # type: ignore[arg-type]
    assert channel.frames == [("ack", 5, True)]
    channel.frames.clear()
    # 6 not yet seen by any handler (its delivery may not even have reached the loop): 7 alone.
    await the_bus.ack(d[7])  # type: ignore[arg-type]
    assert channel.frames == [("ack", 7, False)]


async def test_a_nacked_delivery_does_not_stop_the_acks_after_it_and_each_turn_acks_its_own():
    the_bus, channel = bus(), Channel()
    d = {tag: Delivery(channel, tag) for tag in range(1, 6)}
    await the_bus.nack(d[1])  # type: ignore[arg-type]
    await asyncio.gather(*(the_bus.ack(d[tag]) for tag in (2, 3)))  # type: ignore[arg-type]
    await the_bus.ack(d[4])  # type: ignore[arg-type]  # a later turn: alone
    assert channel.frames == [("nack", 1, False), ("ack", 3, True), ("ack", 4, False)]


async def test_the_channel_a_reconnect_opens_numbers_its_deliveries_afresh():
    the_bus, old, new = bus(), Channel(), Channel()
    await asyncio.gather(*(the_bus.ack(Delivery(old, tag)) for tag in (1, 2)))  # type: ignore[arg-type]
    # The new channel's 1 is not the old channel's: 2 may not be acked with it unless 1 is.
    await the_bus.ack(Delivery(new, 2))  # type: ignore[arg-type]
    assert old.frames == [("ack", 2, True)]
    assert new.frames == [("ack", 2, False)]


async def test_a_multiple_ack_never_overtakes_an_ack_still_being_sent_that_it_would_cover():
    the_bus, channel = bus(), Channel(slow=True)
    d = {tag: Delivery(channel, tag) for tag in range(1, 6)}

    async def a_turn_later(*tags: int) -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await asyncio.gather(*(the_bus.ack(d[tag]) for tag in tags))  # type: ignore[arg-type]

    # 1 and 3 go out one by one (2 still handled); 2 and 4 are acked while they do.
    await asyncio.gather(*(the_bus.ack(d[tag]) for tag in (1, 3)), a_turn_later(2, 4), the_bus.nack(d[5]))  # type: ignore[arg-type]
    assert as_the_broker_takes(channel.frames, delivered=5) == set()
