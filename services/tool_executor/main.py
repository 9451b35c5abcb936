"""tool-executor entrypoint."""

from __future__ import annotations

import os
import socket
from functools import partial

import httpx
from pydantic import TypeAdapter

from shared import keyring, redaction
from shared.catalogue import load_catalogue
from shared.consuming import publish
from shared.ledger.database import create_engine, database_reachable, migrate
from shared.messages import ExecuteTool
from shared.observability import know_tools
from shared.runtime import prepare
from shared.settings import Settings

from .claims import Claims
from .handlers import Executor, execute_tool
from .leases import Leases


async def run(settings: Settings) -> None:
    runtime = prepare(settings, "tool-executor")
    await runtime.expose()
    engine = create_engine(settings, identity="tool-executor")
    runtime.health.add("database", partial(database_reachable, engine))
    await migrate(engine, settings)
    holder = f"{socket.gethostname()}:{os.getpid()}"
    catalogue = load_catalogue(settings.tools_file)
    # Every value the tools take from this environment is a secret: never in a log line or a dead letter.
    redaction.remember(*(os.environ[name] for name in catalogue.env_references() if name in os.environ))
    know_tools([spec.name for spec in catalogue.tools])
    ledger_key = keyring.ledger_public_key(settings.keys_path)
    async with httpx.AsyncClient() as http:
        executor = Executor(
            catalogue=catalogue,
            claims=Claims(engine, holder, settings.claim_lease_seconds, ledger_key),
            http=http,
            report=partial(publish, runtime.broker, runtime.topology, user_id=runtime.user),
            data_dir=settings.data_dir.resolve(),
            leases=Leases(runtime.redis, settings.namespace, holder, settings.claim_lease_seconds),
            ledger_key=ledger_key,
            max_bytes=settings.max_message_bytes,
        )
        runtime.consume("tool.execute", TypeAdapter(ExecuteTool), partial(execute_tool, executor))
        try:
            await runtime.serve()
        finally:
            await engine.dispose()
