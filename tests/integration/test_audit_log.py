"""The tamper-evident audit log (docs/design.md, "The audit log"), on the real
services: a session through a refused and an accepted response, approval,
execution and closure leaves a record that `signoff audit verify` finds intact,
that `signoff audit show` tells as a story and `signoff audit export` writes as
JSON lines without the arguments; an UPDATE made as the database's owner is
named by `verify`; on PostgreSQL no service's role may UPDATE or DELETE it."""

import asyncio
import contextlib
import json
import sqlite3
import subprocess

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import create_async_engine

from shared.ledger.tables import AuditEntry, AuditLink
from shared.settings import Settings
from shared.messages import RespondToApproval, StartTurn, mint
from tests.harness import POSTGRES_URL, SERVICES, eventually, next_event, start_and_wait_for_approval
from tests.integration.test_command_line import signoff_in_process


def signoff(deployment, *args: str) -> subprocess.CompletedProcess:
    """`signoff audit …` as a person runs it (its main in this process: the exit code and both outputs)."""
    return signoff_in_process(deployment, *args)


async def verified(deployment) -> str:
    """`signoff audit verify`'s answer once every entry is in the global chain."""
    async def linked():
        result = await asyncio.to_thread(signoff, deployment, "audit", "verify")
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout if ", 0 written since its last link" in result.stdout else None

    # A transaction held open anywhere in the cluster (another test's) delays linking.
    return await eventually(linked, timeout=60)


async def update_as_owner(deployment, statement: str) -> None:
    """A change made as the database's owner, whom no grant stops."""
    if deployment.store == "postgres":
        engine = create_async_engine(Settings(database_url=POSTGRES_URL).ledger_url)
        async with engine.begin() as conn:
            await conn.execute(text(f'SET search_path TO "{deployment.namespace}"'))
            await conn.execute(text(statement))
        await engine.dispose()
    else:
        with sqlite3.connect(deployment.data_dir / "ledger.db") as db:
            db.execute(statement)


async def test_audit_verify_passes_on_a_real_run_and_names_the_entry_the_owner_changed(deployment, sink):
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="tok-secret-123")
    deployment.start()
    session_id = "ses_" + "a" * 32
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id, "post hello")
        await console.respond(requested.request_id, "approve", "", "", "tester")
        completed = await next_event(events, "turn.completed")
        assert completed.text == "Posted."
    assert sink.counts["/sink"] == 1

    said = await verified(deployment)
    assert "intact" in said

    shown = await asyncio.to_thread(signoff, deployment, "audit", "show", session_id)
    assert shown.returncode == 0, shown.stderr
    story = shown.stdout
    assert f"session {session_id}:" in story and "chain intact" in story
    expected_in_order = [
        "started turn trn_",
        "the model asked to call post_to_sink as call_",
        f"approval request {requested.request_id} for call_",
        f"tester approved {requested.request_id} via channel cli",
        f"{requested.request_id} was approved by tester",
        "(post_to_sink) was sent to the executor on the approval of " + requested.request_id,
        "claimed call_",
        "ran: output",
        "closed as output",
        "completed",
    ]
    positions = [story.find(line) for line in expected_in_order]
    assert -1 not in positions and positions == sorted(positions), story

    exported = deployment.data_dir / "audit.jsonl"
    result = await asyncio.to_thread(signoff, deployment, "audit", "export", "--output", str(exported))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    ours = [line for line in lines if line["session_id"] == session_id]
    assert [line["session_seq"] for line in ours] == list(range(1, len(ours) + 1))
    assert all(line["link"] is not None and line["hash"].startswith("sha256:") for line in lines)
    # Digests and ids, never the arguments (one a secret) nor the secret the tool was given.
    for said in ("hello from signoff", "sk-secret-123", "tok-secret-123", "post hello", "Posted."):
        assert said not in exported.read_text(), said
    to_stdout = await asyncio.to_thread(signoff, deployment, "audit", "export", "--session", session_id)
    assert [json.loads(line) for line in to_stdout.stdout.splitlines()] == ours

    async with deployment.ledger() as ledger, ledger() as db:
        decided = await db.scalar(
            select(AuditEntry.id).where(AuditEntry.session_id == session_id, AuditEntry.kind == "approval.decided"))
    await update_as_owner(deployment, f"UPDATE audit_log SET actor = 'mallory' WHERE id = {decided}")
    result = await asyncio.to_thread(signoff, deployment, "audit", "verify")
    assert result.returncode == 1
    assert f"BROKEN at entry {decided} (session {session_id} #" in result.stderr, result.stderr
    shown = await asyncio.to_thread(signoff, deployment, "audit", "show", session_id)
    assert shown.returncode == 1 and f"chain BROKEN at entry {decided}" in shown.stdout


async def test_refused_responses_and_a_denial_are_on_record_with_their_reasons(deployment):
    deployment.start()
    session_id, unknown = "ses_" + "b" * 32, "ses_" + "f" * 32
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id, "post hello")
        forged = RespondToApproval(session_id=session_id, request_id=requested.request_id, decision="approve",
                                   args_digest="hmac-sha256:" + "0" * 64, responder="tester")
        await console.send(console.sign(forged))
        await next_event(events, "message.rejected")
        # A response for a session the ledger never heard of: on record, chained globally only.
        elsewhere = forged.model_copy(update={"session_id": unknown, "message_id": mint("msg"),
                                              "response_id": mint("rsp")})
        await console.send(console.sign(elsewhere))
        await console.respond(requested.request_id, "deny", "not on a Friday", "", "tester")
        await next_event(events, "turn.completed")
    await verified(deployment)
    shown = await asyncio.to_thread(signoff, deployment, "audit", "show", session_id)
    story = shown.stdout
    assert f"a response by tester to {requested.request_id} was refused: digest_mismatch" in story
    assert f"tester denied {requested.request_id} via channel cli" in story
    assert f"{requested.request_id} was denied by tester: not on a Friday" in story
    assert "closed as denied (denied_by_person: not on a Friday)" in story
    shown = await asyncio.to_thread(signoff, deployment, "audit", "show", unknown)
    assert "was refused: unknown_request" in shown.stdout and "  --  " in shown.stdout, shown.stdout


