"""`signoff setup`'s broker part: one RabbitMQ user per service and per channel of a
namespace, each with least-privilege permissions (`Topology.permissions`), their
passwords in the keys folder, and the namespace's exchanges, queues and bindings
declared. Run with the broker's administrator (the management API at
SIGNOFF_RABBITMQ_ADMIN_URL, and SIGNOFF_RABBITMQ_URL's user); idempotent.
Likewise a Redis ACL user per service that uses Redis, and a PostgreSQL role per service.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import httpx
from faststream.rabbit import RabbitBroker

from shared.amqp_hosts import failover_broker, split_hosts
from shared.consuming import declare
from shared.redaction import redact_text
from shared.settings import Settings, without_password
from shared.topology import OPERATOR, SERVICES, Topology


def broker_identities(channels: list[str]) -> list[str]:
    """Every broker user of a namespace: the services, the operator's console, the channels."""
    return [*SERVICES, OPERATOR, *(f"channel.{name}" for name in channels)]


def management_api(settings: Settings) -> httpx.AsyncClient:
    url = urlsplit(settings.rabbitmq_admin_url)
    base = f"{url.scheme}://{url.hostname}:{url.port or 15672}{url.path.rstrip('/')}/api"
    auth = (unquote(url.username or "guest"), unquote(url.password or "guest"))
    return httpx.AsyncClient(base_url=base, auth=auth, timeout=10)


def vhost_in_path(settings: Settings) -> str:
    path = urlsplit(settings.rabbitmq_url).path
    return quote(unquote(path[1:]) if len(path) > 1 else "/", safe="")


def _password(path: Path) -> tuple[str, bool]:
    """The identity's password, made (and kept, readable by its owner only) if missing."""
    if path.exists():
        return path.read_text().strip(), False
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(24)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(password + "\n")
    return password, True


async def provision_broker(settings: Settings, channels: list[str]) -> list[str]:
    topology = Topology(settings.namespace, settings.delivery_limit, settings.queue_type)
    done = []
    if settings.broker_identities:
        done += await _identities(settings, topology, channels)
    else:
        done.append("no broker identities (SIGNOFF_BROKER_IDENTITIES=false): everyone connects as one user")
    broker = RabbitBroker(split_hosts(settings.amqp_url)[0], log_level=logging.DEBUG)
    failover_broker(broker, settings.amqp_url)
    await broker.connect()
    try:
        await declare(broker, topology)
    finally:
        await broker.stop()
    done.append(f"declared the exchanges and queues of namespace {settings.namespace}")
    return done


async def _identities(settings: Settings, topology: Topology, channels: list[str]) -> list[str]:
    done = []
    async with management_api(settings) as api:
        try:
            (await api.get("/whoami")).raise_for_status()
        except httpx.HTTPError as error:
            # Never the administrator's password: this line reaches terminals and CI logs.
            shown = without_password(settings.rabbitmq_admin_url)
            raise SystemExit(
                f"signoff setup: cannot use RabbitMQ's management API at {shown} ({redact_text(str(error))}); "
                "enable it (`rabbitmq-plugins enable rabbitmq_management`) or set SIGNOFF_RABBITMQ_ADMIN_URL"
            ) from None
        for name in broker_identities(channels):
            user = topology.identity(name)
            password, made = _password(settings.broker_password_file(name))
            (
                await api.put(f"/users/{quote(user, safe='')}", json={"password": password, "tags": ""})
            ).raise_for_status()
            allowed = topology.permissions(name)
            (
                await api.put(
                    f"/permissions/{vhost_in_path(settings)}/{quote(user, safe='')}",
                    json={"configure": allowed.configure, "write": allowed.write, "read": allowed.read},
                )
            ).raise_for_status()
            done.append(f"broker user {user}" + (" made" if made else " kept") + f" (write: {allowed.write})")
    return done


async def remove_broker_identities(settings: Settings, channels: list[str]) -> None:
    """Delete a namespace's broker users (tests clean up after themselves)."""
    topology = Topology(settings.namespace)
    async with management_api(settings) as api:
        for name in broker_identities(channels):
            await api.delete(f"/users/{quote(topology.identity(name), safe='')}")


# --- Redis ------------------------------------------------------------------------

# The services that use Redis, and the ACL rules of each beyond its own key pattern:
# the executor's leases (services/tool_executor/leases.py: SET NX PX, and scripts that
# GET then DEL or PEXPIRE) and nothing else. No other service logs in to Redis at all.
REDIS_COMMANDS = {
    "tool-executor": ("+set", "+get", "+del", "+pexpire", "+eval", "+ping"),
}
# Each user's keys: `<namespace>:lease:*` (the executor's leases) and none other.
REDIS_KEYS = {"tool-executor": "lease"}


