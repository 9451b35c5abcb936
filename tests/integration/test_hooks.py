"""Lifecycle hooks against the real publisher: no hook holds up another (a removed one,
or one whose receiver hangs, even with more than a hundred deliveries due), and a
delivery is given up after its retry budget, with its reason on the row and in an
error an operator's log search can parse. A hook whose secret is unset or short stops
the publisher at start."""

import asyncio
import json
import threading
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import insert

from services.approval_ledger.store_database import database_store
from services.publisher.hooks import delivery_id
from shared.ledger.database import migrate, notify_channel
from shared.ledger.tables import HookDelivery
from shared.messages import TurnCompleted, mint, now
from shared.topology import Topology
from tests.harness import eventually, log_records, rows
from tests.sink import HOOK_SECRET, Sink


def configure(deployment, tmp_path, *hooks: dict) -> None:
    path = tmp_path / "hooks.yaml"
    path.write_text(json.dumps({"hooks": [{"events": ["turn.completed"], "secret": HOOK_SECRET, **h} for h in hooks]}))
    deployment.extra_env["SIGNOFF_HOOKS_FILE"] = str(path)


async def backlog(deployment, hook: str, count: int) -> None:
    """`count` deliveries of `hook` due for an hour, older than anything the test commits."""
    deployment.setup()
    async with deployment.engine("publisher") as engine:
        await migrate(engine, deployment.settings)  # SQLite: no service has made the file yet
        since = now() - timedelta(hours=1)
        values = []
        for n in range(count):
            message_id = mint("msg")
            values.append({"id": delivery_id(hook, message_id), "hook": hook, "message_id": message_id,
                           "event_type": "turn.completed", "body": "{}", "attempts": 0,
                           "next_attempt_at": since + timedelta(milliseconds=n), "created_at": since})
        async with engine.begin() as conn:
            await conn.execute(insert(HookDelivery), values)


async def commit_event(deployment) -> TurnCompleted:
    settings = deployment.settings
    async with deployment.engine("approval-ledger") as ledger:
        async with database_store(ledger, Topology(settings.namespace), notify_channel(settings)) as uow:
            event = TurnCompleted(session_id=mint("ses"), turn_id=mint("trn"), text="done")
            uow.emit(None, event)
            await uow.commit()
    return event


def gave_up(deployment) -> list[dict]:
    """The publisher's `hook.gave_up` errors, as an operator's log search reads them."""
    return [json.loads(line["message"].split("hook.gave_up ", 1)[1]) for line in
            log_records(deployment.log_path("publisher")) if line["level"] == "ERROR" and
            line["message"].startswith("hook.gave_up ")]


@contextmanager
def hanging_receiver():
    """A hook receiver that answers nothing until the test ends; it counts what it holds."""
    done = threading.Event()
    held = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            held.append(self.headers.get("Signoff-Delivery"))
            done.wait(60)
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    class Server(ThreadingHTTPServer):
        # Accepts every connection, as a real server that stopped answering does (the
        # default backlog of 5 would reset the rest, and free the sender's connections).
        request_queue_size = 512
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", held
    finally:
        done.set()
        server.shutdown()
        server.server_close()


async def test_a_removed_hooks_deliveries_are_given_up_and_never_hold_up_another_hooks(deployment, sink, tmp_path):
    # `crm` was configured once and left 150 deliveries due; now only `audit` is.
    configure(deployment, tmp_path, {"name": "audit", "url": f"{sink.url}/audit"})
    await backlog(deployment, "crm", 150)
    deployment.start("publisher")
    event = await commit_event(deployment)

    async def delivered():
        return sink.counts["/audit"]

    await eventually(delivered, timeout=10)
    assert sink.headers_of("/audit", "Signoff-Delivery") == [delivery_id("audit", event.message_id)]
    retired = await rows(deployment, HookDelivery, hook="crm")
    assert len(retired) == 150
    assert {(r.given_up_reason, r.given_up_at is not None, r.delivered_at, r.attempts) for r in retired} == {
        ("hook_removed", True, None, 0)}
    assert gave_up(deployment) == [{"reason": "hook_removed", "hook": "crm", "deliveries": 150}]


