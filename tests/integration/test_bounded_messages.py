"""Bounded messages, unbounded results kept (docs/design.md, "Bounded
messages"): a model step names its transcript instead of carrying it, so the bytes the
ledger stores per step stay flat however long a session grows; a tool result larger
than any message is kept whole in the ledger and reaches the model truncated, saying so."""

import pytest
from sqlalchemy import select, text

from shared.ledger.tables import Closure, ExecutionClaim, OutboxRow, TranscriptRow, Turn
from shared.ledger.transcripts import LedgerTranscripts, TranscriptMismatch, digest_of
from shared.messages import StartTurn, mint
from tests.harness import assert_nothing_left_in_any_queue, next_event, rows
from tests.long_session import TABLE_BYTES, bytes_per_step, long_script

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


# 500 model steps and 450 tool calls take a minute or two on a busy machine: past the suite's 120 s default.
@pytest.mark.timeout(900)
@pytest.mark.slow(reason="a 500-step session: 500 model steps and 450 tool calls through every service")
async def test_a_500_step_session_stores_the_same_bytes_per_step_late_as_early(pg_deployment, tmp_path):
    deployment = pg_deployment
    deployment.script_file = long_script(tmp_path / "long.yaml", turns=TURNS, steps_per_turn=STEPS_PER_TURN)
    deployment.start()

    async def measure():
        async with deployment.engine("console") as engine, engine.connect() as conn:
            return {name: int(await conn.scalar(text(query))) for name, query in TABLE_BYTES.items()}

    async with deployment.console() as console:
        per_step = await bytes_per_step(console, measure, turns=TURNS, steps_per_turn=STEPS_PER_TURN)
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    async with deployment.ledger() as ledger, ledger() as db:
        steps = await db.scalar(text("SELECT count(*) FROM steps"))
    assert steps == TURNS * STEPS_PER_TURN
    totals = [sum(step.values()) for step in per_step]
    outbox = [step["outbox"] for step in per_step]
    figures = (f"ledger bytes per step by turn of {STEPS_PER_TURN}: {[round(t) for t in totals]}; "
               f"outbox: {[round(o) for o in outbox]}")
    print(figures)
    # Flat: the last 50 steps store what the first 50 did, give or take a few digits of ids.
    assert totals[-1] <= 1.1 * totals[0], figures
    assert outbox[-1] <= 1.1 * outbox[0], figures


async def test_service_text_with_a_nul_is_recorded_with_a_replacement_character_instead_of_failing(deployment):
    """A tool's error and a model's answer are a service's text, not a person's: a NUL in
    them (which PostgreSQL's text refuses) is replaced where the ledger records them."""
    deployment.start()
    session_id = mint("nul").replace("_", "-")
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="fail with a NUL"))
        closed = await next_event(events, "tool.closed", timeout=60)
        completed = await next_event(events, "turn.completed", "turn.failed", timeout=60)
        await assert_nothing_left_in_any_queue(console, deployment.namespace)
    assert completed.type == "turn.completed" and completed.text == "A final answer with a \x00 in it."
    [closure] = await rows(deployment, Closure, call_id=closed.call_id)
    assert (closure.kind, closure.reason_text) == ("error", "ValueError: the device said \ufffd and stopped")
    [turn] = await rows(deployment, Turn, id=completed.turn_id)
    assert turn.final_text == "A final answer with a \ufffd in it."
