"""Bounded messages, unbounded results kept (issue 12; docs/design.md, "Bounded
messages"): a model step names its transcript instead of carrying it, so the bytes the
ledger stores per step stay flat however long a session grows; a tool result larger
than any message is kept whole in the ledger and reaches the model truncated, saying so."""

import json

import pytest
import yaml
from sqlalchemy import select, text

from shared.ledger.tables import TABLES, Closure, ExecutionClaim, OutboxRow, TranscriptRow
from shared.ledger.transcripts import LedgerTranscripts, TranscriptMismatch, digest_of
from shared.messages import StartTurn, mint
from shared.settings import PROJECT_ROOT
from tests.harness import assert_nothing_left_in_any_queue, next_event, rows

MEGABYTE = 1 << 20


async def transcript_of(deployment, session_id):
    async with deployment.ledger() as ledger, ledger() as db:
        found = await db.scalars(
            select(TranscriptRow).where(TranscriptRow.session_id == session_id).order_by(TranscriptRow.position))
        return [r.entry for r in found]


async def test_a_megabyte_tool_result_is_kept_whole_in_the_ledger_and_reaches_the_model_truncated(deployment):
    deployment.start()
    session_id = mint("big").replace("_", "-")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="emit a megabyte"))
        closed = await next_event(events, "tool.closed", timeout=60)
        assert closed.kind == "output"
        await next_event(events, "turn.completed", timeout=60)
        # Nothing parked, nothing stuck: the report went out under the message limit.
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    whole = ("0123456789abcdef" * (MEGABYTE // 16 + 1))[: MEGABYTE - len(end := f"\nthe end of {MEGABYTE} characters")]
    whole += end
    [closure] = await rows(deployment, Closure, call_id=closed.call_id)
    assert closure.output == {"value": whole}, "the ledger keeps the whole output"
    [claim] = await rows(deployment, ExecutionClaim, call_id=closed.call_id)
    assert claim.result["output"] == whole
    said = [e for e in await transcript_of(deployment, session_id) if e.get("closure") == "output"]
    [result] = said
    limit = deployment.settings.tool_output_model_chars
    assert result["text"].startswith(whole[:limit]) and len(result["text"]) < limit + 300
    assert result["text"].endswith(
        f"[Signoff truncated this result: the first {limit} of {MEGABYTE} characters are shown; "
        f"the whole output is kept in the ledger (call {closed.call_id}).]")
    async with deployment.ledger() as ledger, ledger() as db:
        biggest = await db.scalar(select(OutboxRow.body).where(OutboxRow.session_id == session_id)
                                  .order_by(text("length(body) DESC")).limit(1))
    assert len(biggest) < 64 * 1024, "no message of the session carries the output"


async def test_a_step_reads_exactly_the_transcript_prefix_it_names_and_refuses_any_other(deployment):
    """A redelivered step sees the same entries, however the session grew since: it
    reads positions 1..n with the model-step's own role and checks their digest."""
    deployment.start()
    session_id = mint("read").replace("_", "-")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="what time is it"))
        await next_event(events, "turn.completed", timeout=60)
    stored = await transcript_of(deployment, session_id)
    assert len(stored) >= 4
    async with deployment.engine("model-step") as engine:
        transcripts = LedgerTranscripts(engine)
        first_two = await transcripts.read(session_id, 2, digest_of(stored[:2]))
        assert [e.model_dump(mode="json") for e in first_two] == stored[:2]
        whole = await transcripts.read(session_id, len(stored), digest_of(stored))
        assert len(whole) == len(stored)
        with pytest.raises(TranscriptMismatch, match="digest"):
            await transcripts.read(session_id, 2, digest_of(stored[:1] + stored[2:3]))
        with pytest.raises(TranscriptMismatch, match="holds"):
            await transcripts.read(session_id, len(stored) + 1, digest_of(stored))


TURNS, STEPS_PER_TURN = 10, 50


def long_script(tmp_path):
    """The fixtures' script, and sessions `long-*` of TURNS turns of STEPS_PER_TURN model
    steps each: every step but a turn's last reads the clock (no approval)."""
    script = yaml.safe_load((PROJECT_ROOT / "tests" / "fixtures" / "script.yaml").read_text())
    turn = [{"text": "Reading the clock again.", "tool_calls": [{"name": "read_clock", "arguments": {}}]}] * (
        STEPS_PER_TURN - 1) + [{"text": "That is the time."}]
    script["sessions"]["long-*"] = turn * TURNS
    path = tmp_path / "long-script.yaml"
    path.write_text(yaml.safe_dump(script))
    return path


async def ledger_bytes(deployment) -> dict[str, int]:
    """What each ledger table holds, in bytes (PostgreSQL's size of every row)."""
    sizes = {}
    async with deployment.engine("console") as engine, engine.connect() as conn:
        for name in TABLES:
            sizes[name] = int(await conn.scalar(text(f'SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM "{name}" t')))
    return sizes


async def test_a_500_step_session_stores_the_same_bytes_per_step_late_as_early(pg_deployment, tmp_path):
    deployment = pg_deployment
    deployment.script_file = long_script(tmp_path)
    deployment.start()
    session_id = mint("long").replace("_", "-")
    per_step = []
    async with deployment.console() as console:
        events = await console.watch(session_id)
        before = await ledger_bytes(deployment)
        for number in range(TURNS):
            await console.send(StartTurn(session_id=session_id, text=f"turn {number}: what time is it"))
            await next_event(events, "turn.completed", "turn.failed", timeout=300)
            after = await ledger_bytes(deployment)
            per_step.append({name: (after[name] - before[name]) / STEPS_PER_TURN for name in after})
            before = after
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    async with deployment.ledger() as ledger, ledger() as db:
        steps = await db.scalar(text("SELECT count(*) FROM steps"))
    assert steps == TURNS * STEPS_PER_TURN
    totals = [sum(step.values()) for step in per_step]
    outbox = [step["outbox"] for step in per_step]
    figures = (f"ledger bytes per step by turn of {STEPS_PER_TURN}: {[round(t) for t in totals]}; "
               f"outbox: {[round(o) for o in outbox]}")
    print(figures)
    (deployment.data_dir / "bytes-per-step.json").write_text(json.dumps(per_step))
    # Flat: the last 50 steps store what the first 50 did, give or take a few digits of ids.
    assert totals[-1] <= 1.1 * totals[0], figures
    assert outbox[-1] <= 1.1 * outbox[0], figures
