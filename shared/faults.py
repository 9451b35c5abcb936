"""Named fault points that crash tests arm through the environment.

`SIGNOFF_FAULTS=ledger.after_commit` makes the process SIGKILL itself the first
time it reaches that point. `ledger.after_commit@step.completed` narrows it to
one tag (for the ledger: the type of the message being applied). `:hold`
instead blocks there until the file `<data_dir>/faults/<name>.release` exists.
`:raise` raises `FaultRaised` there every time, not once: a handler that fails
on every delivery, as a poison message or a lasting outage makes it.
Each armed point writes `<data_dir>/faults/<name>.reached`; kill and hold fire once.
Unarmed, a fault point costs one truth test of an empty dict.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger("signoff.faults")

POINTS = {
    "ledger.before_commit": "inside a ledger transaction, all rows written, before COMMIT (tag: message type)",
    "ledger.after_commit": "after a ledger transaction committed, before the message is acked (tag: message type)",
    "ledger.after_expiry": "after the expiry sweep closed one request, before it closes the next",
    "publisher.after_send": "after an outbox batch was confirmed by RabbitMQ, before it is marked sent",
    "publisher.after_hook": "after a lifecycle hook was delivered (2xx), before it is marked delivered",
    "model_step.mid_call": "while the provider call is in flight",
    "model_step.after_report": "after the step result was published, before the request is acked",
    "executor.after_claim": "after the durable claim, before the tool runs",
    "executor.after_effect": "after the tool ran, before its result is recorded",
    "executor.after_record": "after the result was recorded, before it is reported",
    "console.after_record": (
        "`signoff dead-letters replay|drop`: after the action was recorded in the ledger, before the message "
        "is replayed and leaves the dead-letter queue (tag: replayed or dropped)"
    ),
}

_armed: dict[tuple[str, str | None], str] = {}
_data_dir = Path("data")


def arm(spec: str, data_dir: Path) -> None:
    global _data_dir
    _data_dir = data_dir
    for item in filter(None, (s.strip() for s in spec.split(","))):
        point, _, mode = item.partition(":")
        name, _, tag = point.partition("@")
        if name not in POINTS:
            raise ValueError(f"unknown fault point {name!r}; known: {', '.join(sorted(POINTS))}")
        if mode not in ("", "kill", "hold", "raise"):
            raise ValueError(f"unknown fault mode {mode!r}: use kill, hold or raise")
        _armed[(name, tag or None)] = mode or "kill"


class FaultRaised(RuntimeError):
    """Raised at a fault point armed with `:raise`."""


async def reached(name: str, tag: str | None = None) -> None:
    if not _armed:
        return
    key = (name, tag) if (name, tag) in _armed else (name, None)
    mode = _armed.get(key)
    if mode is None:
        return
    marker = _data_dir / "faults"
    marker.mkdir(parents=True, exist_ok=True)
    (marker / f"{name}.reached").write_text(str(os.getpid()))
    if mode == "raise":
        raise FaultRaised(f"fault point {name} armed to raise")
    del _armed[key]
    if mode == "hold":
        release = marker / f"{name}.release"
        while not release.exists():
            await asyncio.sleep(0.01)
        return
    log.warning("fault point %s reached: killing pid %s", name, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
