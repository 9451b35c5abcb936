"""Tools that ship with Signoff, for the demo, the tests and the benchmark."""

from __future__ import annotations

import re
import threading
from typing import Any

from .tools import ToolContext

_counts: dict[str, int] = {}
# Python tools run in threads of their own (tools.py): concurrent calls share the counter.
_counts_lock = threading.Lock()


def publish_post(arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    """Write a post under the data folder: an outward effect a person can see."""
    slug = re.sub(r"[^a-z0-9-]+", "-", str(arguments["title"]).lower()).strip("-") or "post"
    folder = context.data_dir / "published"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{slug}.md"
    path.write_text(f"# {arguments['title']}\n\n{arguments['body']}\n")
    return {"published": str(path), "idempotency_key": context.idempotency_key}


def read_clock(arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    from datetime import UTC, datetime

    return {"utc": datetime.now(UTC).isoformat(timespec="seconds")}


def count(arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    """Increment an in-process counter: a tool that costs nothing, for the benchmark."""
    key = str(arguments.get("counter", "default"))
    with _counts_lock:
        _counts[key] = value = _counts.get(key, 0) + 1
    return {"counter": key, "value": value}


def fail(arguments: dict[str, Any], context: ToolContext) -> None:
    raise RuntimeError(str(arguments.get("message", "the tool failed on purpose")))
