"""tool-executor entrypoint."""

from __future__ import annotations

import logging
import os
import socket
import stat
from functools import partial
from pathlib import Path

import httpx
from pydantic import TypeAdapter

from shared import keyring, redaction
from shared.catalogue import ToolCatalogue, load_catalogue, reload_catalogue
from shared.ledger.claims import heartbeat_engine
from shared.ledger.database import create_engine, database_reachable, migrate
from shared.messages import ExecuteTool
from shared.observability import know_tools
from shared.redis_access import RedisAccess
from shared.runtime import prepare
from shared.settings import Settings

from .claims import Claims
from .handlers import Executor, execute_tool
from .leases import Leases
from .tools import TOOLS_USER, ToolUserMissing, tool_data_dir, tools_user

log = logging.getLogger("signoff.tool_executor")


async def keep_tools_out(data_dir: Path, launcher: Path | None) -> None:
    """Python tools run as a user of their own when a tool launcher starts them or the
    executor is root (tools.py): what is in the data folder (keys, the SQLite ledger,
    logs) is none of theirs, and they reach their own folder in it as their working
    directory. Group access, if any, is left as it is. Without that user, python calls
    fail (each says why); the rest runs. Otherwise a tool runs as this process's user,
    and can read what it reads: said at start."""
    if launcher is not None:
        log.info("python tools start through the tool launcher at %s, as %s", launcher, TOOLS_USER)
        return
    try:
        if await tools_user() is None:
            log.warning(
                "python tools run as this executor's own user (it is not root and SIGNOFF_TOOL_LAUNCHER is "
                "not set): a tool can read this executor's passwords. Give it a tool launcher (docs/design.md)"
            )
            return
    except ToolUserMissing as missing:
        log.error("python tools cannot run: %s", missing)
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(stat.S_IMODE(data_dir.stat().st_mode) & ~0o007)


async def run(settings: Settings) -> None:
    runtime = prepare(settings, "tool-executor")
    await runtime.expose()
    engine = create_engine(settings, identity="tool-executor")
    # Lease renewals on a connection of their own where the database has more than one (shared/ledger/claims.py).
    heartbeat = heartbeat_engine(settings, "tool-executor")
    runtime.health.add("database", partial(database_reachable, engine))
    await migrate(engine, settings)
    holder = f"{socket.gethostname()}:{os.getpid()}"
    # Redis away: leases are granted and the claim decides. Redis refusing this user: not ready.
    redis = RedisAccess(
        runtime.redis, f"{settings.namespace}:lease:ready", settings.redis_user("tool-executor"), ready_while_away=True
    )
    runtime.health.add("redis", redis.ready)
    await redis.ready()  # a refusal is logged at start, not only when a probe asks
    catalogue = load_catalogue(settings.tools_file)
    # Every value the tools take from this environment is a secret: never in a log line or a dead letter.
    redaction.remember(*(os.environ[name] for name in catalogue.env_references() if name in os.environ))
    know_tools([spec.name for spec in catalogue.tools])
    await keep_tools_out(settings.data_dir.resolve(), settings.tool_launcher)
    ledger_key = keyring.ledger_public_key(settings.keys_path)
    async with httpx.AsyncClient() as http:
        executor = Executor(
            catalogue=catalogue,
            claims=Claims(engine, holder, settings.claim_lease_seconds, ledger_key, heartbeat),
            http=http,
            report=runtime.publish,
            data_dir=tool_data_dir(settings.data_dir.resolve()),
            leases=Leases(runtime.redis, settings.namespace, holder, settings.claim_lease_seconds),
            ledger_key=ledger_key,
            max_bytes=settings.max_message_bytes,
            tool_launcher=settings.tool_launcher,
        )
        runtime.consume("tool.execute", TypeAdapter(ExecuteTool), partial(execute_tool, executor))

        def take(new: ToolCatalogue) -> None:
            redaction.remember(*(os.environ[name] for name in new.env_references() if name in os.environ))
            know_tools([spec.name for spec in new.tools])
            executor.catalogue = new
            executor.mcp.keep_only(new)

        runtime.on_reload(partial(reload_catalogue, settings.tools_file, take))
        try:
            await runtime.serve()
        finally:
            await executor.mcp.close()
            await engine.dispose()
            if heartbeat is not None:
                await heartbeat.dispose()
