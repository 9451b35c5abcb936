"""gateway entrypoint: open its connections (the ledger read-only, Redis as its own user,
RabbitMQ as its channel's user), then serve HTTP until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI
from faststream.rabbit import RabbitBroker
from redis.asyncio import Redis

from shared import keyring
from shared.catalogue import load_catalogue
from shared.consuming import publish
from shared.ledger.database import notify_channel
from shared.ledger.gateway_reads import GatewayReads
from shared.messages import Envelope, RespondToApproval
from shared.observability import Health
from shared.runtime import Unreachable, address, configure_logging
from shared.settings import Settings
from shared.signatures import sign as sign_with
from shared.topology import Topology

from .app import Gateway, create_app
from .auth import RedisState, Sessions
from .oidc import OpenIDConnect
from .programs import LiveTokens, tokens_path
from .reads import Ledger
from .settings import GatewaySettings
from .users import CHANNEL, LiveUsers
from .watch import LedgerWatch

log = logging.getLogger("signoff.gateway")


def connections(settings: GatewaySettings):
    @asynccontextmanager
    async def start(app: FastAPI):
        keys = settings.keys_path
        channel_key = keyring.channel_private_key(keys, CHANNEL)
        try:
            session_key = bytes.fromhex(settings.session_key_path.read_text().strip())
        except FileNotFoundError:
            raise SystemExit(
                f"signoff: no gateway session key at {settings.session_key_path}; run `signoff setup`"
            ) from None
        topology = Topology(settings.namespace, settings.delivery_limit, settings.queue_type)
        amqp_url, broker_user = settings.amqp_login(f"channel.{CHANNEL}")
        broker = RabbitBroker(amqp_url, log_level=logging.DEBUG, logger=logging.getLogger("signoff.broker"))
        try:
            await broker.connect()
        except Exception as error:
            raise Unreachable("RabbitMQ", address(settings.rabbitmq_url), error) from None
        redis = Redis.from_url(settings.redis_login("gateway"), socket_timeout=5, socket_connect_timeout=5)
        record = GatewayReads.opened(settings)
        ledger = Ledger(record, load_catalogue(settings.tools_file))
        watch = LedgerWatch(
            ledger, settings.gateway_poll_seconds, settings.gateway_idle_poll_seconds, notify_channel(settings)
        )
        health = Health("gateway")
        health.add("broker", lambda: broker.ping(timeout=1.0))
        health.add("database", ledger.reachable)
        health.add("redis", lambda: redis.ping())

        async def send(message: Envelope) -> None:
            await publish(broker, topology, message, user_id=broker_user)

        def sign(response: RespondToApproval) -> RespondToApproval:
            unsigned = response.model_copy(update={"key_id": CHANNEL})
            return unsigned.model_copy(update={"signature": sign_with(channel_key, unsigned.signed_part())})

        app.state.gateway = Gateway(
            settings=settings,
            users=LiveUsers(settings.users_path),
            sessions=Sessions(session_key, settings.gateway_session_seconds),
            state=RedisState(redis, settings.namespace),
            ledger=ledger,
            send=send,
            sign=sign,
            ready=health.readiness,
            tokens=LiveTokens(tokens_path(settings.users_path)),
            oidc=OpenIDConnect.from_settings(settings),
            watch=watch,
        )
        await health.start(settings.metrics_host, settings.metrics_port)
        watch.start()
        try:
            yield
        finally:
            await watch.stop()
            await health.stop()
            await broker.stop()
            await redis.aclose()
            await record.close()

    return start


async def run(settings: Settings) -> None:
    config = GatewaySettings(**settings.model_dump())
    configure_logging(config, "gateway")
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
    serving = asyncio.create_task(server.serve())
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
