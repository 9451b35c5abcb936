"""A slow python tool keeps its claim while it runs (invariant 4): it runs off the
executor's event loop, so the lease heartbeat keeps beating, and a redelivery of its
tool.execute that arrives meanwhile (at a second executor) waits for it and reports
its result instead of running the call again, or of closing it as outcome-unknown."""

import asyncio
import time

import pytest

from services.tool_executor.tools import tool_data_dir
from shared.ledger.tables import Closure, ExecutionClaim
from shared.messages import ExecuteTool, StartTurn, mint
from tests.fixture_tools import runs_folder
from tests.harness import assert_nothing_left_in_any_queue, eventually, next_event, rows

# The harness's SIGNOFF_CLAIM_LEASE_SECONDS; the fixture tools sleep 4 s.
LEASE_SECONDS = 1.5
REDELIVERIES = 4


def lines(path):
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize(("prefix", "counter", "effect"), [
    ("sleep-count", "sleep-count", "idempotent"),
    ("sleep-post", "sleep-post", "outward"),
])
async def test_a_python_tool_sleeping_past_its_lease_runs_once_while_its_command_is_redelivered(
        deployment, prefix, counter, effect):
    deployment.start()
    deployment.start("tool-executor#2")  # where a redelivery can land while the first one runs the tool
    session_id = f"{prefix}-{mint('ses')}"
    folder = runs_folder(tool_data_dir(deployment.data_dir))
    async with deployment.console() as console, deployment.observer() as observer:
        copies = await observer.declare_queue(exclusive=True)
        await copies.bind(f"{deployment.namespace}.commands", routing_key="tool.execute")
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="sleep on it"))

        async def tool_started():
            return lines(folder / f"{counter}.started")

        await eventually(tool_started, timeout=20)
        started = time.monotonic()
        real = ExecuteTool.model_validate_json((await eventually(lambda: copies.get(no_ack=True, fail=False))).body)
        # Past the lease: without a heartbeat, its claim and its Redis lease have lapsed by now.
        await asyncio.sleep(max(0.0, started + LEASE_SECONDS + 0.7 - time.monotonic()))
        assert not lines(folder / f"{counter}.ran"), "the tool is still running"
        async with deployment.console(identity="publisher") as publisher:
            for _ in range(REDELIVERIES):  # the same command, as the publisher relays it again
                await publisher.send(real)

        closed = await next_event(events, "tool.closed", timeout=30)
        await next_event(events, "turn.completed", timeout=30)
        # Every redelivery handled (each reports the recorded result), nothing parked.
        await assert_nothing_left_in_any_queue(console, deployment.namespace, timeout=30)

    assert closed.kind == "output", f"an {effect} call that ran was closed as {closed.kind}"
    assert len(lines(folder / f"{counter}.started")) == 1, "the call started once"
    assert len(lines(folder / f"{counter}.ran")) == 1, "the call ran once"
    [claim] = await rows(deployment, ExecutionClaim, call_id=real.call_id)
    assert (claim.status, claim.outcome, claim.attempts) == ("finished", "output", 1)
    [closure] = await rows(deployment, Closure, call_id=real.call_id)
    assert closure.kind == "output"