@pytest.mark.parametrize("table", ["audit_log", "audit_chain"])
async def test_on_postgresql_no_service_role_may_update_or_delete_the_audit_log(pg_deployment, table):
    pg_deployment.setup()
    for identity in ("approval-ledger", "publisher", "tool-executor", "console"):
        async with pg_deployment.engine(identity) as engine:
            for statement in (f"UPDATE {table} SET hash = hash", f"DELETE FROM {table}", f"TRUNCATE {table}",
                              f"ALTER TABLE {table} ADD COLUMN forged text", f"DROP TABLE {table} CASCADE"):
                with pytest.raises(ProgrammingError, match="permission denied|must be owner"):
                    async with engine.begin() as conn:
                        await conn.execute(text(statement))
            # Nobody but the owner may grant it more: PostgreSQL refuses, or (to a role
            # that holds some privilege on it) warns and grants nothing.
            with contextlib.suppress(ProgrammingError):
                async with engine.begin() as conn:
                    await conn.execute(text(f"GRANT UPDATE, DELETE ON {table} TO PUBLIC"))
            with pytest.raises(ProgrammingError, match="permission denied"):
                async with engine.begin() as conn:
                    await conn.execute(text(f"DELETE FROM {table}"))
    # The ledger appends and reads; the console reads.
    async with pg_deployment.engine("approval-ledger") as engine, engine.connect() as conn:
        await conn.execute(text(
            "INSERT INTO audit_log (session_id, kind, detail, recorded_at, hash) "
            "VALUES ('ses_x', 'turn.started', '{}', now(), 'sha256:x')"))
        assert await conn.scalar(text("SELECT count(*) FROM audit_log")) == 1
        await conn.rollback()
    async with pg_deployment.engine("console") as engine, engine.connect() as conn:
        await conn.scalar(text("SELECT count(*) FROM audit_log"))


async def test_entries_of_a_transaction_held_open_while_later_ones_are_linked_join_the_global_chain_after_it(
    pg_deployment, sink
):
    """PostgreSQL: the global chain links entries in transaction-id order once no
    older transaction runs, so a transition that commits after younger ones is
    linked before them, never skipped (services/approval_ledger/audit.py): while
    it is held open, the younger session's entries wait, intact but unlinked."""
    pg_deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    pg_deployment.start(*(s for s in SERVICES if s != "approval-ledger"))
    pg_deployment.start("approval-ledger", faults="ledger.before_commit@approval.respond:hold")
    held, other = "ses_" + "c" * 32, "read-" + "d" * 32
    async with pg_deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, held, "post hello")
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await eventually(lambda: asyncio.sleep(0, pg_deployment.fault_reached("ledger.before_commit")))
        # The response's transaction is open, its entries written; another session runs
        # to its end meanwhile, and its entries wait for the older transaction.
        others = await console.watch(other)
        await console.send(StartTurn(session_id=other, text="what time is it"))
        await next_event(others, "turn.completed")
        await asyncio.sleep(1.5)  # three linking passes
        waiting = await asyncio.to_thread(signoff, pg_deployment, "audit", "verify")
        assert waiting.returncode == 0 and ", 0 written since" not in waiting.stdout, waiting.stdout + waiting.stderr
        pg_deployment.release("ledger.before_commit")
        await next_event(events, "turn.completed")
    said = await verified(pg_deployment)
    assert "intact" in said
    async with pg_deployment.ledger() as ledger, ledger() as db:
        decided = await db.scalar(
            select(AuditEntry.id).where(AuditEntry.session_id == held, AuditEntry.kind == "approval.decided"))
        assert decided is not None


async def test_two_ledgers_committing_at_once_keep_one_global_chain(pg_deployment):
    """Every transition's entries commit with it on either ledger replica; both
    replicas link, taking turns on the head row; the record verifies as one chain
    with every entry linked once."""
    pg_deployment.start(*SERVICES, "approval-ledger#2")
    sessions = ["read-" + mint("ses")[4:] for _ in range(8)]
    async with pg_deployment.console() as console:
        watched = [await console.watch(session_id) for session_id in sessions]
        for session_id in sessions:
            await console.send(StartTurn(session_id=session_id, text="what time is it"))
        for events in watched:
            await next_event(events, "turn.completed", timeout=60)
    said = await verified(pg_deployment)
    async with pg_deployment.ledger() as ledger, ledger() as db:
        entries = await db.scalar(select(func.count()).select_from(AuditEntry))
        links = await db.scalar(select(func.count()).select_from(AuditLink))
        per_session = (await db.execute(
            select(AuditEntry.session_id, func.count(), func.max(AuditEntry.session_seq))
            .group_by(AuditEntry.session_id))).all()
    assert f"intact: {entries} entries, {entries} in the global chain" in said and links == entries
    assert len(per_session) == len(sessions) and all(count == last for _, count, last in per_session)
