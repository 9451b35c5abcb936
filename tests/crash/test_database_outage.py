"""PostgreSQL stopped for a minute mid-flow: the services wait for it instead of
spending their messages' deliveries, and when it is back every in-flight approval
completes once and nothing is dead-lettered (invariant 9).

The database is shared by every test on this machine, so this test runs in the
serial pass after the parallel suite (`-m "broker_restart or database_outage"`)."""

import asyncio
import subprocess
from pathlib import Path

import pytest

from shared.messages import RespondToApproval, mint
from tests.harness import assert_nothing_left_in_any_queue, next_event, start_and_wait_for_approval

pytestmark = [
    pytest.mark.crash,
    pytest.mark.database_outage,
    pytest.mark.slow(reason="PostgreSQL is stopped for a minute mid-flow"),
]
OUTAGE_SECONDS = 60


def postgresql(action: str) -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action], check=True, timeout=120)


async def test_postgresql_stopped_for_a_minute_mid_flow_dead_letters_nothing_and_runs_every_call_once(
    pg_deployment, sink
):
    deployment = pg_deployment
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    async with deployment.console() as console:
        waiting = [await start_and_wait_for_approval(console, mint("ses")) for _ in range(3)]
        responses = [console.sign(RespondToApproval(session_id=r.session_id, request_id=r.request_id,
                                                    decision="approve", args_digest=r.args_digest, responder="t"))
                     for _, r in waiting]
        await asyncio.to_thread(postgresql, "stop")
        try:
            for response in responses:  # answered while the ledger's database is away
                await console.send(response)
            await asyncio.sleep(OUTAGE_SECONDS)
        finally:
            await asyncio.to_thread(postgresql, "start")
        for events, _ in waiting:
            await next_event(events, "turn.completed", timeout=90)
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    assert sink.counts["/sink"] == 3, "every approved call ran, once"
    for service, process in deployment.processes.items():
        assert process.poll() is None, f"{service} died with the database instead of waiting for it"
