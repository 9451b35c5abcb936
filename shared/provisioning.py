"""`signoff setup`'s broker part: one RabbitMQ user per service and per channel of a
namespace, each with least-privilege permissions (`Topology.permissions`), their
passwords in the keys folder, and the namespace's exchanges, queues and bindings
declared. Run with the broker's administrator (the management API at
SIGNOFF_RABBITMQ_ADMIN_URL, and SIGNOFF_RABBITMQ_URL's user); idempotent.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import httpx
from faststream.rabbit import RabbitBroker

from shared.consuming import declare
from shared.settings import Settings
from shared.topology import SERVICES, Topology


def broker_identities(channels: list[str]) -> list[str]:
    return [*SERVICES, *(f"channel.{name}" for name in channels)]


def _admin(settings: Settings) -> httpx.AsyncClient:
    url = urlsplit(settings.rabbitmq_admin_url)
    base = f"{url.scheme}://{url.hostname}:{url.port or 15672}{url.path.rstrip('/')}/api"
    auth = (unquote(url.username or "guest"), unquote(url.password or "guest"))
    return httpx.AsyncClient(base_url=base, auth=auth, timeout=10)


def _vhost(settings: Settings) -> str:
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
    topology = Topology(settings.namespace, settings.delivery_limit)
    done = []
    if settings.broker_identities:
        done += await _identities(settings, topology, channels)
    else:
        done.append("no broker identities (SIGNOFF_BROKER_IDENTITIES=false): everyone connects as one user")
    broker = RabbitBroker(settings.amqp_url, log_level=logging.DEBUG)
    await broker.connect()
    try:
        await declare(broker, topology)
    finally:
        await broker.stop()
    done.append(f"declared the exchanges and queues of namespace {settings.namespace}")
    return done


async def _identities(settings: Settings, topology: Topology, channels: list[str]) -> list[str]:
    done = []
    async with _admin(settings) as api:
        try:
            (await api.get("/whoami")).raise_for_status()
        except httpx.HTTPError as error:
            raise SystemExit(
                f"signoff setup: cannot use RabbitMQ's management API at {settings.rabbitmq_admin_url} ({error}); "
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
                    f"/permissions/{_vhost(settings)}/{quote(user, safe='')}",
                    json={"configure": allowed.configure, "write": allowed.write, "read": allowed.read},
                )
            ).raise_for_status()
            done.append(f"broker user {user}" + (" made" if made else " kept") + f" (write: {allowed.write})")
    return done


async def remove_broker_identities(settings: Settings, channels: list[str]) -> None:
    """Delete a namespace's broker users (tests clean up after themselves)."""
    topology = Topology(settings.namespace)
    async with _admin(settings) as api:
        for name in broker_identities(channels):
            await api.delete(f"/users/{quote(topology.identity(name), safe='')}")
