"""Revert each fix once and watch its test fail (`make revert-checks`).

Each entry below undoes one mechanism that an invariant rests on, in a
throw-away git worktree of HEAD, runs the tests that guard it, and reports
whether they caught it. A test that still passes with its fix reverted has no
teeth. Takes several minutes; needs the same services as the crash tests.

    python -m tests.revert_checks [INDEX ...]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent

MUTATIONS = [
  ("hooks delivered at most once (marked delivered before the POST)", "services/publisher/hooks.py",
   "            body = delivery.body.encode()\n",
   "            async with self.sessions() as db, db.begin():\n                await db.execute(update(HookDelivery).where(HookDelivery.id == delivery.id).values(delivered_at=now()))\n            body = delivery.body.encode()\n",
   "tests/crash/test_crash_windows.py::test_a_held_hook_and_a_killed_ledger_and_publisher_keep_the_request_id_answerable"),
  ("outbox committed apart from state (publish before commit)", "services/approval_ledger/unit_of_work.py",
   "    async def commit(self) -> None:\n        await self.flush(final=True)",
   "    async def commit(self) -> None:\n        if self._outbox:\n            async with self._engine.begin() as side:\n                await side.execute(_INSERT[OUTBOX], self._outbox)\n            self._outbox = []\n        await self.flush(final=True)",
   "tests/crash/test_crash_windows.py::test_a_ledger_killed_before_commit_shows_nothing_and_the_redelivery_mints_the_only_request"),
  ("no inbox", "services/approval_ledger/unit_of_work.py",
   "        if inserted.rowcount == 0:\n            raise Duplicate(message.message_id)",
   "        if False:\n            raise Duplicate(message.message_id)",
   "tests/crash/test_crash_windows.py::test_a_ledger_killed_after_commit_before_ack_treats_the_redelivery_as_a_no_op tests/crash/test_crash_windows.py::test_redis_flushed_at_every_step_changes_nothing_but_speed tests/integration/test_bad_input_and_redelivery.py::test_a_redelivered_response_executes_the_tool_once_even_with_redis_flushed"),
  ("publisher marks sent before sending", "services/publisher/relay.py",
   "        # One channel, publishes started in id order",
   "        async with self.engine.begin() as conn:\n"
   "            await conn.execute(update(OUTBOX).where(OUTBOX.c.id.in_([r.id for r in rows])).values(sent_at=now()))\n"
   "        # One channel, publishes started in id order",
   "tests/crash/test_crash_windows.py::test_a_publisher_killed_after_send_before_marking_resends_with_the_same_id_and_consumers_drop_it"),
  ("no leader lock: every publisher relays", "services/publisher/leadership.py",
   '    if not await connection.fetchval("SELECT pg_try_advisory_lock($1)", lock):',
   '    if False:',
   "tests/crash/test_failover.py::test_a_standby_publisher_relays_nothing_while_the_leader_lives_and_takes_over_when_it_is_killed"),
  ("queues auto-delete", "shared/topology.py",
   "            durable=True,\n            routing_key=routing_key,",
   "            durable=False, auto_delete=True,\n            routing_key=routing_key,",
   "tests/crash/test_crash_windows.py::test_a_response_sent_while_the_ledger_is_down_waits_and_is_applied_once"),
  ("dead outward claim retried", "services/tool_executor/claims.py",
   '    if effect == "outward":\n        return ClaimOutcome("lost")',
   '    if False:\n        return ClaimOutcome("lost")',
   "tests/crash/test_crash_windows.py::test_an_outward_call_whose_executor_died_mid_call_is_closed_as_outcome_unknown_and_never_rerun tests/crash/test_crash_windows.py::test_an_outward_call_killed_after_its_effect_before_recording_is_outcome_unknown"),
  ("new idempotency key per attempt", "services/tool_executor/handlers.py",
   "                command.call_id, command.session_id, command.idempotency_key, verdict.attempt, executor.data_dir",
   "                command.call_id, command.session_id, f'{command.idempotency_key}{verdict.attempt}', verdict.attempt,"
   " executor.data_dir",
   "tests/crash/test_crash_windows.py::test_an_idempotent_call_whose_executor_died_mid_call_is_retried_with_the_same_idempotency_key"),
  ("finished claim runs again", "services/tool_executor/claims.py",
   '    if claim.status == "finished":\n        return ClaimOutcome("report"',
   '    if claim.status == "finished":\n        return ClaimOutcome("run", attempt=claim.attempts + 1)\n        return ClaimOutcome("report"',
   "tests/crash/test_crash_windows.py::test_an_executor_killed_after_recording_reports_the_recorded_result_without_running_again"),
  ("duplicate step report treated as new", "services/approval_ledger/domain.py",
   '    if step.status != "requested":\n        return StepReport("duplicate"',
   '    if False:\n        return StepReport("duplicate"',
   "tests/crash/test_crash_windows.py::test_a_model_step_killed_after_reporting_has_its_second_report_discarded_and_counted"),
  ("redeliveries not counted", "shared/consuming.py",
   'previous_deliveries.set(delivered_before)',
   'previous_deliveries.set(0)',
   "tests/crash/test_crash_windows.py::test_a_model_step_killed_mid_call_is_redelivered_and_the_lost_attempt_is_counted_as_abandoned"),
  ("in-flight work cancelled with the connection", "shared/consuming.py",
   "            await asyncio.shield(work)",
   "            await work",
   "tests/crash/test_broker_restart.py"),
  ("times read back from SQLite without a time zone", "shared/ledger/tables.py",
   "        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)",
   "        return value",
   "tests/crash/test_crash_windows.py::test_an_outward_call_killed_after_its_effect_before_recording_is_outcome_unknown[sqlite]"),
  ("a message failing its last delivery left to the broker, without its error", "shared/consuming.py",
   "            if delivered_before >= self.topology.delivery_limit:",
   "            if False:",
   "tests/integration/test_command_line.py::test_a_message_that_fails_on_every_delivery_is_parked_with_the_reason_and_its_last_error"),
  ("a service that was ready backed off when it dies soon after a restart", "services/supervisor.py",
   "            if self.became_ready(service):",
   "            if False:",
   "tests/integration/test_supervisor.py::test_signoff_up_restarts_a_killed_ledger_at_once_and_the_waiting_response_is_applied_once"),
  ("responses accepted unsigned (no channel authentication)", "services/approval_ledger/handlers.py",
   "    refused = domain.authenticate_response(\n        response, authority.channels, at=uow.now, window=authority.response_window\n    ) or (",
   "    refused = None or (",
   "tests/integration/test_trust.py::test_forged_stale_replayed_and_unauthorized_responses_are_refused_and_a_signed_one_counts_once"),
  ("the executor trusts any authorization the ledger's key sealed (no check against the ledger's rows)",
   "services/tool_executor/claims.py",
   "            refusal = ledger_allows(row and CallOnRecord(*row), granted, tool, fingerprint)",
   "            refusal = None",
   "tests/integration/test_trust.py::test_forged_altered_and_expired_tool_executions_run_nothing_and_tell_an_operator"),
  ("an expired authorization still runs", "shared/authorization.py",
   "    if granted.expires_at <= at:",
   "    if False:",
   "tests/integration/test_trust.py::test_forged_altered_and_expired_tool_executions_run_nothing_and_tell_an_operator"),
  ("the session's starter may approve its own call", "services/approval_ledger/domain.py",
   "        if responder in request.starters:",
   "        if False:",
   "tests/integration/test_authorization.py::test_the_sessions_starter_may_not_approve_a_tool_that_forbids_it_and_another_person_may"),
  ("anyone may approve, approvers or not", "services/approval_ledger/domain.py",
   "    if policy.approvers is not None and responder not in policy.approvers:",
   "    if False:",
   "tests/integration/test_authorization.py::test_only_a_tools_approvers_may_approve_it"),
  ("a response token counts twice", "services/approval_ledger/domain.py",
   "    if request.token_used:",
   "    if False:",
   "tests/integration/test_authorization.py::test_a_response_token_counts_once_for_its_own_request_and_is_kept_only_as_a_hash"),
  ("a late answer to an expired request is judged as if it were decided", "services/approval_ledger/domain.py",
   '    if request.status == "expired" or (request.status == "pending" and has_expired(request, at)):',
   '    if False:',
   "tests/integration/test_lifetimes.py"),
  ("no expiry sweep: an unanswered request waits forever", "services/approval_ledger/main.py",
   "            handlers.sweep_expired_requests(ledger, settings.expiry_sweep_seconds),",
   "            asyncio.sleep(0),",
   "tests/integration/test_lifetimes.py tests/crash/test_crash_windows.py::test_an_expiry_sweep_killed_half_way_closes_each_request_once_after_the_restart"),
  ("a cancelled call's claim is not held back from the executor", "services/approval_ledger/handlers.py",
   '        claim = await records.hold_back(uow, call) if call.status == "executing" else None',
   '        claim = None',
   "tests/integration/test_lifetimes.py::test_a_call_cancelled_before_the_executor_took_it_never_runs "
   "tests/integration/test_lifetimes.py::test_cancelling_while_an_outward_call_runs_closes_it_as_outcome_unknown_and_tells_an_operator"),
  ("no fence: a deposed publisher still marks rows sent", "services/publisher/leadership.py",
   "        self.check((await conn.execute(_FENCE)).scalar())",
   "        return None",
   "tests/crash/test_failover.py::test_a_deposed_leaders_batch_in_flight_is_not_marked_sent_by_it_and_goes_out_again_once"),
  ("an outage spends the message's deliveries instead of pausing", "shared/consuming.py",
   "                if not is_outage(error):",
   "                if True:",
   "tests/crash/test_database_outage.py"),
  ("parked messages the turn waited on are ignored: the session stays stuck", "services/approval_ledger/main.py",
   "    runtime.consume_parked(apply_parked)",
   "    pass",
   "tests/integration/test_lifetimes.py::test_a_model_result_that_fails_on_every_delivery_fails_its_turn_with_the_reason_instead_of_a_stuck_session"),
  ("a request is escalated on every sweep (its escalation not recorded)", "services/approval_ledger/handlers.py",
   "        uow.update(records.APPROVAL_REQUESTS, request.id, escalated_at=uow.now)",
   "        pass",
   "tests/integration/test_lifetimes.py::test_an_unanswered_request_is_escalated_once_and_the_escalation_group_may_then_approve"),
  ("rollback publishes", "services/approval_ledger/unit_of_work.py",
   "        await self.db.rollback()\n        await self.db.close()",
   "        await self.db.commit()\n        await self.db.close()",
   "tests/integration/test_publisher.py::test_the_publisher_sends_nothing_that_was_not_committed"),
  ("a failed group's messages all fail with it instead of each being applied alone",
   "services/approval_ledger/group_commit.py",
   "            for waiting in group:\n                await self._apply_alone(waiting)",
   "            for waiting in group:\n                waiting.done.set_exception(error)",
   "tests/integration/test_group_commit.py::test_a_message_that_fails_in_a_group_fails_alone_and_the_others_commit"),
  ("a group applies one session's messages out of delivery order", "services/approval_ledger/group_commit.py",
   "        ordered = sorted(group, key=lambda w: w.message.session_id)",
   "        ordered = list(reversed(group))",
   "tests/integration/test_group_commit.py::"
   "test_waiting_messages_commit_in_one_transaction_each_with_its_inbox_row_and_in_session_order"),
  ("on classic queues a message that keeps failing is never parked (its failures not counted)", "shared/consuming.py",
   "                self._failures[message.message_id] = delivered_before + 1",
   "                pass",
   "tests/integration/test_queue_types.py::"
   "test_on_classic_queues_a_message_that_fails_on_every_delivery_is_parked_at_the_delivery_limit"),
  ("a duplicate turn in a group commit leaves the session it would open behind", "services/approval_ledger/unit_of_work.py",
   '        " WHERE EXISTS (SELECT FROM inbox) ON CONFLICT (id) DO NOTHING)"',
   '        " ON CONFLICT (id) DO NOTHING)"',
   "tests/integration/test_group_commit.py::"
   "test_a_duplicate_in_a_group_leaves_nothing_behind_not_even_the_session_its_turn_would_open"),
]


def main(argv: list[str]) -> int:
    only = {int(i) for i in argv}
    toothless = 0
    with tempfile.TemporaryDirectory(prefix="signoff-revert-") as scratch:
        root = Path(scratch) / "tree"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(root), "HEAD"], cwd=PROJECT, check=True)
        try:
            for index, (name, path, old, new, tests) in enumerate(MUTATIONS):
                if only and index not in only:
                    continue
                target = root / path
                text = target.read_text()
                if old not in text:
                    print(f"{index:2d} {name}: the code to revert was not found; update this check")
                    toothless += 1
                    continue
                target.write_text(text.replace(old, new, 1))
                try:
                    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", *tests.split()], cwd=root,
                                         capture_output=True, text=True, timeout=900)
                finally:
                    subprocess.run(["git", "checkout", "-q", path], cwd=root, check=True)
                caught = run.returncode != 0
                toothless += not caught
                last = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
                print(f"{index:2d} {name}: {'caught' if caught else 'NOT CAUGHT'} ({last})", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(root)], cwd=PROJECT, check=False)
    print("every reverted fix was caught" if not toothless else f"{toothless} reverted fix(es) not caught")
    return 1 if toothless else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
