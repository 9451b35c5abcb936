"""`signoff setup`'s broker part: one RabbitMQ user per service and per channel of a
namespace, each with least-privilege permissions (`Topology.permissions`), their
passwords in the keys folder, and the namespace's exchanges, queues and bindings
declared. Run with the broker's administrator (the management API at
SIGNOFF_RABBITMQ_ADMIN_URL, and SIGNOFF_RABBITMQ_URL's user); idempotent.
Likewise a Redis ACL user per service that uses Redis, and a PostgreSQL role per service.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import httpx

from shared.amqp_hosts import connect_robust
from shared.consuming import declare
from shared.ledger import roles

# Re-exported: `signoff status` names the roles (services/operations/status.py).
from shared.ledger.roles import DATABASE_IDENTITIES as DATABASE_IDENTITIES
from shared.redaction import redact_text
from shared.settings import Settings, without_password
from shared.topology import OPERATOR, SERVICES, Topology


class SetupFailed(SystemExit):
    """A service `signoff setup` needs could not be used: named, with its URL (never its
    password) and what to do; a short error, never a traceback."""

    def __init__(self, service: str, url: str, error: BaseException | str, advice: str) -> None:
        self.service = service
        super().__init__(
            f"signoff setup: cannot use {service} at {without_password(url)} ({_reason(error, url)}); {advice}"
        )


def _reason(error: BaseException | str, url: str) -> str:
    """An error's first line (a database's: `roles.refusal`), without the URL's password."""
    if isinstance(error, str):
        text = error
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    text = (text.strip().splitlines() or [""])[0][:300]
    password = urlsplit(url).password
    return redact_text(text, [unquote(password)] if password else [])


def _unreached(error: BaseException) -> bool:
    """Whether an error (or one it came from) is a connection that failed: the service is down."""
    seen: BaseException | None = error
    while seen is not None:
        if "Authentication" in type(seen).__name__:  # aiormq's ProbableAuthenticationError is a ConnectionError
            return False
        if isinstance(seen, OSError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _advice(service: str, error: BaseException) -> str:
    """Start a service that is down; check the settings of one that answered and refused."""
    return ADVICE[service] if _unreached(error) else REFUSED[service]


# What to do when a service cannot be reached; the setting that points at it.
ADVICE = {
    "RabbitMQ": "start it (`rabbitmq-server -detached` or `docker compose up -d rabbitmq`) or set SIGNOFF_RABBITMQ_URL",
    "Redis": "start it (`redis-server --daemonize yes` or `docker compose up -d redis`) or set SIGNOFF_REDIS_URL",
    "PostgreSQL": "start it (`pg_ctlcluster <version> main start` or `docker compose up -d postgres`) "
    "or set SIGNOFF_DATABASE_URL",
    "management": "enable it (`rabbitmq-plugins enable rabbitmq_management`) or set SIGNOFF_RABBITMQ_ADMIN_URL",
}
# What to do when it answered but refused.
REFUSED = {
    "RabbitMQ": "check SIGNOFF_RABBITMQ_URL: its user must be the broker's administrator",
    "PostgreSQL": "check SIGNOFF_DATABASE_URL: its user must be an administrator of a database that exists",
}
MANAGEMENT_API = "RabbitMQ's management API"


def check_reachable(settings: Settings, timeout: float = 3.0) -> None:
    """Before setup makes anything: each service it will use answers on its port (a
    service that is down is named at once, and nothing is left half made)."""
    wanted = [("RabbitMQ", settings.rabbitmq_url, 5672)]
    if settings.redis_identities:
        wanted.append(("Redis", settings.redis_url, 6379))
    if roles.makes_roles(settings):
        wanted.append(("PostgreSQL", settings.database_url, 5432))
    for service, url, default_port in wanted:
        parts = urlsplit(url)
        try:
            socket.create_connection((parts.hostname or "localhost", parts.port or default_port), timeout).close()
        except OSError as error:
            raise SetupFailed(service, url, error, ADVICE[service]) from None


@dataclass
class Made:
    """What one run of `signoff setup` made that did not exist before it: a run that
    fails removes exactly these (`undo`), never what an earlier run made."""

    broker_users: list[str] = field(default_factory=list)
    # Users that existed before this run whose permissions on the vhost it changed: what
    # they were (None: none).
    broker_permissions: dict[str, dict[str, str] | None] = field(default_factory=dict)
    redis_users: list[str] = field(default_factory=list)


async def undo(settings: Settings, made: Made) -> list[str]:
    """Remove what a failed run made (a user's permissions go with it); one sentence for
    each, what could not be removed named, to be removed by hand."""
    said = []
    if made.broker_users or made.broker_permissions:
        vhost = vhost_in_path(settings)
        try:
            async with management_api(settings) as api:
                for user in list(made.broker_users):
                    answer = await api.delete(f"/users/{quote(user, safe='')}")
                    if answer.status_code not in (204, 404):
                        answer.raise_for_status()
                    made.broker_users.remove(user)
                    said.append(f"removed broker user {user}, made by this run")
                for user, before in list(made.broker_permissions.items()):
                    path = f"/permissions/{vhost}/{quote(user, safe='')}"
                    if before is None:
                        answer = await api.delete(path)
                        if answer.status_code not in (204, 404):
                            answer.raise_for_status()
                        said.append(f"removed the permissions this run gave broker user {user}")
                    else:
                        (await api.put(path, json=before)).raise_for_status()
                        said.append(f"gave broker user {user} back the permissions it had")
                    del made.broker_permissions[user]
        except httpx.HTTPError as error:
            left = made.broker_users + [f"the permissions of {u}" for u in made.broker_permissions]
            said.append(
                f"could not remove ({_reason(error, settings.rabbitmq_admin_url)}), remove by hand: {', '.join(left)}"
            )
    if made.redis_users:
        from redis.asyncio import Redis
        from redis.exceptions import RedisError

        try:
            async with Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5) as redis:
                await redis.execute_command("ACL", "DELUSER", *made.redis_users)
            said += [f"removed Redis user {user}, made by this run" for user in made.redis_users]
        except RedisError as error:
            said.append(
                f"could not remove ({_reason(error, settings.redis_url)}), remove by hand: Redis users "
                + ", ".join(made.redis_users)
            )
    return said


