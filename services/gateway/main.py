"""gateway entrypoint: open its connections (the ledger read-only, Redis as its own user,
RabbitMQ as its channel's user), then serve HTTP until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import uvicorn
from fastapi import FastAPI
from redis.asyncio import Redis

from shared import consuming, keyring
from shared.bus import Bus
from shared.catalogue import load_catalogue, reload_catalogue
from shared.ledger.database import notify_channel
from shared.ledger.gateway_logins import EndedLogins
from shared.ledger.gateway_reads import GatewayReads
from shared.messages import Envelope
from shared.observability import CannotListen, Health
from shared.redis_access import RedisAccess
from shared.responses import ResponseSigner
from shared.runtime import Unreachable, address, configure_logging
from shared.settings import Settings
from shared.topology import Topology

from .app import create_app
from .auth import Logins, RedisState, Sessions
from .callers import Gateway
from .oidc import OpenIDConnect
from .programs import LiveTokens, tokens_path
from .reads import Ledger
from .settings import GatewaySettings
from .users import CHANNEL, LiveUsers
from .watch import LedgerWatch

log = logging.getLogger("signoff.gateway")


@dataclass
class Opened:
    """What the gateway holds open while it serves: RabbitMQ (as its channel's broker user,
    on the services' `Bus`), Redis (as its own user), the ledger's reads and its ended logins."""

    bus: Bus
    broker_user: str
    redis: Redis
    record: GatewayReads
    ended_logins: EndedLogins

    @classmethod
    async def connect(cls, settings: GatewaySettings) -> Opened:
        amqp_url, broker_user = settings.amqp_login(f"channel.{CHANNEL}")
        bus = Bus(amqp_url, prefetch=1)
        try:
            await bus.connect()
            await bus.start()  # it consumes nothing: started, it answers `connected`
        except Exception as error:
            raise Unreachable("RabbitMQ", address(settings.rabbitmq_url), error) from None
        redis = Redis.from_url(settings.redis_login("gateway"), socket_timeout=5, socket_connect_timeout=5)
        return cls(bus, broker_user, redis, GatewayReads.opened(settings), EndedLogins.opened(settings))

    async def close(self) -> None:
        await self.bus.stop()
        await self.redis.aclose()
        await self.record.close()
        await self.ended_logins.close()


def session_key(settings: GatewaySettings) -> bytes:
    try:
        return bytes.fromhex(settings.session_key_path.read_text().strip())
    except FileNotFoundError:
        raise SystemExit(
            f"signoff: no gateway session key at {settings.session_key_path}; run `signoff setup`"
        ) from None


def health_of(settings: GatewaySettings, opened: Opened, ledger: Ledger) -> Health:
    health = Health("gateway")

    async def broker_connected() -> bool:
        return opened.bus.connected

    health.add("broker", broker_connected)
    health.add("database", ledger.reachable)
    # Login limits and ended sessions live there: not ready while Redis is away or refuses.
    access = RedisAccess(
        opened.redis, f"{settings.namespace}:gateway:ready", settings.redis_user("gateway"), ready_while_away=False
    )
    health.add("redis", access.ready)
    health.add("ended_logins", opened.ended_logins.readable)
    return health


def build_gateway(
    settings: GatewaySettings,
    opened: Opened,
    ledger: Ledger,
    watch: LedgerWatch,
    health: Health,
    signer: ResponseSigner,
    key: bytes,
) -> Gateway:
    topology = Topology(settings.namespace, settings.delivery_limit, settings.queue_type)

    async def send(message: Envelope) -> None:
        await consuming.send(opened.bus, topology, message, user_id=opened.broker_user)

    users = LiveUsers(settings.users_path)
    tokens = LiveTokens(tokens_path(settings.users_path))
    state = RedisState(opened.redis, settings.namespace)
    logins = Logins(users, tokens, opened.ended_logins, state)
    # A logout's NOTIFY reaches the open streams through the watcher's LISTEN connection.
    watch.on_logins = logins.streams.wake.set
    logins.streams.listening = lambda: watch.listening
    return Gateway(
        settings=settings,
        users=users,
        sessions=Sessions(key, settings.gateway_session_seconds),
        state=state,
        ledger=ledger,
        send=send,
        signer=signer,
        ready=health.readiness,
        tokens=tokens,
        oidc=OpenIDConnect.from_settings(settings),
        watch=watch,
        logins=logins,
    )


def connections(settings: GatewaySettings):
    @asynccontextmanager
    async def start(app: FastAPI):
        # Its decisions are signed as the gateway's channel (shared/responses.py).
        signer = ResponseSigner(CHANNEL, keyring.channel_private_key(settings.keys_path, CHANNEL))
        key = session_key(settings)
        opened = await Opened.connect(settings)
        ledger = Ledger(opened.record, load_catalogue(settings.tools_file))
        watch = LedgerWatch(
            ledger, settings.gateway_poll_seconds, settings.gateway_idle_poll_seconds, notify_channel(settings)
        )
        health = health_of(settings, opened, ledger)
        gateway = app.state.gateway = build_gateway(settings, opened, ledger, watch, health, signer, key)
        await health.start(settings.metrics_host, settings.metrics_port)
        watch.start()
        # SIGHUP (`signoff reload`): the tools file again, for who may see and approve what.
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(
            signal.SIGHUP, reload_catalogue, settings.tools_file, partial(setattr, ledger, "catalogue")
        )
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
            await watch.stop()
            await gateway.logins.streams.stop()
            await health.stop()
            await opened.close()

    return start


def listening_socket(host: str, port: int) -> socket.socket:
    """The gateway's socket, bound before anything else is opened: a port another process
    holds stops it at once, saying so (`CannotListen`), where uvicorn would exit 1 after
    connecting to everything and `signoff up` would restart it forever."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as error:
        listening.close()
        raise CannotListen("gateway", "HTTP", host, port, error, "SIGNOFF_GATEWAY_PORT") from None
    return listening


async def run(settings: Settings) -> None:
    config = GatewaySettings(**settings.model_dump())
    configure_logging(config, "gateway")
    listening = listening_socket(config.gateway_host, config.gateway_port)
    app = create_app(connections(config))
    forwarded = config.gateway_forwarded_allow_ips.strip()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.gateway_host,
            port=config.gateway_port,
            http=config.gateway_http,
            log_config=None,
            access_log=False,
            proxy_headers=bool(forwarded),
            forwarded_allow_ips=forwarded or None,
            timeout_graceful_shutdown=3,
            server_header=False,
        )
    )
    serving = asyncio.create_task(server.serve(sockets=[listening]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if server.started:
        log.info("gateway ready on http://%s:%d", config.gateway_host, config.gateway_port)
    try:
        await serving
    finally:
        if not serving.done():
            server.should_exit = True
            with contextlib.suppress(Exception):
                await serving
    if not server.started:
        raise SystemExit(f"signoff: the gateway could not serve on {config.gateway_host}:{config.gateway_port}")
