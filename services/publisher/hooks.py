"""Lifecycle hooks: signed HTTP callbacks on committed events.

A delivery row is written in the same transaction that marks its event sent,
so a hook only ever describes committed state. Each delivery keeps one id for
life, sent as `Signoff-Delivery` and `Idempotency-Key`; it is retried with
backoff until the receiver answers 2xx, across crashes and restarts.
Signature: `Signoff-Signature: sha256=HMAC(secret, "<timestamp>.<body>")`.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import hmac
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, async_sessionmaker

from shared import faults
from shared.catalogue import resolve_secrets
from shared.ledger.tables import TABLES, HookDelivery
from shared.messages import EVENT_TYPES, now

log = logging.getLogger("signoff.hooks")
MAX_BACKOFF_SECONDS = 60.0


class Hook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str
    # Event types, or patterns such as "approval.*"; "*" for all.
    events: list[str]
    # `${env:NAME}` keeps the secret out of the file.
    secret: str
    timeout_seconds: float = 10.0

    @field_validator("events")
    @classmethod
    def _events_exist(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(known, pattern) for known in EVENT_TYPES):
                raise ValueError(f"{pattern!r} matches no event; events are: {', '.join(sorted(EVENT_TYPES))}")
        return patterns

    def wants(self, event_type: str) -> bool:
        return any(fnmatch.fnmatchcase(event_type, pattern) for pattern in self.events)


class HookConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hooks: list[Hook] = []


def load_hooks(path: Path | None) -> list[Hook]:
    if path is None:
        return []
    try:
        return HookConfig.model_validate(yaml.safe_load(Path(path).read_text()) or {}).hooks
    except FileNotFoundError:
        raise SystemExit(f"hooks file not found: {path} (SIGNOFF_HOOKS_FILE)") from None


def delivery_id(hook: str, message_id: str) -> str:
    return "dlv_" + hashlib.sha256(f"{hook}\0{message_id}".encode()).hexdigest()[:32]


def sign(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def backoff(attempts: int) -> float:
    return min(MAX_BACKOFF_SECONDS, 0.2 * 2 ** max(0, attempts - 1))


async def schedule(conn: AsyncConnection, hooks: list[Hook], rows) -> None:
    """Add a delivery for every hook that wants each relayed event (inside the mark-sent transaction)."""
    at = now()
    deliveries = [
        {
            "id": delivery_id(hook.name, row.message_id),
            "hook": hook.name,
            "message_id": row.message_id,
            "event_type": row.message_type,
            "body": row.body,
            "attempts": 0,
            "next_attempt_at": at,
            "created_at": at,
        }
        for row in rows
        for hook in hooks
        if hook.wants(row.message_type)
    ]
    if deliveries:
        await conn.execute(insert(TABLES["hook_deliveries"]), deliveries)


@dataclass
class HookDeliverer:
    sessions: async_sessionmaker
    hooks: list[Hook]
    http: httpx.AsyncClient
    in_flight: set[str] = field(default_factory=set)
    _tasks: set[asyncio.Task] = field(default_factory=set)

    async def deliver_due(self) -> int:
        by_name = {h.name: h for h in self.hooks}
        query = (
            select(HookDelivery)
            .where(HookDelivery.delivered_at.is_(None), HookDelivery.next_attempt_at <= now())
            .order_by(HookDelivery.created_at)
            .limit(100)
        )
        if self.in_flight:
            query = query.where(HookDelivery.id.not_in(self.in_flight))
        async with self.sessions() as db:
            due = (await db.scalars(query)).all()
        for delivery in due:
            hook = by_name.get(delivery.hook)
            if hook is None:
                continue  # the hook was removed from the configuration; keep the row for the record
            self.in_flight.add(delivery.id)
            task = asyncio.create_task(self._deliver(hook, delivery))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return len(due)

    async def _deliver(self, hook: Hook, delivery: HookDelivery) -> None:
        try:
            body = delivery.body.encode()
            timestamp = str(int(time.time()))
            headers = {
                "Content-Type": "application/json",
                "Signoff-Delivery": delivery.id,
                "Idempotency-Key": delivery.id,
                "Signoff-Event": delivery.event_type,
                "Signoff-Timestamp": timestamp,
                "Signoff-Signature": sign(resolve_secrets(hook.secret), timestamp, body),
            }
            error = None
            try:
                response = await self.http.post(
                    resolve_secrets(hook.url), content=body, headers=headers, timeout=hook.timeout_seconds
                )
                if not response.is_success:
                    error = f"HTTP {response.status_code}"
            except httpx.HTTPError as failure:
                error = f"{type(failure).__name__}: {failure}"
            if error is None:
                await faults.reached("publisher.after_hook")
            async with self.sessions() as db, db.begin():
                attempts = delivery.attempts + 1
                values = (
                    {"delivered_at": now(), "attempts": attempts}
                    if error is None
                    else {
                        "attempts": attempts,
                        "last_error": error,
                        "next_attempt_at": now() + timedelta(seconds=backoff(attempts)),
                    }
                )
                await db.execute(update(HookDelivery).where(HookDelivery.id == delivery.id).values(**values))
            if error:
                log.warning("hook %s delivery %s failed (%s); retrying", hook.name, delivery.id, error)
        except Exception:
            log.exception("hook %s delivery %s", hook.name, delivery.id)
        finally:
            self.in_flight.discard(delivery.id)


async def deliver_hooks_forever(deliverer: HookDeliverer, pause: float = 0.05) -> None:
    while True:
        try:
            await deliverer.deliver_due()
        except Exception:
            log.exception("hook delivery loop")
        await asyncio.sleep(pause)