def redis_acl_rules(settings: Settings, name: str, password: str) -> list[str]:
    """The whole of an ACL user, from nothing (`reset`): on, its password, its own keys,
    no pub/sub channel, no command but the ones listed."""
    return [
        "reset",
        "on",
        f">{password}",
        f"~{settings.namespace}:{REDIS_KEYS[name]}:*",
        "resetchannels",
        "-@all",
        *REDIS_COMMANDS[name],
    ]


async def provision_redis(settings: Settings) -> list[str]:
    """One Redis ACL user per service that uses Redis, allowed only its own keys and
    commands, its password in the keys folder (`redis/<service>.password`). Run as
    SIGNOFF_REDIS_URL's user (the administrator: give Redis's default user a password
    in production); idempotent: a user is reset to exactly these rules each time."""
    if not settings.redis_identities:
        return ["no Redis identities (SIGNOFF_REDIS_IDENTITIES=false): services log in as SIGNOFF_REDIS_URL's user"]
    from redis.asyncio import Redis
    from redis.exceptions import ConnectionError as Unreached
    from redis.exceptions import ResponseError

    try:
        return await _redis_users(settings, Redis)
    except Unreached as error:
        raise SystemExit(
            f"signoff setup: cannot reach Redis ({error}); start it (`redis-server --daemonize yes`) "
            "or set SIGNOFF_REDIS_URL"
        ) from None
    except ResponseError as error:
        raise SystemExit(
            f"signoff setup: Redis refused to make its users ({str(error)[:200]}): it needs Redis 6 or later and "
            "SIGNOFF_REDIS_URL's user must be its administrator (or set SIGNOFF_REDIS_IDENTITIES=false)"
        ) from None


async def _redis_users(settings: Settings, Redis) -> list[str]:
    done = []
    async with Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5) as redis:
        for name in REDIS_COMMANDS:
            password, made = _password(settings.redis_password_file(name))
            await redis.execute_command(
                "ACL", "SETUSER", settings.redis_user(name), *redis_acl_rules(settings, name, password)
            )
            done.append(
                f"Redis user {settings.redis_user(name)}"
                + (" made" if made else " kept")
                + f" (keys {settings.namespace}:{REDIS_KEYS[name]}:*)"
            )
    return done


async def remove_redis_identities(settings: Settings) -> None:
    """Delete a namespace's Redis users (tests clean up after themselves)."""
    from redis.asyncio import Redis

    async with Redis.from_url(settings.redis_url) as redis:
        await redis.execute_command("ACL", "DELUSER", *(settings.redis_user(name) for name in REDIS_COMMANDS))


# --- PostgreSQL -----------------------------------------------------------------------

# Any constant: it keeps two setups from making roles at once.
ROLES_LOCK = 0x51600F
DATABASE_IDENTITIES = ("approval-ledger", "publisher", "model-step", "tool-executor", "console")
# What each role may do beyond reading the schema's version; the ledger owns every table but the audit log's.
GRANTS = {
    "publisher": (
        "SELECT, UPDATE (sent_at) ON outbox",
        "SELECT, INSERT, UPDATE ON hook_deliveries",
        # Its leadership epoch: taken when it leads, read (FOR SHARE) by every write it makes.
        "SELECT, UPDATE ON publisher_leader",
        "SELECT ON alembic_version",
    ),
    # The operator's console reads everything and records what it did with parked messages.
    "console": ("INSERT ON dead_letter_actions",),
    # A step names its transcript (claim-check); the model-step reads it, nothing else.
    "model-step": ("SELECT ON transcript, alembic_version",),
    "tool-executor": (
        "SELECT ON tool_calls, approval_requests, decisions, alembic_version",
        "SELECT, INSERT, UPDATE ON execution_claims",
    ),
}


# Append-only for every service: the administrator who runs setup owns these tables,
# the ledger may only add and read entries, the console only read; nobody but that
# owner may UPDATE, DELETE or TRUNCATE them (docs/design.md, "The audit log").
AUDIT_TABLES = ("audit_log", "audit_chain")


