"""`signoff setup` and `signoff migrate`: what a deployment needs before its services start."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from services.gateway import admin as gateway
from shared import keyring, provisioning
from shared.ledger.database import create_engine, migrate
from shared.provisioning import provision_broker, provision_database, provision_redis
from shared.settings import Settings


def setup(settings: Settings, cli_principals: Sequence[str] = (), hand_out: Path | None = None) -> int:
    """Everything a deployment needs before its services start, made if missing
    (idempotent): its keys, the CLI's channel (`SIGNOFF_CHANNEL`) registered for
    the OS user running setup plus `cli_principals` (and whomever it was registered
    for before), (with broker identities) a RabbitMQ user per service and channel
    with its permissions, the namespace's topology, a Redis user for each service
    that uses Redis (its own keys only), and on PostgreSQL a role per service with
    its grants and the migrated schema; with `hand_out`, each service's own key files
    in a folder of its own. Says what it did."""
    for principal in cli_principals:
        if not principal or any(c in principal for c in "*?[]") or principal.startswith("token:"):
            raise SystemExit(f"signoff setup: --cli-principal {principal!r}: name one person (no patterns, no token:)")
    # Each service it needs answers before anything is made; one that fails later is named
    # (SetupFailed: its URL without a password) and the broker and Redis users this run made go.
    provisioning.check_reachable(settings)
    before = keyring.registered_principals(settings.keys_path, settings.channel)
    principals = keyring.cli_principals(before, keyring.os_user(), list(cli_principals))
    done = []
    if before and "*" in before:
        done.append(f"channel {settings.channel} may no longer assert anyone: '*' dropped from its principals")
    done += keyring.create(settings.keys_path, {settings.channel: principals})
    # The HTTP gateway's channel, registered for exactly its users (`signoff user add`), and its session key.
    done += gateway.prepare(settings)
    made = provisioning.Made()
    try:
        done += asyncio.run(provision_broker(settings, sorted(keyring.channels(settings.keys_path)), made))
        done += asyncio.run(provision_redis(settings, made))
        done += asyncio.run(provision_database(settings))
    except BaseException as failure:
        undone = asyncio.run(provisioning.undo(settings, made))
        if not isinstance(failure, provisioning.SetupFailed):
            raise
        raise SystemExit("\nsignoff setup: ".join([str(failure), *undone])) from None
    if hand_out is not None:
        # Each container mounts only its own folder (docker-compose.yml): no service reads another's keys.
        for service in keyring.HELD_BY:
            files = keyring.hand_out(settings.keys_path, service, hand_out / service)
            done.append(f"{service}'s own keys in {hand_out / service}: {', '.join(f.name for f in files)}")
        registered = keyring.channels(settings.keys_path)
        for adapter in (f"channel-{name}" for name in keyring.CHANNEL_ADAPTERS if name in registered):
            files = keyring.hand_out(settings.keys_path, adapter, hand_out / adapter)
            done.append(f"{adapter}'s own keys in {hand_out / adapter}: {', '.join(f.name for f in files)}")
    for line in done:
        print(f"signoff setup: {line}")
    return 0


async def migrate_only(settings: Settings) -> int:
    # The schema is the ledger's: its own role owns the tables and migrates them.
    engine = create_engine(settings, identity="approval-ledger", pool_size=2)
    try:
        await migrate(engine, settings)
    finally:
        await engine.dispose()
    return 0
