"""approval-ledger entrypoint: decode each inbound message, call its handler."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from functools import partial

from pydantic import TypeAdapter

from shared.catalogue import ToolCatalogue, load_catalogue, reload_catalogue
from shared.ledger.audit_chain import link_once
from shared.ledger.backlog import measure
from shared.ledger.database import create_engine, database_reachable, migrate, notify_channel
from shared.ledger.retention import Retention, sweep_once
from shared.messages import (
    CancelTurn,
    ClaimCall,
    FileCall,
    ModelStepCompleted,
    RefuseExecution,
    ReportCallResult,
    RespondToApproval,
    RevokeGrant,
    StartTurn,
    ToolExecuted,
)
from shared.observability import know_tools
from shared.runtime import prepare
from shared.settings import Settings

from . import handlers
from .audit import link_forever
from .authority import Authority
from .backlog import measure_forever
from .domain import TurnBounds
from .group_commit import GroupCommit
from .handlers import Ledger
from .retention import sweep_forever
from .store_database import database_store, writers

# The ledger's PostgreSQL pool: one connection per group-commit lane, the rest for
# the sweeps and parked messages.
POOL_SIZE = 20
# How often the ledger measures what waits (services/approval_ledger/backlog.py) for /metrics.
BACKLOG_SECONDS = 5.0
# Group commit (group_commit.py): lanes applying groups at once, and the most
# transitions in one group (one transaction holding that many session locks).
LANES = 4
GROUP_BOUND = 16
ROUTES = (
    ("turn.start", StartTurn, handlers.start_turn),
    ("turn.cancel", CancelTurn, handlers.cancel_turn),
    ("approval.respond", RespondToApproval, handlers.respond_to_approval),
    ("grant.revoke", RevokeGrant, handlers.revoke_grant),
    ("step.completed", ModelStepCompleted, handlers.model_step_completed),
    ("tool.completed", ToolExecuted, handlers.tool_executed),
    ("execution.refused", RefuseExecution, handlers.execution_refused),
    ("call.file", FileCall, handlers.file_call),
    ("call.claim", ClaimCall, handlers.claim_call),
    ("call.report", ReportCallResult, handlers.report_call_result),
)


async def run(settings: Settings) -> None:
    runtime = prepare(settings, "approval-ledger")
    await runtime.expose()
    authority = Authority.from_settings(settings)
    engine = create_engine(settings, identity="approval-ledger", pool_size=POOL_SIZE)
    runtime.health.add("database", partial(database_reachable, engine))
    await migrate(engine, settings)
    catalogue = load_catalogue(settings.tools_file)
    know_tools([spec.name for spec in catalogue.tools])
    # The tool menus this process knows the database holds: a step names a known one without a write.
    stored_menus: set[str] = set()
    ledger = Ledger(
        open_store=partial(database_store, engine, runtime.topology, notify_channel(settings), stored_menus),
        topology=runtime.topology,
        catalogue=catalogue,
        authority=authority,
        check_senders=settings.broker_identities,
        approval_timeout=settings.approval_timeout_seconds,
        tool_output_model_chars=settings.tool_output_model_chars,
        default_provider=settings.provider,
        turn_bounds=TurnBounds(steps=settings.turn_max_steps, tokens=settings.turn_max_tokens),
    )

    def take(new: ToolCatalogue) -> None:
        # Between two transitions: each judges by the catalogue it started with, as after a restart.
        ledger.catalogue = new
        know_tools([spec.name for spec in new.tools])

    runtime.on_reload(partial(reload_catalogue, settings.tools_file, take))
    # Transitions wait in the lanes, not in the pool: no more transactions at once
    # than there are connections, so load never meets the pool's checkout timeout
    # (failed handlers, redeliveries, dead letters). SQLite has one writer: one lane.
    group = GroupCommit(ledger, lanes=writers(engine, LANES), bound=GROUP_BOUND)
    for message_type, model, handler in ROUTES:
        # A redelivery is recognised by the inbox, one statement inside the transition's own transaction.
        runtime.consume(message_type, TypeAdapter(model), partial(group.apply, handler))
    parked = asyncio.Semaphore(writers(engine, POOL_SIZE - LANES))

    async def apply_parked(message) -> None:
        async with parked:
            await handlers.message_parked(ledger, message)

    runtime.consume_parked(apply_parked)
    retention = Retention(
        outbox=timedelta(seconds=settings.outbox_retention_seconds),
        inbox=timedelta(seconds=settings.inbox_retention_seconds),
        hooks=timedelta(seconds=settings.hook_retention_seconds),
    )

    async def sweeps() -> None:
        await asyncio.gather(
            handlers.sweep_expired_requests(ledger, settings.expiry_sweep_seconds),
            sweep_forever(partial(sweep_once, engine, retention), settings.retention_sweep_seconds),
            *([measure_forever(partial(measure, engine), BACKLOG_SECONDS)] if settings.metrics_port else []),
            link_forever(partial(link_once, engine), settings.audit_link_seconds),
        )

    try:
        await runtime.serve(sweeps)
    finally:
        await engine.dispose()
