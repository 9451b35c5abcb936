"""Python tools for the tests' catalogue (tests/fixtures/tools.yaml), imported by the
executor as `tests.fixture_tools:<function>` (services start in the project root)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def runs_folder(data_dir: Path) -> Path:
    return data_dir / "sleep_then_count"


def sleep_then_count(arguments: dict[str, Any], context: Any) -> dict[str, Any]:
    """Note the start, sleep `seconds` (a blocking sleep, as slow plain code is), then
    note the effect: one line each in `<data dir>/sleep_then_count/<counter>.started`
    and `.ran`, so a test counts how often the call started and how often it finished."""
    folder = runs_folder(context.data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    counter = str(arguments.get("counter", "default"))
    line = f"{context.call_id} attempt {context.attempt} {context.idempotency_key}\n"
    with open(folder / f"{counter}.started", "a") as started:
        started.write(line)
    time.sleep(float(arguments.get("seconds", 1)))
    with open(folder / f"{counter}.ran", "a") as ran:
        ran.write(line)
    return {"counter": counter, "slept": arguments.get("seconds", 1)}


async def nap(arguments: dict[str, Any], context: Any) -> dict[str, Any]:
    """An `async def` tool: awaits `seconds`, as well-behaved async code does."""
    import asyncio

    await asyncio.sleep(float(arguments.get("seconds", 1)))
    return {"napped": arguments.get("seconds", 1)}


def odd_values(arguments: dict[str, Any], context: Any) -> dict[str, Any]:
    """A result JSON cannot hold as it is."""
    from datetime import UTC, datetime

    return {"when": datetime(2026, 1, 2, tzinfo=UTC), "tags": {"a"}, "ratio": float("nan")}


def exits(arguments: dict[str, Any], context: Any) -> None:
    raise SystemExit("a tool that calls sys.exit")


def times_out_itself(arguments: dict[str, Any], context: Any) -> None:
    raise TimeoutError("the tool's own request timed out")


def emit_output(arguments: dict[str, Any], context: Any) -> str:
    """A result of `bytes` characters (a 16-character pattern), ending in a line that
    says so: larger than any message may be (tests/integration/test_bounded_messages.py)."""
    size = int(arguments.get("bytes", 1 << 20))
    end = f"\nthe end of {size} characters"
    return ("0123456789abcdef" * (size // 16 + 1))[: size - len(end)] + end


def fail_with_nul(arguments: dict[str, Any], context: Any) -> None:
    """An error whose text holds a NUL, which PostgreSQL's text refuses."""
    raise ValueError("the device said \x00 and stopped")