def broker_identities(channels: list[str]) -> list[str]:
    """Every broker user of a namespace: the services, the operator's console, the channels."""
    return [*SERVICES, OPERATOR, *(f"channel.{name}" for name in channels)]


def _management(settings: Settings) -> tuple[str, tuple[str, str]]:
    """The management API's base URL (no user-info: the credentials go as basic auth) and credentials."""
    url = urlsplit(settings.rabbitmq_admin_url)
    base = f"{url.scheme}://{url.hostname}:{url.port or 15672}{url.path.rstrip('/')}/api"
    return base, (unquote(url.username or "guest"), unquote(url.password or "guest"))


def management_api(settings: Settings) -> httpx.AsyncClient:
    base, auth = _management(settings)
    return httpx.AsyncClient(base_url=base, auth=auth, timeout=10)


def wait_for_management_api(settings: Settings, say: Callable[[str], None]) -> None:
    """`signoff up`: RabbitMQ's management API may answer seconds after its broker does
    (both starting, or restarting). Ask each second, saying once that it waits, for at
    most SIGNOFF_MANAGEMENT_WAIT_SECONDS; then a short error naming it (URL without its
    password). Any HTTP answer but a 5xx means it is up: setup judges the rest (a login
    it refuses is named there)."""
    base, auth = _management(settings)
    shown = without_password(settings.rabbitmq_admin_url)
    limit = settings.management_wait_seconds
    deadline = time.monotonic() + limit
    waited = False
    while True:
        try:
            answer = httpx.get(f"{base}/whoami", auth=auth, timeout=3)
            if answer.status_code < 500:
                if waited:
                    say(f"signoff up: RabbitMQ's management API at {shown} answers")
                return
            why = f"HTTP {answer.status_code}"
        except httpx.HTTPError as error:
            why = _reason(error, settings.rabbitmq_admin_url)
        left = deadline - time.monotonic()
        if left <= 0:
            raise SystemExit(
                f"signoff up: RabbitMQ's management API at {shown} did not answer within {limit:g} s ({why}); "
                f"{ADVICE['management']}"
            )
        if not waited:
            say(
                f"signoff up: RabbitMQ's management API at {shown} does not answer ({why}); retrying each second "
                f"for up to {limit:g} s"
            )
            waited = True
        time.sleep(min(1.0, left))


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


async def provision_broker(settings: Settings, channels: list[str], made: Made | None = None) -> list[str]:
    topology = Topology(settings.namespace, settings.delivery_limit, settings.queue_type)
    done = []
    if settings.broker_identities:
        done += await _identities(settings, topology, channels, made or Made())
    else:
        done.append("no broker identities (SIGNOFF_BROKER_IDENTITIES=false): everyone connects as one user")
    try:
        # The same aio-pika connection the services' `Bus` opens (every node of a cluster).
        connection = await connect_robust(settings.amqp_url)
        async with connection:
            await declare(await connection.channel(), topology)
    except Exception as error:
        raise SetupFailed("RabbitMQ", settings.rabbitmq_url, error, _advice("RabbitMQ", error)) from None
    done.append(f"declared the exchanges and queues of namespace {settings.namespace}")
    return done


