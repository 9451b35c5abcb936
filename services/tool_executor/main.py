"""tool-executor entrypoint."""

from __future__ import annotations

import os
import socket
from functools import partial

import httpx
from pydantic import TypeAdapter

from shared import keyring
from shared.catalogue import load_catalogue
from shared.consuming import publish
from shared.ledger.database import create_engine, migrate
from shared.messages import ExecuteTool
from shared.runtime import prepare
from shared.settings import Settings

from .claims import Claims
from .handlers import Executor, execute_tool
from .leases import Leases


async def run(settings: Settings) -> None:
    runtime = prepare(settings, "tool-executor")
    engine = create_engine(settings, identity="tool-executor")
    await migrate(engine, settings)
    holder = f"{socket.gethostname()}:{os.getpid()}"
    async with httpx.AsyncClient() as http:
        executor = Executor(
            catalogue=load_catalogue(settings.tools_file),
            claims=Claims(engine, holder, settings.claim_lease_seconds),
            http=http,
            report=partial(publish, runtime.broker, runtime.topology, user_id=runtime.user),
            data_dir=settings.data_dir.resolve(),
            leases=Leases(runtime.redis, settings.namespace, holder, settings.claim_lease_seconds),
            ledger_key=keyring.ledger_public_key(settings.keys_path),
            max_bytes=settings.max_message_bytes,
        )
        runtime.consume("tool.execute", TypeAdapter(ExecuteTool), partial(execute_tool, executor))
        try:
            await runtime.serve()
        finally:
            await engine.dispose()