async def provision_database(settings: Settings) -> list[str]:
    """One PostgreSQL role per service (and one, read-only, for the console): the
    ledger's owns its tables (not the schema, nor the audit log's) and migrates them; the publisher may only
    mark outbox rows sent and keep its hook deliveries; the executor may only read the
    calls and their decisions and keep its claims. Nothing but the ledger can write a
    decision. Run as SIGNOFF_DATABASE_URL's user (an administrator); idempotent."""
    if not (settings.is_postgres and settings.database_identities):
        return []
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    from shared.ledger.database import create_engine, migrate

    roles = {name: settings.database_role(name) for name in DATABASE_IDENTITIES}
    schema = settings.database_schema or "public"
    done = []
    admin = create_async_engine(settings.ledger_url)
    try:
        async with admin.begin() as conn:
            # Roles are the cluster's: one setup at a time.
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ROLES_LOCK})
            for name, role in roles.items():
                password, _ = _password(settings.keys_path / "postgres" / f"{name}.password")
                exists = await conn.scalar(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role})
                verb = "ALTER" if exists else "CREATE"
                await conn.execute(text(f"{verb} ROLE \"{role}\" LOGIN PASSWORD '{password}'"))
                done.append(f"database role {role} " + ("kept" if exists else "made"))
            ledger = roles["approval-ledger"]
            # The schema is the administrator's, not the ledger's: a schema's owner may drop
            # any table in it, the audit log included. The ledger creates (and owns) the rest.
            await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            owner = await conn.scalar(
                text("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = :s"), {"s": schema}
            )
            if owner == ledger:  # made by an earlier setup
                await conn.execute(text(f'ALTER SCHEMA "{schema}" OWNER TO CURRENT_USER'))
            await conn.execute(text(f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO "{ledger}"'))
            # Tables migrated before roles existed become the ledger's.
            owned = await conn.scalars(text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": schema})
            for table in [t for t in owned if t not in AUDIT_TABLES]:
                await conn.execute(text(f'ALTER TABLE "{schema}"."{table}" OWNER TO "{ledger}"'))
            for name in ("publisher", "model-step", "tool-executor", "console"):
                await conn.execute(text(f'GRANT USAGE ON SCHEMA "{schema}" TO "{roles[name]}"'))
    finally:
        await admin.dispose()
    engine = create_engine(settings, identity="approval-ledger", pool_size=1)
    try:
        await migrate(engine, settings)
        async with engine.begin() as conn:
            for name, grants in GRANTS.items():
                for grant in grants:
                    await conn.execute(text(f'GRANT {grant} TO "{roles[name]}"'))
            console = roles["console"]
            await conn.execute(text(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{console}"'))
            await conn.execute(
                text(f'ALTER DEFAULT PRIVILEGES IN SCHEMA "{schema}" GRANT SELECT ON TABLES TO "{console}"')
            )
    finally:
        await engine.dispose()
    done.append(f"migrated schema {schema} as {roles['approval-ledger']} and granted each role its tables")
    done.append(await _seal_audit_tables(settings, schema, roles))
    return done


async def _seal_audit_tables(settings: Settings, schema: str, roles: dict[str, str]) -> str:
    """The audit tables become the administrator's (the ledger's migration made them),
    and the ledger keeps INSERT and SELECT alone: an owner may always grant itself
    more, so the ledger must not own them."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    ledger, console = roles["approval-ledger"], roles["console"]
    admin = create_async_engine(settings.ledger_url)
    try:
        async with admin.begin() as conn:
            for table in AUDIT_TABLES:
                qualified = f'"{schema}"."{table}"'
                await conn.execute(text(f"ALTER TABLE {qualified} OWNER TO CURRENT_USER"))
                await conn.execute(text(f'REVOKE ALL ON {qualified} FROM "{ledger}"'))
                await conn.execute(text(f'GRANT SELECT, INSERT ON {qualified} TO "{ledger}"'))
                await conn.execute(text(f'GRANT SELECT ON {qualified} TO "{console}"'))
            # The entries' ids come from the table's sequence, which moved with it.
            await conn.execute(text(f'GRANT USAGE ON SEQUENCE "{schema}"."audit_log_id_seq" TO "{ledger}"'))
    finally:
        await admin.dispose()
    return f"the audit log ({', '.join(AUDIT_TABLES)}): {ledger} may only INSERT and SELECT, no service may change it"


async def remove_database_identities(settings: Settings) -> None:
    """Drop a namespace's roles (tests clean up after themselves; the schema goes first)."""
    if not (settings.is_postgres and settings.database_identities):
        return
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    admin = create_async_engine(settings.ledger_url)
    try:
        async with admin.begin() as conn:
            for name in DATABASE_IDENTITIES:
                role = settings.database_role(name)
                if await conn.scalar(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}):
                    await conn.execute(text(f'DROP OWNED BY "{role}" CASCADE'))
                    await conn.execute(text(f'DROP ROLE "{role}"'))
    finally:
        await admin.dispose()
