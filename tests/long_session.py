"""A long session and what the ledger stores per model step as it grows (bytes per
step stay flat). Used by tests/integration/test_bounded_messages.py and
`make bench`.

The session `long-<id>` runs `turns` turns of `steps_per_turn` model steps each: every
step but a turn's last reads the clock (a tool that needs no approval), so each turn
is `steps_per_turn` model steps and `steps_per_turn - 1` tool calls. After each turn
the ledger's tables are measured (PostgreSQL's size of every row); bytes per step of a
turn is what the turn added, divided by its steps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import yaml

from shared.ledger.tables import TABLES
from shared.messages import StartTurn, mint
from shared.settings import PROJECT_ROOT
from tests.harness import next_event

# Each table's bytes: the size PostgreSQL gives every row (its columns, TOASTed or not).
TABLE_BYTES = {name: f'SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM "{name}" t' for name in TABLES}


def long_script(path: Path, *, turns: int, steps_per_turn: int) -> Path:
    """The fixtures' script, with sessions `long-*` as above, written to `path`."""
    script = yaml.safe_load((PROJECT_ROOT / "tests" / "fixtures" / "script.yaml").read_text())
    turn = [{"text": "Reading the clock again.", "tool_calls": [{"name": "read_clock", "arguments": {}}]}] * (
        steps_per_turn - 1
    ) + [{"text": "That is the time."}]
    script["sessions"]["long-*"] = turn * turns
    path.write_text(yaml.safe_dump(script))
    return path


async def bytes_per_step(
    console, measure: Callable[[], Awaitable[dict[str, int]]], *, turns: int, steps_per_turn: int,
    timeout: float = 300.0,
) -> list[dict[str, float]]:
    """Run a long session; per turn, the bytes each table gained per model step."""
    session_id = mint("long").replace("_", "-")
    events = await console.watch(session_id)
    per_step = []
    before = await measure()
    for number in range(turns):
        await console.send(StartTurn(session_id=session_id, text=f"turn {number}: what time is it"))
        ended = await next_event(events, "turn.completed", "turn.failed", timeout=timeout)
        if ended.type != "turn.completed":
            raise AssertionError(f"turn {number} of {session_id} failed: {ended.reason_code}: {ended.reason_text}")
        after = await measure()
        per_step.append({name: (after[name] - before[name]) / steps_per_turn for name in after})
        before = after
    return per_step