async def _identities(settings: Settings, topology: Topology, channels: list[str], made: Made) -> list[str]:
    # Never the administrator's password in an error: it reaches terminals and CI logs (SetupFailed).
    try:
        return await _broker_users(settings, topology, channels, made)
    except httpx.HTTPError as error:
        raise SetupFailed(MANAGEMENT_API, settings.rabbitmq_admin_url, error, ADVICE["management"]) from None


async def _broker_users(settings: Settings, topology: Topology, channels: list[str], made: Made) -> list[str]:
    done = []
    vhost = vhost_in_path(settings)
    async with management_api(settings) as api:
        (await api.get("/whoami")).raise_for_status()
        for name in broker_identities(channels):
            user = topology.identity(name)
            path = f"/users/{quote(user, safe='')}"
            existed = (await api.get(path)).status_code == 200
            had = await api.get(f"/permissions/{vhost}/{quote(user, safe='')}") if existed else None
            password, _ = _password(settings.broker_password_file(name))
            # Noted before each change is asked for: a change the broker made though its answer
            # was lost is still undone (undoing one that never happened finds nothing).
            if not existed:
                made.broker_users.append(user)
            (await api.put(path, json={"password": password, "tags": ""})).raise_for_status()
            allowed = topology.permissions(name)
            wanted = {"configure": allowed.configure, "write": allowed.write, "read": allowed.read}
            if had is not None:
                before = {k: had.json()[k] for k in wanted} if had.status_code == 200 else None
                if before != wanted:
                    made.broker_permissions[user] = before
            (await api.put(f"/permissions/{vhost}/{quote(user, safe='')}", json=wanted)).raise_for_status()
            done.append(f"broker user {user}" + (" kept" if existed else " made") + f" (write: {allowed.write})")
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
    # The gateway's login attempts (counted per user and per address, so the limit holds
    # across its replicas), failed API tokens per address (read before a token is looked
    # at) and its ended sessions: counters with an expiry, and flags.
    "gateway": ("+incr", "+incrby", "+decr", "+decrby", "+pexpire", "+pttl", "+get", "+set", "+exists", "+ping"),
}
# Each user's keys: `<namespace>:lease:*` (the executor's leases), `<namespace>:gateway:*`.
REDIS_KEYS = {"tool-executor": "lease", "gateway": "gateway"}


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
        # SIGNOFF_REDIS_URL's database index and no other: a client SELECTs it on every
        # connection (redis-py: unless it is 0), and a user that may not is refused all.
        f"+select|{settings.redis_database}",
    ]


async def provision_redis(settings: Settings, made: Made | None = None) -> list[str]:
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
        return await _redis_users(settings, Redis, made or Made())
    except Unreached as error:
        raise SetupFailed("Redis", settings.redis_url, error, ADVICE["Redis"]) from None
    except ResponseError as error:
        raise SetupFailed(
            "Redis",
            settings.redis_url,
            f"it refused to make its users: {error}",
            "it needs Redis 6 or later and SIGNOFF_REDIS_URL's user must be its administrator "
            "(or set SIGNOFF_REDIS_IDENTITIES=false)",
        ) from None


async def _redis_users(settings: Settings, Redis, made: Made) -> list[str]:
    done = []
    async with Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5) as redis:
        for name in REDIS_COMMANDS:
            user = settings.redis_user(name)
            password, _ = _password(settings.redis_password_file(name))
            existed = await redis.execute_command("ACL", "GETUSER", user) is not None
            if not existed:
                made.redis_users.append(user)
            await redis.execute_command("ACL", "SETUSER", user, *redis_acl_rules(settings, name, password))
            keys = f"{settings.namespace}:{REDIS_KEYS[name]}:*"
            done.append(f"Redis user {user}" + (" kept" if existed else " made") + f" (keys {keys})")
    return done


async def remove_redis_identities(settings: Settings) -> None:
    """Delete a namespace's Redis users (tests clean up after themselves)."""
    from redis.asyncio import Redis

    async with Redis.from_url(settings.redis_url) as redis:
        await redis.execute_command("ACL", "DELUSER", *(settings.redis_user(name) for name in REDIS_COMMANDS))


# --- PostgreSQL -----------------------------------------------------------------------


async def provision_database(settings: Settings) -> list[str]:
    """One PostgreSQL role per service (and one, read-only, for the console), each
    granted only what it needs (shared/ledger/roles.py says what). Run as
    SIGNOFF_DATABASE_URL's user (an administrator); idempotent."""
    if not roles.makes_roles(settings):
        return []
    try:
        return await roles.make_roles(settings, lambda name: _password(settings.database_password_file(name))[0])
    except Exception as error:
        advice = _advice("PostgreSQL", error)
        raise SetupFailed("PostgreSQL", settings.database_url, roles.refusal(error), advice) from None


async def remove_database_identities(settings: Settings) -> None:
    """Drop a namespace's roles (tests clean up after themselves; the schema goes first)."""
    await roles.remove_roles(settings)