async def test_a_hook_whose_receiver_hangs_holds_only_its_own_deliveries_and_never_another_hooks(
        deployment, sink, tmp_path):
    deployment.extra_env["SIGNOFF_HOOK_CONCURRENCY"] = "4"
    with hanging_receiver() as (stuck_url, held):
        configure(deployment, tmp_path, {"name": "stuck", "url": stuck_url, "timeout_seconds": 30},
                  {"name": "audit", "url": f"{sink.url}/audit"})
        await backlog(deployment, "stuck", 150)
        deployment.start("publisher")

        async def stuck_full():
            return len(held) >= 4

        await eventually(stuck_full, timeout=10)
        event = await commit_event(deployment)

        async def delivered():
            return sink.counts["/audit"]

        # The other hook's delivery goes out at once, while `stuck` holds all it may hold.
        await eventually(delivered, timeout=5)
        assert sink.headers_of("/audit", "Signoff-Delivery") == [delivery_id("audit", event.message_id)]
        await asyncio.sleep(0.5)
        assert len(held) == 4, "a hook has at most SIGNOFF_HOOK_CONCURRENCY deliveries in flight"


async def test_retries_stop_after_the_budget_and_the_delivery_is_given_up_with_its_reason(deployment, tmp_path):
    deployment.extra_env["SIGNOFF_HOOK_MAX_ATTEMPTS"] = "3"
    with Sink() as failing:
        failing.status = 500
        configure(deployment, tmp_path, {"name": "flaky", "url": f"{failing.url}/flaky"},
                  {"name": "picky", "url": f"{failing.url}/picky", "max_attempts": 2})
        deployment.start("publisher")
        event = await commit_event(deployment)

        async def spent():
            return failing.counts["/flaky"] >= 3 and failing.counts["/picky"] >= 2

        await eventually(spent, timeout=10)
        await asyncio.sleep(2.0)  # the next attempt would come 0.8 s after the third
        assert failing.counts == {"/flaky": 3, "/picky": 2}, "no attempt past the budget"
    given_up = {r.hook: r for r in await rows(deployment, HookDelivery, message_id=event.message_id)}
    for hook, attempts in (("flaky", 3), ("picky", 2)):
        row = given_up[hook]
        assert (row.attempts, row.given_up_reason, row.last_error, row.delivered_at) == (
            attempts, "attempts_exhausted", "HTTP 500", None)
        assert row.given_up_at is not None
    assert sorted(gave_up(deployment), key=lambda e: e["hook"]) == [
        {"reason": "attempts_exhausted", "hook": hook, "delivery_id": delivery_id(hook, event.message_id),
         "message_id": event.message_id, "event_type": "turn.completed", "attempts": attempts,
         "last_error": "HTTP 500"}
        for hook, attempts in (("flaky", 3), ("picky", 2))]


async def test_a_publisher_whose_hook_secret_is_short_or_unset_stops_at_start_saying_which_hook(deployment, tmp_path):
    configure(deployment, tmp_path, {"name": "audit", "url": "http://127.0.0.1:9/audit", "secret": "hunter2"},
              {"name": "crm", "url": "http://127.0.0.1:9/crm", "secret": "${env:SIGNOFF_TEST_UNSET_HOOK_SECRET}"})
    with pytest.raises(AssertionError, match="publisher exited") as stopped:
        deployment.start("publisher")
    said = str(stopped.value)
    assert "hooks.0.secret: the secret is shorter than 32 bytes" in said
    assert "hooks.1.secret: the secret's ${env:SIGNOFF_TEST_UNSET_HOOK_SECRET} is not set" in said
    assert "hunter2" not in said
