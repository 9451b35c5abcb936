"""Lifecycle hooks: signed HTTP callbacks on committed events.

A delivery row is written in the same transaction that marks its event sent,
so a hook only ever describes committed state. Each delivery keeps one id for
life, sent as `Signoff-Delivery` and `Idempotency-Key`; it is retried with
backoff until the receiver answers 2xx, across crashes and restarts, or until its
retry budget is spent (`SIGNOFF_HOOK_MAX_ATTEMPTS`, or the hook's `max_attempts`).
Signature: `Signoff-Signature: sha256=HMAC(secret, "<timestamp>.<body>")`
(`signoff.hooks.sign`; a receiver checks it with `signoff.hooks.verify`).

Hooks get events only: `*` and every other pattern match event types
(`shared.messages.EVENT_TYPES`), never a command the publisher relays
(`tool.execute` carries a call's arguments, `step.requested` a whole transcript).
A hook's secret must be set and at least 32 bytes: the publisher refuses to start
otherwise, naming the hook.

No hook can hold up another: each hook's due deliveries are read on their own, with
at most `SIGNOFF_HOOK_CONCURRENCY` of them in flight, so a slow, failing or removed
hook's backlog never fills the window another hook's deliveries wait in. A delivery
is given up, with a machine-readable reason on its row and in an ERROR log line
(`hook.gave_up {json}`), when its retry budget is spent (`attempts_exhausted`) or its
hook is no longer configured (`hook_removed`, when a publisher begins to lead).
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shared import faults, logs
from shared.catalogue import MissingSecret, resolve_secrets
from shared.ledger import hook_deliveries
from shared.ledger.tables import HookDelivery
from shared.messages import EVENT_TYPES, now
from shared.observability import HOOK_DELIVERIES
from shared.redaction import redact_text, remember
from signoff.hooks import MIN_SECRET_BYTES, sign

from .leadership import Leadership, LeadershipLost

log = logging.getLogger("signoff.hooks")
MAX_BACKOFF_SECONDS = 60.0
# Attempts before a delivery is given up: with the backoff below, about an hour and a half.
DEFAULT_MAX_ATTEMPTS = 100
# Deliveries in flight at once, per hook.
DEFAULT_CONCURRENCY = 16


class Hook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str
    # Event types, or patterns such as "approval.*"; "*" for all.
    events: list[str]
    # `${env:NAME}` keeps the secret out of the file; resolved when the hooks are
    # loaded, and at least MIN_SECRET_BYTES long.
    secret: str = Field(repr=False)
    timeout_seconds: float = 10.0
    # Attempts before a delivery is given up; unset: SIGNOFF_HOOK_MAX_ATTEMPTS.
    max_attempts: int | None = Field(default=None, ge=1)

    @field_validator("events")
    @classmethod
    def _events_exist(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(known, pattern) for known in EVENT_TYPES):
                raise ValueError(f"{pattern!r} matches no event; events are: {', '.join(sorted(EVENT_TYPES))}")
        return patterns

    @field_validator("url")
    @classmethod
    def _url_resolved(cls, url: str) -> str:
        try:
            return resolve_secrets(url)
        except MissingSecret as missing:
            raise ValueError(f"the url's {missing}") from None

    @field_validator("secret")
    @classmethod
    def _secret_strong(cls, secret: str) -> str:
        try:
            secret = resolve_secrets(secret)
        except MissingSecret as missing:
            raise ValueError(f"the secret's {missing}") from None
        if len(secret.encode()) < MIN_SECRET_BYTES:
            # The length only: the message must not help anyone guess it.
            raise ValueError(
                f"the secret is shorter than {MIN_SECRET_BYTES} bytes; use a random one (openssl rand -hex 32)"
            )
        remember(secret)  # written in the file rather than the environment: still never logged
        return secret

    def wants(self, event_type: str) -> bool:
        """Events only: a command the publisher relays matches no pattern, not even `*`."""
        return event_type in EVENT_TYPES and any(fnmatch.fnmatchcase(event_type, p) for p in self.events)


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
    except ValidationError as invalid:
        # Said without the input values: they may be the secrets themselves.
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in invalid.errors()
        )
        raise SystemExit(f"hooks file {path} (SIGNOFF_HOOKS_FILE) is not usable: {problems}") from None


def delivery_id(hook: str, message_id: str) -> str:
    return "dlv_" + hashlib.sha256(f"{hook}\0{message_id}".encode()).hexdigest()[:32]


def backoff(attempts: int) -> float:
    return min(MAX_BACKOFF_SECONDS, 0.2 * 2 ** max(0, attempts - 1))


def retry_delay(attempts: int, budget: int) -> float | None:
    """After a delivery's `attempts`-th failed attempt: the wait before the next one, or
    None when its budget of attempts is spent and it is given up."""
    return None if attempts >= budget else backoff(attempts)


def alert(reason: str, **detail: object) -> None:
    """Tell an operator that deliveries were given up: one ERROR line, its detail as JSON."""
    log.error("hook.gave_up %s", json.dumps({"reason": reason, **detail}, sort_keys=True, default=str))


def scheduled(hooks: list[Hook], rows) -> list[dict[str, object]]:
    """A delivery for every hook that wants each relayed event (added in the mark-sent transaction)."""
    at = now()
    return [
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


@dataclass
class HookDeliverer:
    sessions: hook_deliveries.Sessions
    hooks: list[Hook]
    http: httpx.AsyncClient
    # The publisher's term as the leader (PostgreSQL): every write is fenced by its epoch.
    leadership: Leadership | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    # Per hook: one hook's slow or failing receiver cannot take the others' turn.
    concurrency: int = DEFAULT_CONCURRENCY
    # Per hook, the ids of its deliveries in flight.
    in_flight: dict[str, set[str]] = field(default_factory=dict)
    _tasks: set[asyncio.Task] = field(default_factory=set)

    async def retire_removed(self) -> None:
        """Give up the pending deliveries of hooks no longer configured (`hook_removed`):
        nobody will attempt them again, and an operator is told how many, per hook."""
        removed = await hook_deliveries.give_up_removed(
            self.sessions, [h.name for h in self.hooks], self.leadership.fence if self.leadership is not None else None
        )
        for hook, count in removed:
            alert("hook_removed", hook=hook, deliveries=count)

    async def deliver_due(self) -> int:
        """Start the due deliveries of each hook, oldest due first, up to its room in flight."""
        at = now()
        started = 0
        async with hook_deliveries.DueDeliveries(self.sessions) as due:
            for hook in self.hooks:
                busy = self.in_flight.setdefault(hook.name, set())
                room = self.concurrency - len(busy)
                if room <= 0:
                    continue
                for delivery in await due.of(hook.name, at, room, busy):
                    busy.add(delivery.id)
                    task = asyncio.create_task(self._deliver(hook, delivery))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                    started += 1
        return started

    async def _deliver(self, hook: Hook, delivery: HookDelivery) -> None:
        logs.concerning_raw(delivery.message_id, delivery.body.encode())  # its own task: the lines below name the event
        try:
            body = delivery.body.encode()
            timestamp = str(int(time.time()))
            headers = {
                "Content-Type": "application/json",
                "Signoff-Delivery": delivery.id,
                "Idempotency-Key": delivery.id,
                "Signoff-Event": delivery.event_type,
                "Signoff-Timestamp": timestamp,
                "Signoff-Signature": sign(hook.secret, timestamp, body),
            }
            error = None
            try:
                response = await self.http.post(hook.url, content=body, headers=headers, timeout=hook.timeout_seconds)
                if not response.is_success:
                    error = f"HTTP {response.status_code}"
            except httpx.HTTPError as failure:
                error = redact_text(f"{type(failure).__name__}: {failure}")
            if error is None:
                await faults.reached("publisher.after_hook")
            attempts = delivery.attempts + 1
            delay = None if error is None else retry_delay(attempts, hook.max_attempts or self.max_attempts)
            if error is None:
                values: dict[str, object] = {"delivered_at": now(), "attempts": attempts}
            elif delay is None:
                values = {
                    "attempts": attempts,
                    "last_error": error,
                    "given_up_at": now(),
                    "given_up_reason": "attempts_exhausted",
                }
            else:
                values = {
                    "attempts": attempts,
                    "last_error": error,
                    "next_attempt_at": now() + timedelta(seconds=delay),
                }
            fence = self.leadership.fence if self.leadership is not None else None
            await hook_deliveries.record_attempt(self.sessions, delivery.id, values, fence)
            outcome = "delivered" if error is None else "failed" if delay is not None else "given_up"
            HOOK_DELIVERIES.labels(hook.name, outcome).inc()
            if error is not None and delay is None:
                alert(
                    "attempts_exhausted",
                    hook=hook.name,
                    delivery_id=delivery.id,
                    message_id=delivery.message_id,
                    event_type=delivery.event_type,
                    attempts=attempts,
                    last_error=error,
                )
            elif error is not None:
                log.warning("hook %s delivery %s failed (%s); retrying in %.1fs", hook.name, delivery.id, error, delay)
        except LeadershipLost:
            log.info("hook %s delivery %s not recorded: this publisher no longer leads", hook.name, delivery.id)
        except Exception:
            log.exception("hook %s delivery %s", hook.name, delivery.id)
        finally:
            self.in_flight.get(hook.name, set()).discard(delivery.id)

    async def stop(self) -> None:
        """Cancel the deliveries in flight (their rows stay due, for whoever leads next)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def deliver_hooks_forever(deliverer: HookDeliverer, pause: float = 0.05) -> None:
    """Retire removed hooks' deliveries, then deliver what is due, until this publisher
    no longer leads (LeadershipLost)."""
    leadership = deliverer.leadership
    retired = False
    while True:
        if leadership is not None:
            leadership.ensure()
        try:
            if not retired:
                await deliverer.retire_removed()
                retired = True
                if not deliverer.hooks:
                    return
            await deliverer.deliver_due()
        except LeadershipLost:
            raise
        except Exception:
            log.exception("hook delivery loop")
            await asyncio.sleep(1.0)  # the database away: do not log this twenty times a second
        await asyncio.sleep(pause)
