"""Tools that ship with Signoff, for the demo, the tests and the benchmark."""

from __future__ import annotations

import fcntl
import hashlib
import re
from typing import Any

# Light on purpose: each call imports this module in a process of its own (tool_process.py).
from .tool_process import ToolContext


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
    """Increment a counter kept in the tools' folder: a tool that costs next to
    nothing, for the benchmark. Each call runs in a process of its own, so the
    count is a file, locked while it changes."""
    key = str(arguments.get("counter", "default"))
    folder = context.data_dir / "counts"
    folder.mkdir(parents=True, exist_ok=True)
    # The name comes from the model: a digest, never a path.
    with open(folder / hashlib.sha256(key.encode()).hexdigest()[:32], "a+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)
        counter.seek(0)
        value = int(counter.read() or 0) + 1
        counter.seek(0)
        counter.truncate()
        counter.write(str(value))
    return {"counter": key, "value": value}


def fail(arguments: dict[str, Any], context: ToolContext) -> None:
    raise RuntimeError(str(arguments.get("message", "the tool failed on purpose")))
