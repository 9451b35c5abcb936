"""Revert each fix once and watch its test fail (`make revert-checks`).

Each entry below undoes one mechanism that an invariant rests on, in a
throw-away checkout of HEAD, runs the tests that guard it, and reports
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
    (
        "hooks delivered at most once (marked delivered before the POST)",
        "services/publisher/hooks.py",
        "            body = delivery.body.encode()\n",
        '            await hook_deliveries.record_attempt(self.sessions, delivery.id, {"delivered_at": now()})\n            body = delivery.body.encode()\n',
        "tests/crash/test_crash_windows.py::test_a_held_hook_and_a_killed_ledger_and_publisher_keep_the_request_id_answerable",
    ),
    (
        "outbox committed apart from state (publish before commit)",
        "services/approval_ledger/store_postgres.py",
        "    async def _apply(self, writes: Writes, notify: bool) -> None:\n",
        '    async def _apply(self, writes: Writes, notify: bool) -> None:\n        if writes.outbox:\n            async with self._engine.begin() as side:\n                await side.execute(TABLES["outbox"].insert(), writes.outbox)\n            writes.outbox = []\n',
        "tests/crash/test_crash_windows.py::test_a_ledger_killed_before_commit_shows_nothing_and_the_redelivery_mints_the_only_request",
    ),
    (
        "no inbox",
        "services/approval_ledger/store_sql.py",
        "        if inserted.rowcount == 0:\n            raise Duplicate(message.message_id)",
        "        if False:\n            raise Duplicate(message.message_id)",
        "tests/crash/test_crash_windows.py::test_a_ledger_killed_after_commit_before_ack_treats_the_redelivery_as_a_no_op tests/crash/test_crash_windows.py::test_redis_flushed_at_every_step_changes_nothing_but_speed tests/integration/test_bad_input_and_redelivery.py::test_a_redelivered_response_executes_the_tool_once_even_with_redis_flushed",
    ),
    (
        "publisher marks sent before sending",
        "services/publisher/relay.py",
        "        # One channel, publishes started in id order",
        "        await outbox_relay.mark_sent(self.engine, [r.id for r in rows], now(), [])\n"
        "        # One channel, publishes started in id order",
        "tests/crash/test_crash_windows.py::test_a_publisher_killed_after_send_before_marking_resends_with_the_same_id_and_consumers_drop_it",
    ),
    (
        "no leader lock: every publisher relays",
        "shared/ledger/leadership.py",
        '    if not await connection.fetchval("SELECT pg_try_advisory_lock($1)", lock):',
        "    if False:",
        "tests/crash/test_failover.py::test_a_standby_publisher_relays_nothing_while_the_leader_lives_and_takes_over_when_it_is_killed",
    ),
    (
        "queues auto-delete",
        "shared/consuming.py",
        "        return await channel.declare_queue(queue.name, durable=True, arguments=queue.arguments)",
        "        return await channel.declare_queue(queue.name, durable=False, auto_delete=True, arguments=queue.arguments)",
        "tests/crash/test_crash_windows.py::test_a_response_sent_while_the_ledger_is_down_waits_and_is_applied_once",
    ),
    (
        "dead outward claim retried",
        "services/tool_executor/claims.py",
        '    if effect == "outward":\n        return ClaimOutcome("lost")',
        '    if False:\n        return ClaimOutcome("lost")',
        "tests/crash/test_crash_windows.py::test_an_outward_call_whose_executor_died_mid_call_is_closed_as_outcome_unknown_and_never_rerun tests/crash/test_crash_windows.py::test_an_outward_call_killed_after_its_effect_before_recording_is_outcome_unknown",
    ),
    (
        "new idempotency key per attempt",
        "services/tool_executor/handlers.py",
        "                command.call_id, command.session_id, command.idempotency_key, verdict.attempt, executor.data_dir",
        "                command.call_id, command.session_id, f'{command.idempotency_key}{verdict.attempt}', verdict.attempt,"
        " executor.data_dir",
        "tests/crash/test_crash_windows.py::test_an_idempotent_call_whose_executor_died_mid_call_is_retried_with_the_same_idempotency_key",
    ),
    (
        "finished claim runs again",
        "services/tool_executor/claims.py",
        '    if claim.status == "finished":\n        return ClaimOutcome("report"',
        '    if claim.status == "finished":\n        return ClaimOutcome("run", attempt=claim.attempts + 1)\n        return ClaimOutcome("report"',
        "tests/crash/test_crash_windows.py::test_an_executor_killed_after_recording_reports_the_recorded_result_without_running_again",
    ),
    (
        "duplicate step report treated as new",
        "services/approval_ledger/domain.py",
        '    if step.status != "requested":\n        return StepReport("duplicate"',
        '    if False:\n        return StepReport("duplicate"',
        "tests/crash/test_crash_windows.py::test_a_model_step_killed_after_reporting_has_its_second_report_discarded_and_counted",
    ),
    (
        "redeliveries not counted",
        "shared/consuming.py",
        "previous_deliveries.set(delivered_before)",
        "previous_deliveries.set(0)",
        "tests/crash/test_crash_windows.py::test_a_model_step_killed_mid_call_is_redelivered_and_the_lost_attempt_is_counted_as_abandoned",
    ),
    (
        "in-flight work cancelled with the connection",
        "shared/consuming.py",
        "            await asyncio.shield(work)",
        "            await work",
        "tests/crash/test_broker_restart.py",
    ),
    (
        "times read back from SQLite without a time zone",
        "shared/ledger/tables.py",
        "        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)",
        "        return value",
        "tests/crash/test_crash_windows.py::test_an_outward_call_killed_after_its_effect_before_recording_is_outcome_unknown[sqlite]",
    ),
    (
        "a message failing its last delivery left to the broker, without its error",
        "shared/consuming.py",
        "            if delivered_before >= self.topology.delivery_limit:",
        "            if False:",
        "tests/integration/test_command_line.py::test_a_message_that_fails_on_every_delivery_is_parked_with_the_reason_and_its_last_error",
    ),
    (
        "a service that was ready backed off when it dies soon after a restart",
        "services/operations/supervisor.py",
        "            if self.became_ready(service):",
        "            if False:",
        "tests/integration/test_supervisor.py::test_signoff_up_restarts_a_killed_ledger_at_once_and_the_waiting_response_is_applied_once",
    ),
    (
        "responses accepted unsigned (no channel authentication)",
        "services/approval_ledger/handlers.py",
        "    refused = domain.authenticate_response(response, authority.channels, at=store.now, window=authority.response_window)\n",
        "    refused = None\n",
        "tests/integration/test_trust.py::test_forged_stale_replayed_and_unauthorized_responses_are_refused_and_a_signed_one_counts_once",
    ),
    (
        "the executor trusts any authorization the ledger's key sealed (no check against the ledger's rows)",
        "services/tool_executor/claims.py",
        "        refusal = ledger_allows(record and call_on_record(record), granted, tool, fingerprint, self.ledger_key, target)",
        "        refusal = None",
        "tests/integration/test_trust.py::test_forged_altered_and_expired_tool_executions_run_nothing_and_tell_an_operator",
    ),
    (
        "an expired authorization still runs",
        "shared/authorization.py",
        "    if granted.expires_at <= at:",
        "    if False:",
        "tests/integration/test_trust.py::test_forged_altered_and_expired_tool_executions_run_nothing_and_tell_an_operator",
    ),
    (
        "the session's starter may approve its own call",
        "services/approval_ledger/domain.py",
        "        if responder in request.starters:",
        "        if False:",
        "tests/integration/test_authorization.py::test_the_sessions_starter_may_not_approve_a_tool_that_forbids_it_and_another_person_may",
    ),
    (
        "anyone may approve, approvers or not",
        "services/approval_ledger/domain.py",
        "    if policy.approvers is not None and responder not in policy.approvers:",
        "    if False:",
        "tests/integration/test_authorization.py::test_only_a_tools_approvers_may_approve_it",
    ),
    (
        "a response token counts twice",
        "services/approval_ledger/domain.py",
        "    if request.token_used:",
        "    if False:",
        "tests/integration/test_authorization.py::test_a_response_token_counts_once_for_its_own_request_and_is_kept_only_as_a_hash",
    ),
    (
        "a late answer to an expired request is judged as if it were decided",
        "services/approval_ledger/domain.py",
        '    if request.status == "expired" or (request.status == "pending" and has_expired(request, at)):',
        "    if False:",
        "tests/integration/test_lifetimes.py",
    ),
    (
        "no expiry sweep: an unanswered request waits forever",
        "services/approval_ledger/main.py",
        "            handlers.sweep_expired_requests(ledger, settings.expiry_sweep_seconds),",
        "            asyncio.sleep(0),",
        "tests/integration/test_lifetimes.py tests/crash/test_crash_windows.py::test_an_expiry_sweep_killed_half_way_closes_each_request_once_after_the_restart",
    ),
    (
        "a cancelled call's claim is not held back from the executor",
        "services/approval_ledger/handlers.py",
        '        claim = await store.hold_back(call) if call.status == "executing" else None',
        "        claim = None",
        "tests/integration/test_lifetimes.py::test_a_call_cancelled_before_the_executor_took_it_never_runs "
        "tests/integration/test_lifetimes.py::test_cancelling_while_an_outward_call_runs_closes_it_as_outcome_unknown_and_tells_an_operator",
    ),
    (
        "no fence: a deposed publisher still marks rows sent",
        "services/publisher/leadership.py",
        "        self.check(await fenced_epoch(conn))",
        "        return None",
        "tests/crash/test_failover.py::test_a_deposed_leaders_batch_in_flight_is_not_marked_sent_by_it_and_goes_out_again_once[with-a-hook]",
    ),
    (
        "an outage spends the message's deliveries instead of pausing",
        "shared/consuming.py",
        "                if not is_outage(error):",
        "                if True:",
        "tests/crash/test_database_outage.py",
    ),
    (
        "parked messages the turn waited on are ignored: the session stays stuck",
        "services/approval_ledger/main.py",
        "    runtime.consume_parked(apply_parked)",
        "    pass",
        "tests/integration/test_lifetimes.py::test_a_model_result_that_fails_on_every_delivery_fails_its_turn_with_the_reason_instead_of_a_stuck_session",
    ),
    (
        "a request is escalated on every sweep (its escalation not recorded)",
        "services/approval_ledger/records.py",
        '    store.update("approval_requests", request.id, escalated_at=store.now, escalated_to=escalated_to)',
        "    pass",
        "tests/integration/test_lifetimes.py::test_an_unanswered_request_is_escalated_once_and_the_escalation_group_may_then_approve",
    ),
    (
        "no retention sweep: sent outbox and old inbox rows are kept forever",
        "services/approval_ledger/main.py",
        "            sweep_forever(partial(sweep_once, engine, retention), settings.retention_sweep_seconds),",
        "            asyncio.sleep(0),",
        "tests/integration/test_lifetimes.py::test_sent_outbox_rows_inbox_rows_and_delivered_hooks_are_deleted_after_their_retention",
    ),
    (
        "the model step carries the whole transcript again (bytes per step grow with the session)",
        "services/approval_ledger/records.py",
        "            tools_digest=menu.digest,",
        "            tools_digest=menu.digest, tools=[__import__('shared.messages').messages.ToolDescription(name='t',"
        " description=__import__('json').dumps(await store.transcript_rows(session)), parameters={})],",
        "tests/integration/test_bounded_messages.py::test_a_500_step_session_stores_the_same_bytes_per_step_late_as_early",
    ),
    (
        "a result too large for a message is reported in it (parked as oversized, the outward result lost)",
        "services/tool_executor/handlers.py",
        "    if max_bytes is not None and len(encode(executed)) > max_bytes:",
        "    if False:",
        "tests/integration/test_bounded_messages.py::test_a_megabyte_tool_result_is_kept_whole_in_the_ledger_and_reaches_the_model_truncated[sqlite]",
    ),
    (
        "the model reads a result of any length, untruncated",
        "services/approval_ledger/domain.py",
        "    if len(text) <= limit:\n        return text",
        "    if True:\n        return text",
        "tests/integration/test_bounded_messages.py::test_a_megabyte_tool_result_is_kept_whole_in_the_ledger_and_reaches_the_model_truncated[sqlite]",
    ),
    (
        "a step's transcript is not checked against its digest",
        "shared/ledger/transcripts.py",
        "    if found != digest:",
        "    if False:",
        "tests/integration/test_bounded_messages.py::test_a_step_reads_exactly_the_transcript_prefix_it_names_and_refuses_any_other",
    ),
    (
        "a step's tool menu is not checked against its digest: a menu rewritten in the database is offered",
        "shared/tool_menu.py",
        "    if stored != digest:",
        "    if False:",
        "tests/integration/test_tool_menus.py::test_a_tool_menu_rewritten_in_the_database_is_refused_by_the_model_step_with_its_reason",
    ),
    (
        "a step reads the whole transcript, not the prefix it names",
        "shared/ledger/transcripts.py",
        'TRANSCRIPT.c.position <= bindparam("upto")',
        'TRANSCRIPT.c.position >= 0, bindparam("upto") >= 0',
        "tests/integration/test_bounded_messages.py::test_a_step_reads_exactly_the_transcript_prefix_it_names_and_refuses_any_other",
    ),
    (
        "a NUL in a service's text reaches PostgreSQL's text as it is",
        "services/approval_ledger/store.py",
        '    if isinstance(value, str) and "\\x00" in value:',
        "    if False:",
        "tests/integration/test_bounded_messages.py::test_service_text_with_a_nul_is_recorded_with_a_replacement_character_instead_of_failing[postgres]",
    ),
    (
        "a message without a message id gets a new one on every delivery",
        "shared/consuming.py",
        '        if "message_id" not in message.model_fields_set:',
        "        if False:",
        "tests/integration/test_bad_input_and_redelivery.py::test_a_message_that_fails_validation_is_dead_lettered_with_its_reason_and_the_next_is_processed[sqlite]",
    ),
    (
        "a replayed message stays parked as well (replayed again on every replay)",
        "services/operations/parked.py",
        "            await raw.ack()\n            acted += 1",
        "            acted += 1",
        "tests/integration/test_command_line.py::test_an_operator_replays_a_parked_response_after_the_fault_is_lifted_and_it_is_applied_once[sqlite]",
    ),
    (
        "a parked message is dropped without its reason on record",
        "shared/ledger/dead_letter_actions.py",
        "        db.add(\n            DeadLetterAction(",
        "        None and db.add(\n            DeadLetterAction(",
        "tests/integration/test_command_line.py::test_an_operator_drops_parked_messages_with_a_reason_that_the_ledger_keeps[sqlite]",
    ),
    (
        "a parked message is replayed as the operator's channel, not as its sender",
        "services/operations/parked.py",
        "    identity = user[len(topology.namespace) + 1 :]\n",
        '    identity = f"channel.{settings.channel}"\n',
        "tests/integration/test_command_line.py::test_a_replayed_model_step_report_reaches_the_ledger_as_the_model_steps_own",
    ),
    (
        "rollback publishes",
        "services/approval_ledger/store_sql.py",
        "        await self.db.rollback()\n        await self.db.close()",
        "        await self.db.commit()\n        await self.db.close()",
        "tests/integration/test_publisher.py::test_the_publisher_sends_nothing_that_was_not_committed",
    ),
    (
        "log lines about a handled message do not name it (no context set at the consumer boundary)",
        "shared/consuming.py",
        "        logs.concerning(message)\n",
        "",
        "tests/integration/test_structured_logs.py",
    ),
    (
        "the publishers have no disruption budget (a drain may evict both)",
        "deploy/k8s/publisher.yaml",
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\n",
        "apiVersion: v1\nkind: ConfigMap\ndata: {}\n",
        "tests/unit/test_kubernetes_manifests.py",
    ),
    # Operations: what an operator sees must be what happened.
    (
        "ledger counts never moved after commit",
        "services/approval_ledger/handlers.py",
        "                except Duplicate:\n                    return\n            committed()\n",
        "                except Duplicate:\n                    return\n",
        "tests/integration/test_operations.py::test_prometheus_sees_an_approval_a_denial_and_a_dead_letter",
    ),
    (
        "a dead-letter alert blind to a counter born at its first count",
        "deploy/prometheus/alerts.yml",
        "          or sum by (type, reason) (signoff_dead_letters_total unless signoff_dead_letters_total offset 10m) > 0\n",
        "",
        "tests/unit/test_alert_rules_and_dashboard.py::test_promtool_fires_each_alert_from_synthetic_series",
    ),
    (
        "/readyz ready whatever the broker connection",
        "shared/runtime.py",
        "        return self.bus.connected",
        "        return True",
        "tests/integration/test_operations.py::test_readyz_turns_unready_when_the_broker_connection_is_lost_and_ready_after",
    ),
    (
        "no pending series once nothing waits (the gauge never falls to 0)",
        "services/approval_ledger/backlog.py",
        "        APPROVALS_PENDING.labels(tool).set(0)\n",
        "        pass\n",
        "tests/integration/test_operations.py::test_prometheus_sees_an_approval_a_denial_and_a_dead_letter",
    ),
    (
        "signoff status exits 0 whatever it found",
        "services/operations/status.py",
        "    return 1 if status.needs_a_person(topology) else 0",
        "    return 0",
        "tests/integration/test_status.py",
    ),
    (
        "a tool name the model made up becomes a label",
        "shared/observability.py",
        '    return name if name in _known_tools else "unknown"',
        '    return name or "unknown"',
        "tests/unit/test_metrics_endpoint.py::test_labels_from_input_stay_bounded",
    ),
    # Secrets never leave the executor, the card never misleads, hooks get events only.
    (
        "hooks get commands too ('*' matches tool.execute and step.requested)",
        "services/publisher/hooks.py",
        "        return event_type in EVENT_TYPES and any(",
        "        return any(",
        "tests/integration/test_secrets.py::test_a_canary_secret_reaches_the_target_and_nothing_else_through_approval_failure_retry_and_dead_letters[sqlite] "
        "tests/unit/test_hooks.py::test_every_event_pattern_matches_events_only_and_never_a_command_the_publisher_relays",
    ),
    (
        "the executor reports a failing target's answer unredacted",
        "services/tool_executor/tools.py",
        "        redact_text(result.error, secrets)[:ERROR_CHARS] if result.error is not None else None,",
        "        result.error[:ERROR_CHARS] if result.error is not None else None,",
        "tests/integration/test_secrets.py::test_a_canary_secret_reaches_the_target_and_nothing_else_through_approval_failure_retry_and_dead_letters[sqlite]",
    ),
    (
        "dead letters keep the raw body",
        "shared/consuming.py",
        "            redact_message_body(raw.body),",
        "            raw.body,",
        "tests/integration/test_secrets.py::test_a_canary_secret_reaches_the_target_and_nothing_else_through_approval_failure_retry_and_dead_letters[sqlite]",
    ),
    (
        "the transcript keeps the call's secret arguments",
        "services/approval_ledger/records.py",
        "            call_id=c.id, provider_call_id=c.provider_call_id, name=c.tool, arguments=shown_arguments(catalogue, c)",
        "            call_id=c.id, provider_call_id=c.provider_call_id, name=c.tool, arguments=c.arguments",
        "tests/integration/test_secrets.py::test_a_canary_secret_reaches_the_target_and_nothing_else_through_approval_failure_retry_and_dead_letters[sqlite]",
    ),
    (
        "the card's target fills ${env:…} from the ledger's environment",
        "shared/catalogue.py",
        '    request = http_request(implementation, shown_arguments, env=lambda name: shown.get(name, f"${{env:{name}}}"))',
        '    request = http_request(implementation, shown_arguments, env=lambda name: shown.get(name, os.environ.get(name, "")))',
        "tests/unit/test_catalogue.py::test_an_http_target_names_an_executor_only_variable_as_written_never_the_ledgers_value "
        "tests/unit/test_catalogue.py::test_a_credential_from_the_environment_never_appears_in_an_http_target",
    ),
    (
        "tool schemas open by default: an extra argument rides along unseen",
        "shared/catalogue.py",
        '            node["additionalProperties"] = False',
        "            pass",
        "tests/unit/test_catalogue.py::test_a_schema_is_closed_by_default_and_an_extra_argument_is_unexpected_at_any_depth "
        "tests/integration/test_secrets.py::test_an_argument_the_model_added_beyond_the_schema_is_refused_before_anyone_is_asked[sqlite]",
    ),
    (
        "redaction guesses from substrings of field names",
        "shared/redaction.py",
        '    return words[-1] in _CREDENTIAL_WORDS or "".join(words) in _CREDENTIAL_NAMES',
        '    return any(w in name.lower() for w in ("pass", "token", "secret", "key", "auth", "cookie", "credential"))',
        "tests/unit/test_redaction.py",
    ),
    (
        "declared secrets (format: password, writeOnly, x-signoff-secret) ignored",
        "shared/redaction.py",
        "    return isinstance(schema, dict) and (",
        "    return False and (",
        "tests/integration/test_secrets.py::test_a_canary_secret_reaches_the_target_and_nothing_else_through_approval_failure_retry_and_dead_letters[sqlite] "
        "tests/unit/test_redaction.py",
    ),
    (
        "schema-validation errors echo the value",
        "shared/catalogue.py",
        "                errors.append(f\"{where or '(arguments)'}: {_rule_broken(error)}\")",
        "                errors.append(f\"{where or '(arguments)'}: {error.message}\")",
        "tests/unit/test_catalogue.py::test_an_argument_error_never_repeats_the_value_it_refuses",
    ),
    (
        "an unset ${env:X} becomes an empty string",
        "shared/catalogue.py",
        "        if name not in environ:\n            raise MissingSecret(name)",
        '        if name not in environ:\n            return ""',
        "tests/unit/test_catalogue.py::test_a_secret_reference_is_replaced_by_the_environments_value_and_an_unset_one_is_an_error",
    ),
    (
        "a short hook secret is accepted",
        "services/publisher/hooks.py",
        "        if len(secret.encode()) < MIN_SECRET_BYTES:",
        "        if False:",
        "tests/unit/test_hooks.py::test_a_hook_secret_that_is_unset_or_shorter_than_32_bytes_stops_the_publisher_naming_the_hook",
    ),
    (
        "service logs unredacted",
        "shared/logs.py",
        "    return redact_text(text)",
        "    return text",
        # The canary run alone no longer sees it: httpx's request lines, the leak it once
        # caught, are kept to warnings (shared/logs.py), so the log formatter is the second
        # guard and its own tests are what catch its removal.
        "tests/unit/test_logs.py::test_a_password_in_a_url_is_masked_in_the_message_and_the_traceback "
        "tests/unit/test_redaction.py::test_log_lines_and_their_tracebacks_hide_remembered_secrets_and_credential_shapes "
        "tests/integration/test_secrets.py::test_a_canary_secret_reaches_the_target_and_nothing_else_through_approval_failure_retry_and_dead_letters[sqlite]",
    ),
    (
        "audit: verify does not check an entry against its hash",
        "shared/audit.py",
        '        if entry_hash(entry, entry["prev_hash"]) != entry["hash"]:\n            problems.append(',
        "        if False:\n            problems.append(",
        "tests/integration/test_audit_log.py::test_audit_verify_passes_on_a_real_run_and_names_the_entry_the_owner_changed "
        "tests/unit/test_audit_chain.py::test_a_changed_entry_is_named_even_when_later_ones_are_intact",
    ),
    (
        "audit: an entry not chained to its session's entry before it",
        "shared/audit.py",
        '        "prev_hash": None if head is None else head[1],',
        '        "prev_hash": None,',
        "tests/integration/test_audit_log.py::test_audit_verify_passes_on_a_real_run_and_names_the_entry_the_owner_changed[sqlite] "
        "tests/unit/test_audit_chain.py::test_each_entry_names_the_hash_of_its_sessions_entry_before_it_and_each_link_the_link_before",
    ),
    (
        "audit tables left to the ledger's role, which may then UPDATE and DELETE them",
        "shared/ledger/roles.py",
        "    done.append(await _seal_audit_tables(settings, schema, roles))\n",
        "",
        "tests/integration/test_audit_log.py::test_on_postgresql_no_service_role_may_update_or_delete_the_audit_log",
    ),
    (
        "audit: the global chain links up to the newest transaction, not below the oldest running one",
        "shared/ledger/audit_chain.py",
        "pg_snapshot_xmin(pg_current_snapshot())",
        "pg_snapshot_xmax(pg_current_snapshot())",
        "tests/integration/test_audit_log.py::test_entries_of_a_transaction_held_open_while_later_ones_are_linked_join_the_global_chain_after_it",
    ),
    (
        "audit entries committed apart from their transition (before it)",
        "services/approval_ledger/store_postgres.py",
        "    async def _apply(self, writes: Writes, notify: bool) -> None:\n",
        "    async def _apply(self, writes: Writes, notify: bool) -> None:\n        if writes.audit:\n"
        "            async with self._engine.begin() as side:\n"
        '                await side.execute(TABLES["audit_log"].insert(), writes.audit)\n            writes.audit = []\n',
        "tests/crash/test_audit_log_crash.py",
    ),
    (
        "the ledger's role owns the schema, so it may drop the audit log",
        "shared/ledger/roles.py",
        "            if owner == ledger:  # made by an earlier setup\n"
        "                await conn.execute(text(f'ALTER SCHEMA \"{schema}\" OWNER TO CURRENT_USER'))",
        "            if schema != 'public':\n"
        '                await conn.execute(text(f\'ALTER SCHEMA "{schema}" OWNER TO "{ledger}"\'))',
        "tests/integration/test_audit_log.py::test_on_postgresql_no_service_role_may_update_or_delete_the_audit_log",
    ),
    (
        "a failed group's messages all fail with it instead of each being applied alone",
        "services/approval_ledger/group_commit.py",
        "            for waiting in group:\n                await self._apply_alone(waiting)",
        "            for waiting in group:\n                waiting.done.set_exception(error)",
        "tests/integration/test_group_commit.py::test_a_message_that_fails_in_a_group_fails_alone_and_the_others_commit",
    ),
    (
        "a group applies one session's messages out of delivery order",
        "services/approval_ledger/group_commit.py",
        "        ordered = sorted(group, key=lambda w: w.message.session_id)",
        "        ordered = list(reversed(group))",
        "tests/integration/test_group_commit.py::"
        "test_waiting_messages_commit_in_one_transaction_each_with_its_inbox_row_and_in_session_order",
    ),
    (
        "on classic queues a message that keeps failing is never parked (its failures not counted)",
        "shared/consuming.py",
        "                self._failures[message.message_id] = delivered_before + 1",
        "                pass",
        "tests/integration/test_queue_types.py::"
        "test_on_classic_queues_a_message_that_fails_on_every_delivery_is_parked_at_the_delivery_limit",
    ),
    (
        "a duplicate turn in a group commit leaves the session it would open behind",
        "services/approval_ledger/store_postgres.py",
        '        " WHERE EXISTS (SELECT FROM inbox) ON CONFLICT (id) DO NOTHING RETURNING *),"',
        '        " ON CONFLICT (id) DO NOTHING RETURNING *),"',
        "tests/integration/test_group_commit.py::"
        "test_a_duplicate_in_a_group_leaves_nothing_behind_not_even_the_session_its_turn_would_open",
    ),
    (
        "redaction's fast path skips a credential shape (a JWT alone in a line is logged)",
        "shared/redaction.py",
        'xox[abposr]-|A(?:KIA|SIA|IDA|ROA)|eyJ"',
        'xox[abposr]-|A(?:KIA|SIA|IDA|ROA)"',
        "tests/unit/test_redaction.py::test_a_text_without_a_credential_shapes_clue_holds_no_credential_shape "
        "tests/unit/test_redaction.py::test_each_credential_shape_alone_in_an_ordinary_line_is_hidden",
    ),
    (
        "executor's refusal commits the claim it took with the record (PostgreSQL), blocking the approved run",
        "services/tool_executor/claims.py",
        "            raise _Refused(refusal)\n",
        '            return ClaimOutcome("refused", refusal=refusal)\n',
        "tests/integration/test_trust.py::test_a_sealed_command_for_a_call_not_yet_approved_runs_nothing_and_leaves_no_claim_to_block_the_approved_run[postgres]",
    ),
    (
        "a turn calls the provider forever: no bound on its model steps",
        "services/approval_ledger/handlers.py",
        "        if reached is not None:\n            for entry in resumed.entries:",
        "        if False:\n            for entry in resumed.entries:",
        "tests/integration/test_turn_bounds.py",
    ),
    (
        "on SQLite a second publisher relays beside the first",
        "services/publisher/main.py",
        "    relay_lock = None if publishers_take_turns(settings) else only_relay(settings)",
        "    relay_lock = None",
        "tests/integration/test_publisher.py::test_on_sqlite_a_second_publisher_refuses_to_start_naming_the_one_that_relays",
    ),
    (
        "the demo's scripted model says 'Done' after a person denied the call",
        "services/model_step/scripted.py",
        "        text = reply.said_after(transcript)",
        "        text = reply.text",
        "tests/unit/test_scripted_provider.py",
    ),
    (
        "the ledger logs nothing per transition at INFO",
        "services/approval_ledger/handlers.py",
        "        # One line per transition at INFO, once it is durable (a refusal logs its own).\n        when_committed(",
        "        (lambda _: None)(",
        "tests/integration/test_structured_logs.py::"
        "test_following_one_session_by_its_id_at_info_shows_each_ledger_transition_and_each_model_step",
    ),
    (
        "the card shows outside text raw (what a person sees made the identity)",
        "shared/on_screen.py",
        '    """What is shown of the text, and how many of its characters are not."""\n',
        '    """What is shown of the text, and how many of its characters are not."""\n    return text, 0\n',
        "tests/unit/test_on_screen.py tests/integration/test_card_on_screen.py",
    ),
    (
        "a provider's error cut before its key is hidden (a key across the cut leaks its first characters)",
        "services/model_step/transport.py",
        "    return _redact(said[:BODY_CHARS], secrets)[:DETAIL_CHARS]\n",
        "    return said[:DETAIL_CHARS].replace(secrets[0], '***') if secrets and secrets[0] else said[:DETAIL_CHARS]\n",
        "tests/integration/test_provider_keys.py::test_a_provider_error_quoting_the_key_across_the_cut_shows_no_piece_of_it_anywhere",
    ),
    (
        "the model-step never tells the redactor its provider keys",
        "services/model_step/transport.py",
        "            remember(api_key.get_secret_value())\n",
        "            pass\n",
        "tests/integration/test_provider_keys.py::test_the_model_step_knows_its_provider_keys_from_start_up_and_its_log_lines_hide_them",
    ),
    (
        "a channel reads every queue and exchange of the namespace again (it may take a person's approval)",
        "shared/topology.py",
        'any_of(rf"{ns}\\.channels", private), any_of(rf"{ns}\\.events", private))',
        'any_of(rf"{ns}\\.channels", private), any_of(rf"{ns}\\..+", private))',
        "tests/integration/test_broker_permissions.py::test_no_agent_side_identity_nor_a_channel_may_bind_to_the_commands_or_read_another_services_queue[sqlite]",
    ),
    (
        "a service reads the exchange its queue is bound to again (it may bind to the commands)",
        "shared/topology.py",
        "        return Permissions(any_of(), any_of(*writes), any_of(queues))",
        '        return Permissions(any_of(), any_of(*writes), any_of(queues, rf"{ns}\\.commands"))',
        "tests/integration/test_broker_permissions.py::test_no_agent_side_identity_nor_a_channel_may_bind_to_the_commands_or_read_another_services_queue[sqlite]",
    ),
    (
        "the ledger acts on a parked copy nothing proves",
        "services/approval_ledger/handlers.py",
        "    if ledger.check_senders and proven_sender(parked, ledger.topology) is None:",
        "    if False:",
        "tests/integration/test_dead_letter_path.py::test_forged_parked_copies_fail_no_other_sessions_call_nor_end_its_turn_and_the_real_runs_complete_once[sqlite]",
    ),
    (
        "a replay sends a dead letter as the identity its type names",
        "services/operations/parked.py",
        "    user = proven_sender(parked, topology)\n",
        '    user = topology.identity(f"channel.{settings.channel}" if sender == "channel" else sender)\n',
        "tests/integration/test_dead_letter_path.py::test_a_replay_refuses_a_forged_dead_letter_and_sends_nothing[sqlite]",
    ),
    (
        "a consumer parks a message without naming who sent it",
        "shared/consuming.py",
        '                SENDER_HEADER: raw.user_id or "",\n',
        "",
        "tests/integration/test_command_line.py::test_an_operator_replays_a_parked_response_after_the_fault_is_lifted_and_it_is_applied_once[sqlite]",
    ),
    (
        "a message RabbitMQ parked itself is not believed (a session waiting on it stays stuck)",
        "shared/dead_letters.py",
        "    if parked.death_queue == topology.inbound_queue(kind).name and topology.may_send(kind, parked.parked_by):",
        "    if False:",
        "tests/integration/test_dead_letter_path.py::test_a_message_rabbitmq_parked_itself_fails_the_turn_that_waited_on_it_and_replays_as_its_own_sender[sqlite]",
    ),
    (
        "a channel starts a turn as anyone (started_by not judged against the sending channel)",
        "services/approval_ledger/handlers.py",
        '        principal, doing = message.started_by, "start a turn"',
        '        principal, doing = None, "start a turn"',
        "tests/integration/test_channels.py::test_a_channel_for_alice_cannot_start_a_turn_as_carol_and_alice_starts_hers[sqlite]",
    ),
    (
        "a channel cancels in anyone's name (cancelled_by not judged against the sending channel)",
        "services/approval_ledger/handlers.py",
        '        principal, doing = message.cancelled_by, "cancel a turn"',
        '        principal, doing = None, "cancel a turn"',
        "tests/integration/test_channels.py::"
        "test_a_channel_for_alice_cannot_cancel_bobs_session_as_bob_nor_as_alice_and_the_rightful_cancel[sqlite]",
    ),
    (
        "anyone may cancel anyone's turn (no starter, approver or operator needed)",
        "services/approval_ledger/domain.py",
        "    if canceller in starters or canceller in operators:\n        return None",
        "    if True:\n        return None",
        "tests/unit/test_ledger_rules.py::test_an_approver_of_a_pending_request_may_cancel_and_anyone_else_may_not "
        "tests/integration/test_channels.py::"
        "test_a_channel_for_alice_cannot_cancel_bobs_session_as_bob_nor_as_alice_and_the_rightful_cancel[sqlite]",
    ),
    (
        "a response signed by one channel counts from another channel's broker user",
        "services/approval_ledger/domain.py",
        "    if key_id is not None and key_id == channel_name:",
        "    if True:",
        "tests/unit/test_ledger_rules.py::test_a_response_counts_only_from_the_channel_whose_key_signed_it "
        "tests/integration/test_channels.py::"
        "test_a_response_signed_with_one_channels_key_is_refused_from_another_channels_broker_user[sqlite]",
    ),
    (
        "a turn naming no starter inherits the session's (its channel's person may approve a separated call)",
        "services/approval_ledger/domain.py",
        "    if turn_started_by is None:\n        return frozenset()",
        "    if False:\n        return frozenset()",
        "tests/unit/test_ledger_rules.py::"
        "test_a_turn_that_names_no_starter_leaves_its_calls_starter_unknown_even_in_a_session_someone_started",
    ),
    (
        "the CLI sends --as anyone (no check before sending)",
        "services/operations/console.py",
        "    if not speaks_for(channel, principal):  # the ledger's own rule",
        "    if False:",
        "tests/integration/test_channels.py::"
        "test_the_cli_refuses_to_approve_as_someone_its_channel_is_not_registered_for_before_sending",
    ),
    (
        "setup keeps a CLI that may assert anyone",
        "shared/keyring.py",
        '    kept = [p for p in registered or [] if p != "*"]',
        "    kept = list(registered or [])",
        "tests/unit/test_cli_channel.py::test_a_cli_that_could_assert_anyone_no_longer_can_after_setup",
    ),
    (
        "setup registers the CLI for the listed people only, forgetting those registered before",
        "shared/keyring.py",
        "    return list(dict.fromkeys([*kept, runner, *listed]))",
        "    return list(dict.fromkeys([runner, *listed]))",
        "tests/integration/test_channels.py::"
        "test_signoff_setup_registers_the_cli_for_the_os_user_and_the_listed_people_and_keeps_them_when_run_again",
    ),
    (
        "a Redis seen mark skips a command (the old seen-skip restored)",
        "shared/consuming.py",
        "        logs.concerning(message)\n        counted = ",
        "        logs.concerning(message)\n"
        "        from redis.asyncio import Redis\n"
        "        async with Redis.from_url(__import__('os').environ.get('SIGNOFF_REDIS_URL', 'redis://localhost:6379/0')) as r:\n"
        "            if await r.exists(f'{self.topology.namespace}:seen:{self.consumer}:{message.message_id}'):\n"
        "                await raw.ack()\n"
        "                return 'duplicate'\n"
        "        counted = ",
        "tests/integration/test_redis_lies.py::test_a_redis_writer_marking_the_approved_call_and_the_next_step_as_seen_drops_neither[sqlite]",
    ),
    (
        "signoff up as root does not drop privileges (every service root, one keys folder)",
        "services/operations/supervisor.py",
        "        self.isolated = (os.geteuid() == 0 and not settings.single_user) if isolated is None else isolated",
        "        self.isolated = False",
        "tests/integration/test_service_users.py::test_signoff_up_as_root_runs_each_service_as_its_own_user_holding_only_its_own_keys_and_secrets",
    ),
    (
        "signoff up as root gives every service the whole environment",
        "services/operations/service_users.py",
        '    env = {k: v for k, v in environ.items() if k in PLAIN_ENVIRONMENT or k.startswith("LC_")}',
        "    env = dict(environ)",
        "tests/integration/test_service_users.py::test_signoff_up_as_root_runs_each_service_as_its_own_user_holding_only_its_own_keys_and_secrets",
    ),
    (
        "compose: the model-step mounts the folder of every key",
        "docker-compose.yml",
        "    volumes: [keys-model-step:/keys:ro]",
        "    volumes: [signoff-keys:/keys:ro]",
        "tests/unit/test_compose_isolation.py",
    ),
    # Python tools run in a process of their own, holding only their declared variables.
    (
        "python tools run inside the executor again, with its environment, keys and broker identity",
        "services/tool_executor/tools.py",
        "        result = await _run_python(implementation, spec, arguments, context, launcher)\n",
        "        from .tool_process import _load, as_json\n"
        "        value = _load(implementation.function)(arguments, context)\n"
        '        result = ToolResult("output", as_json(await value if hasattr(value, "__await__") else value))\n',
        "tests/integration/test_tool_isolation.py",
    ),
    (
        "a python tool's process inherits the executor's whole environment",
        "services/tool_executor/tools.py",
        "        env={**_basic_environment(folder), **handed},\n        pass_fds=descriptors,\n",
        "        env={**os.environ, **_basic_environment(folder), **handed},\n        pass_fds=descriptors,\n",
        "tests/integration/test_tool_isolation.py::"
        "test_a_hostile_python_tool_reaches_none_of_the_executors_secrets_nor_another_tools_and_keeps_its_own[sqlite] "
        "tests/unit/test_python_tools.py",
    ),
    (
        "a root executor's python tools run as root",
        "services/tool_executor/tools.py",
        "        run_as = await tools_user()\n",
        "        run_as = None\n",
        "tests/integration/test_tool_isolation.py::"
        "test_a_hostile_python_tool_reaches_none_of_the_executors_secrets_nor_another_tools_and_keeps_its_own[sqlite] "
        "tests/unit/test_python_tools.py",
    ),
    # The ledger believes its rows, not the messenger.
    (
        "the ledger takes a tool's result from the report, not from the executor's finished claim",
        "services/approval_ledger/handlers.py",
        "    refused = domain.judge_claim(claim, sealed=sealed)\n",
        '    refused = None\n    claim = domain.ClaimOnRecord("finished", report.outcome, '
        '{"output": report.output, "error": report.error})\n',
        "tests/integration/test_ledger_trusts_its_rows.py::test_a_forged_tool_result_for_an_approved_call_not_yet_run_closes_nothing_and_the_real_run_closes_it_once",
    ),
    (
        "the ledger believes a finished claim whatever authorization it was taken under",
        "services/approval_ledger/handlers.py",
        "    sealed = claim is not None and ledger.authority.sealed_claim(",
        "    sealed = claim is not None or ledger.authority.sealed_claim(",
        "tests/integration/test_ledger_trusts_its_rows.py::test_a_finished_claim_written_straight_into_the_database_without_the_ledgers_authorization_is_not_believed",
    ),
    (
        "the ledger seals the call's row as it stands, without recomputing the digest the person approved",
        "services/approval_ledger/handlers.py",
        "        altered = _judge_arguments_on_record(ledger, request, step, response)",
        "        altered = None",
        "tests/integration/test_ledger_trusts_its_rows.py::test_arguments_swapped_in_the_database_before_the_approval_never_run_and_the_call_closes_as_altered",
    ),
    (
        "the executor skips the request's seal",
        "services/tool_executor/claims.py",
        "    if not request_seal_names(",
        "    if False and not request_seal_names(",
        "tests/unit/test_claim_decisions.py::test_without_a_matching_call_approval_and_request_seal_on_record_nothing_runs",
    ),
    (
        "the executor checks the call's tool but not its arguments on record",
        "services/tool_executor/claims.py",
        "    if call.tool != tool or arguments_fingerprint(call.arguments) != fingerprint:",
        "    if call.tool != tool:",
        "tests/integration/test_ledger_trusts_its_rows.py::test_arguments_swapped_in_the_database_after_the_decision_are_refused_by_the_executor_and_never_run",
    ),
    (
        "services outlive a SIGKILLed supervisor (no parent-death signal, own users)",
        "services/operations/service_users.py",
        "            preexec_fn=dying_with_this_process(),",
        "            preexec_fn=None,",
        "tests/integration/test_supervisor.py::test_a_supervisor_killed_with_sigkill_leaves_no_service_running[own-users]",
    ),
    (
        "services outlive a SIGKILLed supervisor (no parent-death signal, single user)",
        "services/operations/supervisor.py",
        "new_session=True, die_with_parent=True)",
        "new_session=True, die_with_parent=False)",
        "tests/integration/test_supervisor.py::test_a_supervisor_killed_with_sigkill_leaves_no_service_running[single-user]",
    ),
    (
        "cancelling a session that does not exist says there is no open turn",
        "services/approval_ledger/domain.py",
        "    if not session_exists:\n        return NO_SUCH_SESSION",
        "    if False:\n        return NO_SUCH_SESSION",
        "tests/unit/test_ledger_rules.py",
    ),
    (
        "setup's error echoes the administrator's URL with its password",
        "shared/provisioning.py",
        "cannot use {service} at {without_password(url)} (",
        "cannot use {service} at {url} (",
        "tests/integration/test_command_line.py::"
        "test_setup_that_cannot_reach_the_management_api_names_it_without_the_administrators_password",
    ),
    (
        "signoff status judges the management API's sampled queue figures, seconds old",
        "services/operations/status.py",
        "    url, user = settings.amqp_login(OPERATOR)\n",
        "    async with management_api(settings) as api:\n"
        "        answer = await api.get(f'/queues/{vhost_in_path(settings)}')\n"
        "    found = {q['name']: q for q in answer.json()}\n"
        "    return [QueueState(n, int(found.get(n, {}).get('messages_ready') or 0), None,\n"
        "                       int(found.get(n, {}).get('consumers') or 0)) for n in topology.all_queue_names()]\n"
        "    url, user = settings.amqp_login(OPERATOR)\n",
        "tests/integration/test_status.py::"
        "test_status_is_exact_the_moment_services_are_ready_a_message_is_parked_and_it_is_dropped",
    ),
    (
        "a failed signoff setup leaves behind the broker and Redis users it made",
        "services/operations/deployment.py",
        "        undone = asyncio.run(provisioning.undo(settings, made))",
        "        undone: list[str] = []",
        "tests/integration/test_setup_failures.py::"
        "test_setup_that_fails_after_making_users_removes_those_it_made_and_keeps_those_that_were_there "
        "tests/integration/test_setup_failures.py::"
        "test_setup_with_rabbitmq_down_or_refusing_names_it_and_leaves_no_users_behind",
    ),
    (
        "a failed signoff setup also removes the broker users that were there before it",
        "shared/provisioning.py",
        "            if not existed:\n                made.broker_users.append(user)",
        "            if True:\n                made.broker_users.append(user)",
        "tests/integration/test_setup_failures.py::"
        "test_setup_that_fails_after_making_users_removes_those_it_made_and_keeps_those_that_were_there",
    ),
    (
        "signoff setup shows PostgreSQL's refusal as a raw traceback",
        "shared/provisioning.py",
        '    except Exception as error:\n        advice = _advice("PostgreSQL"',
        '    except ImportError as error:\n        advice = _advice("PostgreSQL"',
        "tests/integration/test_setup_failures.py::"
        "test_setup_that_fails_after_making_users_removes_those_it_made_and_keeps_those_that_were_there",
    ),
    (
        "signoff up does not wait for a management API that answers late (setup fails at once)",
        "services/operations/supervisor.py",
        "            wait_for_management_api(self.settings, lambda line: print(line, file=sys.stderr, flush=True))",
        "            pass",
        "tests/integration/test_up_waits_for_management.py::"
        "test_signoff_up_waits_for_a_management_api_that_answers_late_and_then_runs_the_services",
    ),
    (
        "signoff up whose setup fails ends in a traceback (CalledProcessError)",
        "services/operations/supervisor.py",
        '            if subprocess.run([sys.executable, "-m", "services.operations.cli", step]).returncode != 0:',
        '            if subprocess.run([sys.executable, "-m", "services.operations.cli", step], check=True).returncode != 0:',
        "tests/integration/test_up_waits_for_management.py::"
        "test_signoff_up_whose_setup_fails_says_so_without_a_traceback",
    ),
    (
        "a dead-letter action acknowledged before it is recorded",
        "services/operations/parked.py",
        "            if recorded is None:\n"
        "                await dead_letter_actions.record_action(console.ledger, parked, action, operator, reason)\n"
        '            await faults.reached("console.after_record", action)\n'
        "            if identity is not None:\n"
        "                await _send_back(settings, stack, senders, identity, raw, parked, operator)\n"
        "            await raw.ack()\n",
        "            await raw.ack()\n"
        "            if recorded is None:\n"
        "                await dead_letter_actions.record_action(console.ledger, parked, action, operator, reason)\n"
        '            await faults.reached("console.after_record", action)\n'
        "            if identity is not None:\n"
        "                await _send_back(settings, stack, senders, identity, raw, parked, operator)\n",
        "tests/crash/test_dead_letter_actions_crash.py::"
        "test_a_drop_killed_after_its_record_leaves_the_message_parked_and_a_rerun_drops_it_recorded_once[sqlite] "
        "tests/crash/test_dead_letter_actions_crash.py::"
        "test_a_replay_killed_after_its_record_sends_nothing_and_a_rerun_replays_it_once[postgres]",
    ),
    (
        "a rerun of a killed dead-letter action records it again",
        "services/operations/parked.py",
        "            recorded = await dead_letter_actions.action_on_record(console.ledger, parked, action)\n",
        "            recorded = None\n",
        "tests/crash/test_dead_letter_actions_crash.py::"
        "test_a_drop_killed_after_its_record_leaves_the_message_parked_and_a_rerun_drops_it_recorded_once[postgres]",
    ),
    (
        "a failed turn's reason is not kept on its row (only the event says why)",
        "services/approval_ledger/records.py",
        "            reason_code=ended.reason_code,\n            reason_text=ended.reason_text,\n",
        "",
        "tests/integration/test_turn_outcomes_and_escalations.py::"
        "test_a_turn_the_provider_failed_says_its_code_and_the_providers_words_in_session_show_and_audit_show[sqlite]",
    ),
    (
        "an escalation is neither kept with its addressees nor counted",
        "services/approval_ledger/records.py",
        "escalated_at=store.now, escalated_to=escalated_to)\n    when_committed(ESCALATIONS.labels(tool_label(request.tool)).inc)\n",
        "escalated_at=store.now)\n",
        "tests/integration/test_turn_outcomes_and_escalations.py::"
        "test_an_escalated_request_says_when_and_to_whom_in_pending_and_session_show_and_is_counted_once[postgres]",
    ),
    # Python tools never run as the executor's user (the tool launcher).
    (
        "the tool launcher serves any peer (its SO_PEERCRED check removed)",
        "services/operations/tool_launcher.py",
        "            if connection.uid != self.client_uid:\n",
        "            if False:\n",
        "tests/unit/test_tool_launcher.py::test_a_peer_with_another_uid_is_refused_and_nothing_runs",
    ),
    (
        "signoff up as root does not give the executor the tool launcher",
        "services/operations/supervisor.py",
        "            self._give_the_executor_a_tool_launcher()\n",
        "",
        "tests/integration/test_tool_isolation.py::"
        "test_under_signoff_up_as_root_a_hostile_python_tool_runs_as_signoff_tools_and_reads_none_of_the_executors_keys",
    ),
    (
        "the tool launcher starts its fork server, and so every tool, as itself, root (no switch of user)",
        "services/operations/tool_launcher.py",
        "                user=uid,\n                group=gid,\n                extra_groups=[],\n                umask=0o077,\n"
        "                start_new_session=True,\n",
        "                umask=0o077,\n                start_new_session=True,\n",
        "tests/unit/test_tool_launcher.py::test_a_peer_with_the_executors_uid_gets_its_tool_run_as_signoff_tools",
    ),
    (
        "the tool launcher takes any variable for the tool's process (LD_PRELOAD, SIGNOFF_*)",
        "shared/tool_launch.py",
        "        unknown = sorted(set(environment) - set(PASSED_ENVIRONMENT))\n",
        "        unknown: list[str] = []\n",
        "tests/unit/test_tool_launcher.py::test_a_malformed_request_is_refused_with_a_reason_and_nothing_runs",
    ),
    (
        "the tool launcher leaves the tool running when the executor lets go (a timeout)",
        "services/operations/tool_launcher.py",
        "        self.selector.unregister(connection.socket)\n        self._kill(connection)\n",
        "        self.selector.unregister(connection.socket)\n",
        "tests/unit/test_tool_launcher.py::test_when_the_executor_lets_go_the_tools_whole_process_group_is_killed "
        "tests/unit/test_tool_launcher.py::test_through_the_launcher_a_timeout_kills_the_tool_and_what_it_started",
    ),
    (
        "an unreachable tool launcher lets the executor run the tool itself, as its own user",
        "services/tool_executor/tools.py",
        "            process = await (_start_here(folder) if launcher is None else _launch(launcher))\n",
        "            process = await (_start_here(context.data_dir) if launcher is None or not launcher.exists()\n"
        "                             else _launch(launcher))\n",
        "tests/unit/test_tool_launcher.py::"
        "test_a_configured_launcher_that_cannot_be_reached_is_an_error_and_the_tool_never_runs_here",
    ),
    # The HTTP gateway (services/gateway): whom it speaks for and what it shows.
    (
        "gateway: the responder taken from the request instead of the login",
        "services/gateway/callers.py",
        "    return Caller(login, user)\n",
        '    return Caller(login, User(request.headers.get("x-signoff-as", user.name), user.password_hash, user.groups))\n',
        "tests/integration/test_gateway.py::test_the_decision_names_who_logged_in_whatever_the_request_says",
    ),
    (
        "gateway: no CSRF check",
        "services/gateway/callers.py",
        "    if not gateway.sessions.csrf_ok(who.login, request.headers.get(CSRF_HEADER)):",
        "    if False:",
        "tests/integration/test_gateway.py::test_without_the_csrf_token_from_another_origin_or_with_an_ended_session_nothing_changes",
    ),
    (
        "gateway: every request shown to everyone",
        "services/gateway/reads.py",
        '        """Operators see every request; others those they may approve and those of sessions they started."""\n',
        '        """Operators see every request; others those they may approve and those of sessions they started."""\n        return True\n',
        "tests/integration/test_gateway.py::test_a_person_sees_the_requests_they_may_approve_and_the_sessions_they_started_and_operators_all",
    ),
    (
        "gateway: its channel registered for anyone",
        "services/gateway/users.py",
        "{CHANNEL: sorted(Users.load(users_path).users)}",
        '{CHANNEL: ["*"]}',
        "tests/integration/test_gateway.py::test_the_gateway_key_speaks_only_for_the_gateways_users",
    ),
    (
        "gateway: a fresh response id per call (the Idempotency-Key sends again)",
        "services/gateway/decisions.py",
        "    message_id, response_id = response_ids(who.user.name, idempotency_key, asked(request_id, body))\n",
        '    message_id, response_id = mint("msg"), mint("rsp")\n',
        "tests/integration/test_gateway.py::test_the_same_idempotency_key_twice_and_two_keys_racing_make_one_decision_and_one_run",
    ),
    (
        "gateway: an Idempotency-Key's message ignores the body (a reuse gets the first verdict, or a 202 forever)",
        "services/gateway/decisions.py",
        "    message_id, response_id = response_ids(who.user.name, idempotency_key, asked(request_id, body))\n",
        '    message_id, response_id = response_ids(who.user.name, idempotency_key, "")\n',
        "tests/integration/test_gateway.py::test_an_idempotency_key_reused_with_another_body_or_on_another_request_is_refused_422_and_decides_nothing",
    ),
    (
        "ledger: anyone a channel vouches for may deny",
        "services/approval_ledger/domain.py",
        "    responder = response.responder\n    anonymous = response.response_token is not None\n",
        '    if response.decision != "approve":\n        return None\n'
        "    responder = response.responder\n    anonymous = response.response_token is not None\n",
        "tests/integration/test_gateway.py::test_a_person_who_may_not_approve_a_card_may_not_deny_it_and_a_hidden_card_answers_as_a_missing_one",
    ),
    (
        "gateway: a decision on a card the caller may not see reaches the ledger (403 here, 404 for a missing one)",
        "services/gateway/decisions.py",
        '    if found is None or not await gateway.ledger.may_see_request(who.user, found):\n        raise not_found("request")\n    # The response id',
        '    if found is None:\n        raise not_found("request")\n    # The response id',
        "tests/integration/test_gateway.py::test_a_person_who_may_not_approve_a_card_may_not_deny_it_and_a_hidden_card_answers_as_a_missing_one",
    ),
    # The horizon lives in one place, which the stream's reads (the tail's, a stream's
    # behind the tail, "now") all go through.
    (
        "gateway: the event stream serves rows of transactions still open below it (PostgreSQL)",
        "shared/ledger/event_stream.py",
        "    next_id, horizon = await raw.fetchrow(HORIZON_SQL)\n",
        "    next_id, horizon = 2**62, 2**62\n",
        "tests/integration/test_gateway.py::test_on_postgresql_an_event_committed_late_with_a_smaller_id_is_neither_skipped_nor_served_early "
        "tests/integration/test_gateway_stream_horizon.py::"
        "test_a_stream_resumed_while_writers_commit_out_of_id_order_misses_and_repeats_nothing[postgres]",
    ),
    (
        "gateway: the event stream waits for every role's open transaction, not only the outbox's writers",
        "shared/ledger/event_stream.py",
        "    \" AND has_table_privilege(a.usesysid, 'outbox', 'INSERT')\"\n",
        "",
        "tests/integration/test_gateway_stream_horizon.py::"
        "test_a_card_is_streamed_within_a_second_of_its_commit_while_another_role_holds_a_transaction_open[postgres-stranger] "
        "tests/integration/test_gateway_stream_horizon.py::"
        "test_a_card_is_streamed_within_a_second_of_its_commit_while_another_role_holds_a_transaction_open[postgres-model-step]",
    ),
    # The services' own Redis users, on a database index other than 0.
    (
        "the services' Redis users may not SELECT the configured database index",
        "shared/provisioning.py",
        '        f"+select|{settings.redis_database}",\n',
        "",
        "tests/integration/test_redis_database_index.py::"
        "test_on_a_non_zero_database_index_each_services_redis_user_works_there_and_may_select_no_other",
    ),
    (
        "a Redis that refuses the executor's user is taken for an outage (ready, leases off)",
        "shared/redis_access.py",
        "            if refused(error):\n                self.refusal(error)\n                return False\n",
        "",
        "tests/integration/test_redis_database_index.py::"
        "test_an_executor_whose_redis_user_is_refused_is_not_ready_and_says_why_and_one_whose_redis_is_away_is",
    ),
    (
        "the SDK's approval of a card does not name the card's digest",
        "signoff/client.py",
        "        args_digest = request.args_digest\n",
        "        pass\n",
        "tests/unit/test_sdk.py::test_an_approval_of_a_card_names_the_digest_of_that_card_and_an_explicit_digest_wins",
    ),
    (
        "the SDK retries starting a session (two turns for one call)",
        "signoff/client.py",
        '    return Call("POST", "/v1/sessions", json=body, headers=headers, changes=True, retry=key is not None)\n',
        '    return Call("POST", "/v1/sessions", json=body, headers=headers, changes=True, retry=True)\n',
        "tests/unit/test_sdk.py::test_starting_a_session_is_never_sent_twice",
    ),
    (
        "the SDK sends a retried decision with a new Idempotency-Key",
        "signoff/client.py",
        "                if not call.retry or attempt >= self.attempts:\n                    raise\n                time.sleep(backoff())",
        '                if not call.retry or attempt >= self.attempts:\n                    raise\n                call.headers["Idempotency-Key"] = new_key()\n                time.sleep(backoff())',
        "tests/unit/test_sdk.py::test_a_decision_whose_answer_was_lost_is_sent_again_with_the_same_idempotency_key",
    ),
    (
        "the SDK's async client sends a retried decision with a new Idempotency-Key",
        "signoff/client.py",
        "                if not call.retry or attempt >= self.attempts:\n                    raise\n                await asyncio.sleep(backoff())",
        '                if not call.retry or attempt >= self.attempts:\n                    raise\n                call.headers["Idempotency-Key"] = new_key()\n                await asyncio.sleep(backoff())',
        "tests/integration/test_sdk_examples.py::"
        "test_an_approval_whose_answer_was_lost_is_retried_with_its_key_and_decided_and_run_once[postgres]",
    ),
    (
        "the SDK puts any text into a path as an id",
        "signoff/client.py",
        "        if not ID.fullmatch(value):",
        "        if False:",
        "tests/unit/test_sdk.py::test_an_id_that_is_not_an_id_never_becomes_another_path",
    ),
    (
        "the example bot approves by rule an argument the card hides",
        "examples/approval_bot.py",
        "        if name in card.hidden or isinstance(value, bool)",
        "        if isinstance(value, bool)",
        "tests/unit/test_sdk.py::test_the_example_bot_approves_only_its_tool_within_every_limit_and_never_what_the_card_hides",
    ),
    (
        "gateway tokens: no scope check (a token without requests:decide approves)",
        "services/gateway/callers.py",
        "    if not open_to_tokens or (needed is not None and needed not in program.scopes):\n",
        "    if False:\n",
        "tests/integration/test_gateway_tokens.py::test_a_token_with_sessions_start_starts_a_session_but_without_requests_decide_cannot_approve[sqlite]",
    ),
    (
        "gateway tokens: the lookup ignores which token was sent (a wrong token accepted)",
        "services/gateway/programs.py",
        "        program = self._current().get(token_hash)\n",
        "        program = next(iter(self._current().values()), None)\n",
        "tests/integration/test_gateway_tokens.py::test_a_revoked_or_wrong_token_gets_401_and_no_token_appears_in_the_logs[sqlite]",
    ),
    (
        "gateway tokens: the tokens file never read again (a revoked token accepted)",
        "services/gateway/programs.py",
        "        if stamp != self._stamp:\n            self._by_hash",
        "        if self._stamp is None and stamp:\n            self._by_hash",
        "tests/integration/test_gateway_tokens.py::test_a_revoked_or_wrong_token_gets_401_and_no_token_appears_in_the_logs[sqlite]",
    ),
    # Ending a login ends its access: open streams, old credentials, logouts on record.
    (
        "gateway logins: open event streams never told that their login ended",
        "services/gateway/auth.py",
        "            if login.session_id in ended or self.logins.credential_holds(login) is None:\n                event.set()\n",
        "            if login.session_id in ended or self.logins.credential_holds(login) is None:\n                pass\n",
        "tests/integration/test_gateway_logins.py::test_a_logout_ends_the_logins_streams_on_both_replicas_within_a_second_and_a_redis_flush_undoes_nothing[postgres] "
        "tests/integration/test_gateway_logins.py::test_a_removed_user_and_a_revoked_token_lose_their_open_streams_on_both_replicas_within_a_second[sqlite]",
    ),
    (
        "gateway logins: a session not bound to its credential (a reset or re-add keeps old sessions)",
        "services/gateway/auth.py",
        "        if user is None or not hmac.compare_digest(user.credential.encode(), login.credential.encode()):\n",
        "        if user is None:\n",
        "tests/unit/test_gateway_credentials.py::"
        "test_every_user_add_makes_a_new_credential_and_a_cookie_carries_the_one_it_logged_in_with "
        "tests/integration/test_gateway_logins.py::test_a_password_reset_or_a_re_added_name_ends_every_session_of_the_old_credential[sqlite]",
    ),
    (
        "gateway logins: a logout only in Redis (the ledger's record never asked)",
        "services/gateway/auth.py",
        "        return await self.record.ended(login.session_id)\n",
        "        return False\n",
        "tests/integration/test_gateway_logins.py::test_a_logout_ends_the_logins_streams_on_both_replicas_within_a_second_and_a_redis_flush_undoes_nothing[postgres]",
    ),
    (
        "ledger: a program (bot:) approves a tool whose approvers are anyone",
        "services/approval_ledger/domain.py",
        "    if policy.approvers is None and responder.startswith(PROGRAM_PREFIX):\n",
        "    if False:\n",
        "tests/integration/test_gateway_tokens.py::test_a_token_with_requests_decide_approves_only_where_the_tools_approvers_name_it[sqlite]",
    ),
    (
        "gateway OIDC: the ID token's signature not checked",
        "services/gateway/oidc.py",
        "                decoded = jwt.decode(id_token, await self.keys(), algorithms=ALGORITHMS)\n",
        "                decoded = jwt.Token(*(lambda c: (c.headers(), json.loads(c.payload)))("
        '__import__("joserfc.jws", fromlist=["x"]).extract_compact(id_token.encode())))\n',
        "tests/integration/test_gateway_oidc.py::test_an_expired_id_token_a_wrong_audience_and_a_bad_signature_are_refused_and_log_nobody_in[sqlite-signature]",
    ),
    (
        "gateway OIDC: the ID token's audience not checked",
        "services/gateway/oidc.py",
        '                aud={"essential": True, "value": self.client_id},\n',
        "",
        "tests/integration/test_gateway_oidc.py::test_an_expired_id_token_a_wrong_audience_and_a_bad_signature_are_refused_and_log_nobody_in[sqlite-audience]",
    ),
    (
        "gateway OIDC: the ID token's expiry not checked (any leeway)",
        "services/gateway/oidc.py",
        "                leeway=30,\n",
        "                leeway=10**9,\n",
        "tests/integration/test_gateway_oidc.py::test_an_expired_id_token_a_wrong_audience_and_a_bad_signature_are_refused_and_log_nobody_in[sqlite-expired]",
    ),
    # The ledger's storage as one port; the rules that left the handlers, on the memory store.
    (
        "a dialect check back in the ledger's entrypoint",
        "services/approval_ledger/main.py",
        "lanes=writers(engine, LANES)",
        "lanes=LANES if settings.is_postgres else 1",
        "tests/unit/test_ledger_storage_boundary.py",
    ),
    (
        "the executor reads the ledger's tables itself, not through its one crossing",
        "services/tool_executor/claims.py",
        "from shared.ledger.tables import ExecutionClaim\n",
        'from shared.ledger.tables import TABLES, ExecutionClaim\n\n_CALLS = TABLES["tool_calls"]\n',
        "tests/unit/test_import_contracts.py::test_the_executor_names_none_of_the_ledgers_tables_but_through_its_crossing",
    ),
    (
        "a request is escalated again once escalated",
        "services/approval_ledger/domain.py",
        '    if request is None or request.status != "pending" or request.escalated:\n        return False\n    return spec',
        '    if request is None or request.status != "pending":\n        return False\n    return spec',
        "tests/unit/test_ledger_handlers.py::test_a_request_is_escalated_once_to_its_tools_group_who_may_then_approve_it",
    ),
    (
        "a provider error does not fail the turn",
        "services/approval_ledger/domain.py",
        "    return None if error is None else (PROVIDER_FAILED, error)",
        "    return None",
        "tests/unit/test_ledger_handlers.py::test_a_provider_error_fails_the_turn_as_provider_failed",
    ),
    (
        "a refused turn opens its session",
        "services/approval_ledger/domain.py",
        "    if not is_turn or refused is not None:\n        return None",
        "    if not is_turn:\n        return None",
        "tests/unit/test_ledger_handlers.py::test_a_message_from_a_sender_that_may_not_send_it_is_refused_and_opens_no_session",
    ),
    (
        "a running call of a tool gone from the catalogue counts as a read",
        "services/approval_ledger/domain.py",
        '    return spec.effect if spec is not None else "outward"',
        '    return spec.effect if spec is not None else "read"',
        "tests/unit/test_ledger_handlers.py::test_a_running_call_of_a_tool_no_longer_in_the_catalogue_counts_as_outward",
    ),
    (
        "inbox: an approval form without the page's digest takes the ledger's (approves whatever is on record)",
        "services/gateway/inbox.py",
        '    if decision == "approve" and not form.get("args_digest"):\n',
        "    if False:\n",
        "tests/integration/test_inbox_browser.py::test_a_forged_form_without_the_pages_digest_or_csrf_token_or_from_another_origin_changes_nothing[sqlite]",
    ),
    (
        "inbox: the approval sends the ledger's digest, not the one the page showed",
        "services/gateway/inbox.py",
        '        args_digest=form.get("args_digest") if decision == "approve" else None,\n',
        "        args_digest=None,\n",
        "tests/integration/test_inbox_browser.py::test_a_forged_form_without_the_pages_digest_or_csrf_token_or_from_another_origin_changes_nothing[sqlite]",
    ),
    (
        "inbox: a form's CSRF token not checked",
        "services/gateway/inbox.py",
        '    if not gateway.sessions.csrf_ok(who.login, form.get("csrf_token")):\n',
        "    if False:\n",
        "tests/integration/test_inbox_browser.py::test_a_forged_form_without_the_pages_digest_or_csrf_token_or_from_another_origin_changes_nothing[sqlite]",
    ),
    (
        "inbox: a form from another origin not refused",
        "services/gateway/inbox.py",
        "    check_origin(request, gateway.settings)\n    if not gateway.sessions.csrf_ok",
        "    if not gateway.sessions.csrf_ok",
        "tests/integration/test_inbox_browser.py::test_a_forged_form_without_the_pages_digest_or_csrf_token_or_from_another_origin_changes_nothing[sqlite]",
    ),
    (
        "inbox: its pages may be framed by another site",
        "services/gateway/inbox.py",
        '    "X-Frame-Options": "DENY",\n',
        "",
        "tests/integration/test_inbox_browser.py::test_a_forged_form_without_the_pages_digest_or_csrf_token_or_from_another_origin_changes_nothing[sqlite]",
    ),
    (
        "approval rules: the tool's most approvers tallied, not the count its rule recorded with the request",
        "services/approval_ledger/domain.py",
        "    required = spec.approvals_required if recorded_required is None else recorded_required\n",
        "    required = spec.approvals_required\n",
        "tests/unit/test_ledger_approval_rules.py::test_a_payment_up_to_the_threshold_is_decided_by_one_approver_as_recorded_with_its_request",
    ),
    (
        "edit before approve: a change to a field the tool does not list as editable is accepted",
        "services/approval_ledger/decision_rules.py",
        "    refused = [name for name in changed if not tool.may_edit(name)]\n",
        "    refused: list[str] = []\n",
        "tests/unit/test_ledger_approval_rules.py::test_a_refused_edit_is_answered_with_its_reason_and_nothing_is_decided_or_run "
        "tests/integration/test_gateway_approval_rules.py::test_a_forged_edit_of_a_field_that_is_not_editable_or_for_other_arguments_is_refused_and_nothing_runs[sqlite]",
    ),
    (
        "edit before approve: the executor is sent the arguments as first proposed, not the edited ones",
        "services/approval_ledger/handlers.py",
        "    call.arguments = edition.judged.arguments\n",
        "",
        "tests/unit/test_ledger_approval_rules.py::test_an_edited_approval_runs_exactly_the_edited_arguments_sealed_for_them_and_the_model_is_told",
    ),
    (
        "edit before approve: an edit sent with the digest of other arguments is judged",
        "services/approval_ledger/domain.py",
        '    if response.decision == "approve" and response.args_digest != request.args_digest:\n',
        "    if False:\n",
        "tests/unit/test_ledger_approval_rules.py::test_an_edit_sent_with_the_digest_of_other_arguments_is_refused_and_nothing_runs "
        "tests/integration/test_gateway_approval_rules.py::test_a_forged_edit_of_a_field_that_is_not_editable_or_for_other_arguments_is_refused_and_nothing_runs[sqlite]",
    ),
    # gwperf: token expiry, the limit on failed bearer tokens, the OIDC login's next page.
    (
        "gateway tokens: an expired token still accepted",
        "services/gateway/programs.py",
        "        if program is not None and program.expires_at is not None and program.expires_at <= (now or time.time()):\n",
        "        if False:\n",
        "tests/integration/test_gateway_tokens.py::test_an_expired_token_gets_401_and_sends_nothing[sqlite]",
    ),
    (
        "gateway tokens: failed bearer tokens never limited",
        "services/gateway/callers.py",
        "    wait = await gateway.state.limited(key, settings.gateway_token_failures_per_address)\n",
        "    wait = 0.0\n",
        "tests/integration/test_gateway_tokens.py::"
        "test_failed_tokens_from_one_address_are_limited_across_two_replicas_a_right_token_included[sqlite]",
    ),
    (
        "gateway OIDC: the page after login may be another site (//host)",
        "services/gateway/oidc.py",
        '        or path.startswith(("//", "/\\\\"))\n',
        "",
        "tests/integration/test_gateway_oidc.py::"
        "test_an_oidc_login_sends_the_browser_on_to_a_page_of_this_gateway_and_never_to_another_site[sqlite-//evil.example/x]",
    ),
    (
        "the executor's heartbeat queues for the pool behind the claims it guards",
        "services/tool_executor/claims.py",
        "self._update_own(call_id, heartbeat=True, lease_expires_at=",
        "self._update_own(call_id, heartbeat=False, lease_expires_at=",
        "tests/integration/test_executor_heartbeat.py::test_a_claim_is_renewed_while_every_pooled_connection_is_busy",
    ),
    # Needs the cluster rig (root; cluster_up.sh starts it and leaves it up: cluster_down.sh stops it).
    (
        "a RabbitMQ node cut off from its peers goes on alone (partition handling ignore)",
        "deploy/local/cluster_up.sh",
        "PARTITION_HANDLING=pause_minority",
        "PARTITION_HANDLING=ignore",
        "tests/cluster/test_cluster_failover.py::test_a_rabbitmq_node_cut_off_from_the_other_two_stops_while_they_go_on_and_nothing_is_lost_or_repeated",
    ),
    (
        "the cluster's standby asynchronous (a commit does not wait for it)",
        "deploy/local/cluster_up.sh",
        'if [ "$SYNC" = 1 ]; then standbys="signoff_standby"; else standbys=""; fi',
        'standbys=""',
        "tests/cluster/test_cluster_failover.py::test_the_postgresql_primary_lost_and_its_synchronous_standby_promoted_loses_and_repeats_nothing",
    ),
    (
        "a warm-started service killed by SIGPIPE (a write to a socket whose peer is gone)",
        "services/operations/warm_start.py",
        "        signal.signal(signal.SIGPIPE, signal.SIG_IGN)",
        "        signal.signal(signal.SIGPIPE, signal.SIG_DFL)",
        "tests/integration/test_warm_start_signals.py",
    ),
    # Handlers hand their writes to the store only through records.py's typed writes.
    (
        "a handler writes to the store itself again (not through records.py)",
        "services/approval_ledger/handlers.py",
        "        records.step_discarded(store, step)",
        '        store.update("steps", step.id, status="cancelled")',
        "tests/unit/test_ledger_storage_boundary.py::test_handlers_write_only_through_records_typed_writes",
    ),
    (
        "a turn's bound counts only the attempts already stored, not this transition's",
        "services/approval_ledger/domain.py",
        "        stored.provider_calls + len(spent_now),",
        "        stored.provider_calls,",
        "tests/unit/test_ledger_rules.py::test_a_turns_spend_counts_the_provider_attempts_and_tokens_the_transition_at_hand_records",
    ),
    (
        "the ledger's held-back claim gives way silently to an executor's that came between its read and commit",
        "services/approval_ledger/store_postgres.py",
        "                parts.append(sql.insert(TABLES[name], rows))",
        '                parts.append(sql.insert(TABLES[name], rows) + (" ON CONFLICT DO NOTHING" if name == "execution_claims" else ""))',
        "tests/integration/test_ledger_store_contract.py::"
        "test_an_executor_claiming_between_hold_backs_read_and_its_commit_fails_the_commit_and_the_retry_finds_its_claim[postgres]",
    ),
    (
        "a module outside shared/ledger/ and the ledger's adapters queries the database itself again",
        "services/approval_ledger/backlog.py",
        "from shared.ledger.backlog import Backlog\n",
        "from sqlalchemy import func  # noqa: F401\n\nfrom shared.ledger.backlog import Backlog\n",
        "tests/unit/test_ledger_storage_boundary.py::"
        "test_no_sql_nor_dialect_check_outside_shared_ledger_and_the_ledgers_adapters",
    ),
    # edits: an edit restarts the count, and the edited card is announced again.
    (
        "edit before approve: approvals of the version before an edit still count toward the edited one",
        "services/approval_ledger/domain.py",
        "        approvals=0,\n        approved_by_responder=False,\n",
        "",
        "tests/unit/test_ledger_approval_rules.py::test_an_edit_after_approvals_restarts_the_count_and_every_approver_approves_the_edited_version "
        "tests/unit/test_ledger_rules.py::test_an_edit_makes_a_new_version_whose_count_restarts_and_whose_digest_is_the_edited_arguments",
    ),
    (
        "edit before approve: the rows of approvals an edit withdrew stay and count",
        "services/approval_ledger/records.py",
        "        store.restart_count(edited.id)\n",
        "        pass\n",
        "tests/unit/test_ledger_approval_rules.py::test_an_edit_after_approvals_restarts_the_count_and_every_approver_approves_the_edited_version",
    ),
    (
        "edit before approve: PostgreSQL keeps the approvals a restarted count withdrew",
        "services/approval_ledger/store_postgres.py",
        '            await self.read(_RESTART_COUNT, {"request_id_": request_id})\n',
        "            pass\n",
        "tests/integration/test_ledger_store_contract.py::test_a_restarted_count_withdraws_the_requests_approvals_before_the_same_persons_new_one_goes_in[postgres]",
    ),
    (
        "edit before approve: an edit that leaves its request pending is not announced (channels keep the old card)",
        "services/approval_ledger/handlers.py",
        "            records.edited_card(\n",
        "            (lambda *_: None)(\n",
        "tests/unit/test_ledger_approval_rules.py::test_an_edit_that_restarts_the_count_announces_the_edited_card_and_its_digest_without_a_token",
    ),
    # Approve and remember.
    (
        "a remember of a tool that may not be remembered is given",
        "services/approval_ledger/decision_rules.py",
        '    if not tool.may_be_remembered:\n        return "tool_not_rememberable"',
        '    if False:\n        return "tool_not_rememberable"',
        "tests/integration/test_gateway_grants.py::test_forged_remembers_and_a_forged_grant_basis_are_refused_and_nothing_runs[sqlite]",
    ),
    (
        "a remember naming another target than the card's is given (a widened grant)",
        "services/approval_ledger/decision_rules.py",
        "    if asked.target is not None and asked.target != card.target:",
        "    if False:",
        "tests/integration/test_gateway_grants.py::test_forged_remembers_and_a_forged_grant_basis_are_refused_and_nothing_runs[sqlite]",
    ),
    (
        "a refused remember lets the response through as a plain approval",
        "services/approval_ledger/handlers.py",
        "    refused = refused or (_judge_remember(ledger, policy, request, response) if request else None)\n",
        "",
        "tests/integration/test_gateway_grants.py::test_forged_remembers_and_a_forged_grant_basis_are_refused_and_nothing_runs[sqlite]",
    ),
    (
        "a grant for one target covers calls on another target",
        "services/approval_ledger/decision_rules.py",
        "        and grant.target in (None, target)\n",
        "        and True\n",
        "tests/integration/test_gateway_grants.py::test_approve_and_remember_runs_the_next_matching_call_without_a_card_and_after_revocation_it_asks_again[sqlite]",
    ),
    (
        "a grant covers calls of another session",
        "services/approval_ledger/decision_rules.py",
        "        if grant.session_id == session_id\n",
        "        if True\n",
        # The rule's own test: the store reads only the session's grants too, so over the
        # services the other layer still holds (test_gateway_grants.py::test_a_grant_covers_no_call_of_another_session).
        "tests/unit/test_decision_rules.py::test_a_grant_covers_no_other_session_tool_version_or_target",
    ),
    (
        "a revoked grant still covers calls",
        "services/approval_ledger/decision_rules.py",
        "        and (grant.revoked_at is None or now < grant.revoked_at)\n",
        "        and True\n",
        "tests/integration/test_gateway_grants.py::test_approve_and_remember_runs_the_next_matching_call_without_a_card_and_after_revocation_it_asks_again[sqlite]",
    ),
    (
        "an expired grant still covers calls",
        "services/approval_ledger/decision_rules.py",
        "        and (grant.expires_at is None or now < grant.expires_at)\n",
        "        and True\n",
        "tests/unit/test_ledger_grants.py::test_an_expired_grant_covers_no_call",
    ),
    (
        "the executor takes a grant basis on the authorization's word (no grant row checked)",
        "services/tool_executor/claims.py",
        "        return grant_allows(call, granted, tool, target, ledger_key)\n",
        "        return None\n",
        "tests/integration/test_gateway_grants.py::test_forged_remembers_and_a_forged_grant_basis_are_refused_and_nothing_runs[sqlite]",
    ),
    (
        "anyone may revoke a grant",
        "services/approval_ledger/domain.py",
        "    if revoker in (grant.granted_by, *starters, *operators):",
        "    if True:",
        "tests/unit/test_ledger_grants.py::test_anyone_else_may_not_revoke_and_a_grant_is_revoked_once_in_its_own_session",
    ),
    # The hot path's own transactions.
    (
        "the publisher's one-statement (late) mark-sent without its fence (a deposed leader marks rows sent)",
        "shared/ledger/outbox_relay.py",
        '    " AND (SELECT epoch FROM leader) = :epoch RETURNING 1)"',
        '    " RETURNING 1)"',
        "tests/crash/test_failover.py::"
        "test_a_deposed_leaders_batch_in_flight_is_not_marked_sent_by_it_and_goes_out_again_once[without-hooks]",
    ),
    (
        "the ledger's statements on asyncpg outside a transaction (each autocommitted as it runs)",
        "services/approval_ledger/store_postgres.py",
        "            await transaction.start()\n",
        "",
        "tests/crash/test_crash_windows.py::"
        "test_a_ledger_killed_before_commit_shows_nothing_and_the_redelivery_mints_the_only_request",
    ),
    (
        "the sweeps' partial indexes of pending requests dropped",
        "shared/ledger/migrations/versions/0015_backlog_indexes.py",
        "    for name, (columns, where) in PARTIAL.items():\n",
        "    for name, (columns, where) in [(n, p) for n, p in PARTIAL.items() if 'expiry' not in n and 'escalation' not in n]:\n",
        "tests/integration/test_backlog_indexes.py::test_the_expiry_and_escalation_sweeps_read_only_the_head_of_their_partial_indexes",
    ),
    (
        "a session's pending requests without their partial index: the status index joins the session's",
        "shared/ledger/migrations/versions/0015_backlog_indexes.py",
        "    for name, (columns, where) in PARTIAL.items():\n",
        "    for name, (columns, where) in [(n, p) for n, p in PARTIAL.items() if 'session' not in n]:\n",
        "tests/integration/test_backlog_indexes.py::test_a_sessions_pending_reads_use_the_pending_session_index_not_the_status_index",
    ),
    (
        "the gauge's per-tool heads without their partial indexes",
        "shared/ledger/migrations/versions/0015_backlog_indexes.py",
        "    for name, (columns, where) in PARTIAL.items():\n",
        "    for name, (columns, where) in [(n, p) for n, p in PARTIAL.items() if 'tool' not in n]:\n",
        "tests/integration/test_backlog_indexes.py::test_the_gauge_reads_the_tally_and_each_tools_heads_never_every_pending_row",
    ),
    (
        "the pending tally without its update trigger: decided requests stay counted",
        "shared/ledger/migrations/versions/0015_backlog_indexes.py",
        "        for trigger in _PG_TRIGGERS:\n",
        "        for trigger in [t for t in _PG_TRIGGERS if 'pending_tally_update' not in t]:\n",
        "tests/integration/test_backlog_indexes.py::test_the_gauge_counts_each_tools_pending_requests_exactly_through_changes_and_folds",
    ),
    (
        "retention's oldest-row check without the inbox's time index",
        "shared/ledger/migrations/versions/0015_backlog_indexes.py",
        '    op.create_index("ix_inbox_received", "inbox", ["received_at"])\n',
        "",
        "tests/integration/test_backlog_indexes.py::test_retention_finds_nothing_past_its_time_from_one_entry_of_the_inbox_and_outbox_time_indexes",
    ),
    (
        "the gauge's per-tool heads as min() aggregates, planned over every entry of the tool",
        "shared/ledger/backlog.py",
        '        select(column)\n        .where(_waiting.c.status == "pending", _waiting.c.tool == bindparam("tool"), column.is_not(None))\n        .order_by(column)\n        .limit(1)\n',
        '        select(func.min(column))\n        .where(_waiting.c.status == "pending", _waiting.c.tool == bindparam("tool"), column.is_not(None))\n',
        "tests/integration/test_backlog_indexes.py::test_the_gauge_reads_the_tally_and_each_tools_heads_never_every_pending_row",
    ),
    # The operator's tools read and write the ledger's rows only through their named
    # modules under shared/ledger/ (console_reads.py, dead_letter_actions.py, status_reads.py).
    (
        "a dialect check back in signoff status",
        "services/operations/status.py",
        "    if has_database_servers(settings) and settings.database_identities:\n",
        "    if settings.is_postgres and settings.database_identities:\n",
        "tests/unit/test_ledger_storage_boundary.py::"
        "test_no_sql_nor_dialect_check_outside_shared_ledger_and_the_ledgers_adapters",
    ),
    (
        "the console's audit check asks the dialect itself",
        "services/operations/audit_log.py",
        "by_txid=chained_by_txid(settings))",
        "by_txid=settings.is_postgres)",
        "tests/unit/test_ledger_storage_boundary.py::"
        "test_no_sql_nor_dialect_check_outside_shared_ledger_and_the_ledgers_adapters",
    ),
    (
        "signoff status measures the backlog on an engine of its own",
        "services/operations/status.py",
        "from shared.ledger.backlog import Backlog\n",
        "from shared.ledger.backlog import Backlog, measure  # noqa: F401\nfrom shared.ledger.database import create_engine  # noqa: F401\n",
        "tests/unit/test_import_contracts.py::"
        "test_the_operator_tools_reach_the_ledgers_rows_only_through_their_named_modules[services.operations.status]",
    ),
    (
        "signoff status reads through the console's module",
        "services/operations/status.py",
        "from shared.ledger.backlog import Backlog\n",
        "from shared.ledger.backlog import Backlog\nfrom shared.ledger.console_reads import ConsoleLedger  # noqa: F401\n",
        "tests/unit/test_import_contracts.py::"
        "test_each_crossing_between_two_services_tables_is_one_named_module_used_by_the_crossing_service",
    ),
    # The relay's poll: it starts at the first unsent row.
    (
        "the relay's poll reads every unsent-index entry of the outbox's history (no first-unsent bound)",
        "shared/ledger/outbox_relay.py",
        "        from_the_first_unsent(),\n",
        "",
        "tests/integration/test_relay_poll.py::test_the_relays_poll_starts_at_the_first_unsent_row_and_reads_the_same_rows",
    ),
    (
        "the backlog gauge counts the unsent rows over every entry of the outbox's history (no first-unsent bound)",
        "shared/ledger/backlog.py",
        ".where(OUTBOX.c.sent_at.is_(None), from_the_first_unsent())",
        ".where(OUTBOX.c.sent_at.is_(None))",
        "tests/integration/test_relay_poll.py::test_the_backlog_gauge_counts_the_unsent_rows_from_the_first_unsent_one",
    ),
    # The python tools' fork server (docs/design.md, "A process per python call costs time").
    (
        "the fork server starts with the executor's whole environment",
        "services/tool_executor/tools.py",
        "                env={**_basic_environment(folder), **handed},\n",
        "                env={**os.environ, **_basic_environment(folder), **handed},\n",
        "tests/unit/test_tool_fork_server.py::"
        "test_a_tool_finds_no_secret_in_its_fork_servers_environment_or_memory_nor_any_of_its_descriptors",
    ),
    (
        "a forked call keeps the fork server's descriptors (its control socket)",
        "services/tool_executor/tool_process.py",
        "{connection, stdin, stdout, stderr, folder, *private}",
        "{connection, stdin, stdout, stderr, folder}",
        "tests/unit/test_tool_fork_server.py::"
        "test_a_tool_finds_no_secret_in_its_fork_servers_environment_or_memory_nor_any_of_its_descriptors",
    ),
    (
        "the executor never starts a dead fork server again",
        "services/tool_executor/tools.py",
        "        if self.process is None or self.process.poll() is not None:\n            self.stop()\n            self._start(folder)\n",
        "        if self.starts == 0:\n            self._start(folder)\n",
        "tests/unit/test_tool_fork_server.py::"
        "test_a_tool_that_kills_its_fork_server_dies_with_it_and_the_next_call_gets_a_new_one",
    ),
    (
        "the tool launcher never starts a dead fork server again",
        "services/operations/tool_launcher.py",
        "                if self.process is None or self.process.poll() is not None:\n                    self.stop()\n"
        "                    self._start(environment)\n",
        "                if self.process is None:\n                    self._start(environment)\n"
        "                elif self.process.poll() is not None:\n                    return False\n",
        "tests/unit/test_tool_launcher.py::"
        "test_through_the_launcher_a_tool_that_kills_its_parent_ends_its_own_call_and_the_next_call_runs",
    ),
    (
        "the fork server leaves a call running when the executor lets go (a timeout)",
        "services/tool_executor/tool_process.py",
        "                selector.unregister(connection)\n                kill_group(pid)\n",
        "                selector.unregister(connection)\n",
        "tests/unit/test_python_tools.py::test_a_tool_past_its_timeout_is_killed_with_the_processes_it_started "
        "tests/unit/test_tool_launcher.py::test_through_the_launcher_a_timeout_kills_the_tool_and_what_it_started",
    ),
    (
        "a forked call outlives its fork server (no death signal)",
        "services/tool_executor/tool_process.py",
        "        _die_with(server)\n",
        "",
        "tests/unit/test_tool_fork_server.py::"
        "test_a_tool_that_kills_its_fork_server_dies_with_it_and_the_next_call_gets_a_new_one",
    ),
    (
        "the tool launcher starts a call's fresh interpreter as itself, root (no switch of user)",
        "services/operations/tool_launcher.py",
        "                user=uid,\n                group=gid,\n                extra_groups=[],\n                umask=0o077,\n"
        "                # A group of its own",
        "                umask=0o077,\n                # A group of its own",
        "tests/unit/test_tool_launcher.py::test_a_peer_with_the_executors_uid_gets_its_tool_run_as_signoff_tools",
    ),
    (
        "a stopped fork server is waited for, never restarted",
        "services/tool_executor/tools.py",
        "            async with asyncio.timeout(FORK_ANSWER_SECONDS):\n",
        "            async with asyncio.timeout(None):\n",
        "tests/unit/test_tool_fork_server.py::"
        "test_a_tool_that_stops_its_fork_server_delays_the_next_call_by_a_few_seconds_and_it_runs",
    ),
    (
        "the services' consumers on a plain connection, not a robust one (shared/bus.py)",
        "shared/bus.py",
        "        self._connection = await connect_robust(self.url)\n",
        "        self._connection = await aio_pika.connect(self.url)  # type: ignore[assignment]\n",
        "tests/integration/test_reconnecting.py::test_services_whose_connections_are_closed_mid_call_reconnect_consume_again_and_finish_it_once",
    ),
    (
        "a service's stop waits without bound for a broker connection that cannot come back",
        "shared/bus.py",
        "            async with asyncio.timeout(self.graceful_seconds):\n                for queue, tag in self._queues:\n",
        "            async with asyncio.timeout(None):\n                for queue, tag in self._queues:\n",
        "tests/integration/test_reconnecting.py::test_a_service_whose_broker_user_is_gone_still_stops_when_told",
    ),
    (
        "a session may name only the providers SIGNOFF_PROVIDER(S) name, not one whose settings are set",
        "services/model_step/providers.py",
        "    return named + present\n",
        "    return named\n",
        "tests/integration/test_real_providers.py::"
        "test_a_session_may_name_openai_when_its_settings_are_set_though_the_default_provider_is_another",
    ),
    (
        "signoff up restarts a service that cannot listen on its port, forever",
        "services/operations/supervisor.py",
        "            if child.returncode == CANNOT_START:\n",
        "            if False:\n",
        "tests/integration/test_up_busy_ports.py",
    ),
    (
        "the tool launcher's ready line is plain text in a log of JSON lines",
        "services/operations/tool_launcher.py",
        '    log.info("tool-launcher ready on %s, for uid %d (pid %d)", launcher.path, launcher.client_uid, os.getpid())\n',
        '    print(f"tool-launcher ready on {launcher.path}, for uid {launcher.client_uid} (pid {os.getpid()})", flush=True)\n',
        "tests/integration/test_up_busy_ports.py::"
        "test_signoff_up_stops_saying_once_which_port_is_held_and_every_line_it_logged_is_one_json_object[metrics]",
    ),
    (
        "a reload reads the tools file but the ledger keeps judging by the old catalogue",
        "services/approval_ledger/main.py",
        "        ledger.catalogue = new\n",
        "        pass\n",
        "tests/integration/test_reload.py",
    ),
    (
        "a turn's idempotency key not enforced by the ledger: a repeat starts a second turn",
        "services/approval_ledger/handlers.py",
        "    if command.idempotency_key is not None:\n        earlier = await store.turn_of_key(",
        "    if False:\n        earlier = await store.turn_of_key(",
        "tests/unit/test_ledger_handlers.py::"
        "test_a_start_with_a_key_already_used_starts_nothing_and_is_answered_with_that_turn_even_after_it_ended "
        "tests/integration/test_gateway_turns.py::"
        "test_the_same_idempotency_key_answers_with_the_turn_it_started_even_after_it_ended_and_nothing_runs_twice",
    ),
    (
        "a start is answered 202 before the ledger judged it (a busy session refused out of sight)",
        "services/gateway/turns.py",
        "    verdict = await gateway.watch.verdict(turn.session_id, turn.message_id, wait, lambda: gateway.send(turn))\n",
        "    verdict = await gateway.send(turn)\n",
        "tests/integration/test_gateway_turns.py::test_a_start_for_a_session_that_waits_on_a_person_is_answered_409_naming_its_open_turn",
    ),
    (
        "a session's read without its last turn (a failed turn looks idle)",
        "services/gateway/reads.py",
        '            "status_reason": session.status_reason or turn_reason(last),\n            "last_turn": last,\n',
        '            "status_reason": session.status_reason,\n',
        "tests/integration/test_gateway_turns.py::test_a_session_whose_last_turn_failed_says_so_and_why_over_http",
    ),
    (
        "a card's target shows `${env:…}` as written, never where the call goes",
        "shared/catalogue.py",
        'env=lambda name: shown.get(name, f"${{env:{name}}}")',
        'env=lambda name: f"${{env:{name}}}"',
        "tests/integration/test_gateway_what_the_approver_sees.py::"
        "test_a_cards_target_shows_the_resolved_url_with_its_credentials_hidden",
    ),
    (
        "HEAD routed as itself (405 on every page)",
        "services/gateway/app.py",
        "    app.add_middleware(HeadAsGet)  # type: ignore[arg-type]\n",
        "",
        "tests/integration/test_gateway_what_the_approver_sees.py::"
        "test_head_answers_as_get_does_without_a_body_pages_and_event_stream_alike",
    ),
    (
        "an MCP tool whose server died mid-call called a plain error (as if it never ran)",
        "services/tool_executor/tools.py",
        '        if failure.may_have_run and spec.effect == "outward":\n',
        "        if False:\n",
        "tests/integration/test_mcp_tools.py::test_an_outward_mcp_tool_whose_server_dies_mid_call_is_outcome_unknown_never_run_again"
        " tests/integration/test_mcp_proxy_ask.py::"
        "test_an_approved_call_whose_server_dies_mid_call_closes_as_outcome_unknown_for_a_person_never_resent",
    ),
    (
        "the MCP proxy allows a tool its configuration does not name",
        "services/mcp_proxy/config.py",
        "        return self.tools.get(tool, self.unnamed)\n",
        '        return self.tools.get(tool, "allow")\n',
        "tests/integration/test_mcp_proxy.py::test_allowed_calls_pass_denied_tools_do_not_exist_and_ask_calls_wait[stdio]",
    ),
    (
        "a call filed again makes a second request (the ledger does not look for its filing)",
        "services/approval_ledger/intake.py",
        "    filed = await store.filed_call_by_caller(command.program, command.caller_call_id)\n",
        "    filed = None\n",
        "tests/unit/test_intake_handlers.py::test_the_same_call_filed_again_changes_nothing_and_with_other_arguments_is_refused",
    ),
    (
        "a channel on the bus files a call in the name of a program it is not registered for",
        "services/approval_ledger/intake.py",
        "        if refused:\n            return refused\n    if isinstance(message, FileCall):",
        "        if False:\n            return refused\n    if isinstance(message, FileCall):",
        "tests/integration/test_intake.py::"
        "test_a_program_on_the_bus_files_a_call_once_as_its_channel_and_may_not_file_as_another[postgres]",
    ),
    (
        "a second claim granted while one is held",
        "services/approval_ledger/intake_rules.py",
        '        return Refusal("claim_held", f"The call is claimed by {holder_said(filed)}.")',
        '        return "grant"',
        "tests/unit/test_intake_handlers.py::test_runs_caller_claim_is_granted_once_and_the_result_closes_the_call_once "
        "tests/integration/test_intake.py::test_a_caller_claims_once_gets_the_edited_arguments_and_reports_once[sqlite]",
    ),
    (
        "a result taken with any claim token",
        "services/approval_ledger/intake_rules.py",
        '    if filed.claim_token_hash != command.claim_token_hash:\n        return Refusal("wrong_claim_token"',
        '    if False:\n        return Refusal("wrong_claim_token"',
        "tests/unit/test_intake_handlers.py::test_runs_caller_claim_is_granted_once_and_the_result_closes_the_call_once "
        "tests/integration/test_intake.py::test_a_caller_claims_once_gets_the_edited_arguments_and_reports_once[sqlite]",
    ),
    (
        "a claim whose lease ended with no result is left open (never outcome unknown)",
        "services/approval_ledger/intake_rules.py",
        "        and at >= filed.lease_expires_at\n",
        "        and False\n",
        "tests/unit/test_intake_handlers.py::test_a_claim_whose_lease_ends_with_no_result_closes_as_outcome_unknown_and_asks_a_person",
    ),
    (
        "a framework resumed with a forged decision goes on though Signoff has none (the gate pauses only once)",
        "sdk/signoff_sdk/gate.py",
        '    while filed.status == "pending":\n        yield Pause(filed)\n',
        '    if filed.status == "pending":\n        yield Pause(filed)\n',
        "tests/integration/test_langchain_gate.py::"
        "test_a_forged_resume_runs_nothing_an_edit_runs_the_edited_arguments_and_a_denial_reaches_the_model[sqlite]",
    ),
    (
        "a gated OpenAI Agents tool body runs on the agent's own approval, without Signoff's",
        "sdk/signoff_sdk/openai_agents.py",
        "            settled = await steps.adrive(steps.settle(filing), self.connection, pause=_not_decided, run=run)\n",
        "            return await body(context, arguments_json)\n",
        "tests/integration/test_openai_agents_gate.py::"
        "test_a_hand_approval_runs_nothing_an_edit_runs_the_edited_arguments_and_a_denial_reaches_the_model[sqlite]",
    ),
    (
        "a framework gate runs an edit the agent does not allow",
        "sdk/signoff_sdk/gate.py",
        '    if filed.status == "approved" and allowed is not None and decision not in allowed:\n',
        "    if False:\n",
        "tests/unit/test_gate_steps.py::test_an_edit_the_agent_does_not_allow_is_not_claimed_and_nothing_runs",
    ),
    (
        "the SDK believes a verdict whatever key signed it",
        "sdk/signoff_sdk/verdicts.py",
        "    if not ed25519.verify(public_key, body, signature):",
        "    if False:",
        "tests/unit/test_sdk_verdicts.py "
        "tests/integration/test_intake_sdk.py::test_a_verdict_not_signed_by_the_ledgers_key_is_refused_and_nothing_runs[sqlite]",
    ),
    (
        "the Slack channel takes interactions without checking Slack's signature",
        "signoff/adapters/slack.py",
        "        client=client,\n    )\n",
        "        client=client,\n        request_verification_enabled=False,\n    )\n",
        "tests/integration/test_slack_channel.py::"
        "test_forged_stale_unmapped_and_non_approver_clicks_decide_nothing_and_two_approvers_count_once_each",
    ),
    (
        "the Slack channel posts again a card it was killed while posting (no look-up by metadata)",
        "signoff/adapters/slack.py",
        '                return str(message["ts"])\n',
        "                return None\n",
        "tests/integration/test_slack_channel.py::"
        "test_after_a_sigkill_every_pending_card_is_posted_once_even_one_killed_mid_post",
    ),
    (
        "a channel adapter waiting for the verdict is not told of a refusal",
        "signoff/channel.py",
        "                        raise Refused(event)\n",
        "                        pass\n",
        "tests/integration/test_channel_add.py::"
        "test_a_channel_added_while_the_ledger_runs_counts_at_once_and_before_that_its_adapter_is_refused",
    ),
    (
        "the email channel takes a link it did not sign",
        "signoff/adapters/email.py",
        "    if not mac or not hmac.compare_digest(mac, wanted):\n",
        "    if False:\n",
        "tests/integration/test_email_channel.py::"
        "test_a_mailed_card_is_decided_only_by_its_links_post_once_as_the_recipient",
    ),
    (
        "the email channel decides a separation-of-duties tool without the recipient's password",
        "signoff/adapters/email.py",
        "        if self.needs_login(event) and not self.verify_login(",
        "        if False and not self.verify_login(",
        "tests/integration/test_email_channel.py::"
        "test_a_tool_with_separation_of_duties_asks_the_recipients_password_on_the_page",
    ),
    (
        "the email channel mails in the clear though the server offers STARTTLS",
        "signoff/adapters/email.py",
        '            start_tls=True if security == "always" else (False if security == "tls" else None),\n',
        "            start_tls=False,\n",
        "tests/integration/test_email_channel.py::"
        "test_a_tool_with_separation_of_duties_asks_the_recipients_password_on_the_page",
    ),
    (
        "an MCP call's id derived from what the call is (a random id per call instead)",
        "services/mcp_proxy/config.py",
        '    material = rfc8785.dumps([origin, tool, arguments, client_call_id or ""])\n',
        '    material = rfc8785.dumps([origin, tool, arguments, client_call_id or "", __import__("secrets").token_hex(8)])\n',
        "tests/integration/test_mcp_proxy_ask.py::test_a_proxy_sigkilled_before_the_decision_and_after_the_approval_gives_the_retry_the_one_result[sqlite]",
    ),
    (
        "an MCP call the ledger closed (expired, cancelled) told to the client as a plain error",
        "services/mcp_proxy/intake_gate.py",
        '            return tool_error(closed.kind, f"{offered.name}: {said}{reason}.", reason=closed.reason, **facts)\n',
        '            return tool_error("error", f"{offered.name}: {said}{reason}.", reason=closed.reason, **facts)\n',
        "tests/integration/test_mcp_proxy_ask.py::test_a_request_nobody_decides_in_time_reaches_the_client_as_an_expired_tool_error"
        " tests/integration/test_mcp_proxy_ask.py::"
        "test_a_request_an_operator_cancels_reaches_the_held_client_as_a_cancelled_tool_error",
    ),
    (
        "the MCP proxy's claim lasts the intake's default lease, not its call's bound (outcome unknown told late)",
        "services/mcp_proxy/intake_gate.py",
        "            filed, lease_seconds=claim_lease(offered), holder=",
        "            filed, holder=",
        "tests/integration/test_mcp_proxy_ask.py::"
        "test_an_approved_call_the_proxy_runs_whose_server_dies_mid_call_closes_as_outcome_unknown_within_its_lease",
    ),
    (
        "the MCP proxy files an ask call whose arguments fail the tool's schema",
        "services/mcp_proxy/server.py",
        "        if errors:\n",
        '        if errors and offered.policy != "ask":\n',
        "tests/integration/test_mcp_proxy_ask.py::test_bad_input_for_an_ask_tool_is_a_json_rpc_error_and_nothing_is_filed",
    ),
    (
        "the MCP proxy ignores a client's URL elicitation capability (no link to the card)",
        "services/mcp_proxy/intake_gate.py",
        "    capabilities = ctx.session.client_capabilities\n",
        "    capabilities = None\n",
        "tests/integration/test_mcp_proxy_ask.py::"
        "test_a_client_that_declares_url_elicitation_is_sent_the_inbox_card_and_its_answer_decides_nothing",
    ),
    (
        "a 2026-07-28 client's retry with its answer to the card's link asked again (never held)",
        "services/mcp_proxy/intake_gate.py",
        "    return CARD_INPUT in responses\n",
        "    return False\n",
        "tests/integration/test_mcp_proxy_ask.py::"
        "test_a_client_that_declares_url_elicitation_is_sent_the_inbox_card_and_its_answer_decides_nothing[auto]",
    ),
    (
        "a person's answer in the tool's place closes the call as a denial (no answered closure)",
        "services/approval_ledger/handlers.py",
        "        records.closure(store, session, call, domain.closure_of_decision(response), response)\n",
        "        records.closure(store, session, call, domain.closure_of_denial(response.reason), response)\n",
        "tests/integration/test_bad_input_and_redelivery.py::"
        "test_a_call_answered_in_the_tools_place_never_runs_and_the_model_reads_the_answer_as_its_result "
        "tests/integration/test_langchain_gate.py::"
        "test_a_persons_answer_in_the_tools_place_reaches_the_model_as_the_tools_result_and_the_tool_never_runs[sqlite]",
    ),
    (
        "SignoffToolGate hands a person's answer to the model as a rejection, not as the tool's result",
        "sdk/signoff_sdk/langchain.py",
        '        if settled.decision == "respond" and "respond" in config["allowed_decisions"]:\n',
        "        if False:\n",
        "tests/integration/test_langchain_gate.py::"
        "test_a_persons_answer_in_the_tools_place_reaches_the_model_as_the_tools_result_and_the_tool_never_runs[sqlite]",
    ),
    (
        "the OpenAI Agents adapter wraps a person's answer as a denial instead of passing it as the tool's output",
        "sdk/signoff_sdk/openai_agents.py",
        "                    state.reject(item, rejection_message=verdict.message)\n",
        '                    state.reject(item, rejection_message=f"A person denied the call: {verdict.message}")\n',
        "tests/integration/test_openai_agents_gate.py::"
        "test_a_persons_answer_in_the_tools_place_reaches_the_model_as_the_tools_output_and_the_body_never_runs[sqlite]",
    ),
    (
        "the SDK's event stream reconnects from now instead of right after the last event it saw",
        "sdk/signoff_sdk/client.py",
        "                                failing_since, backoff, last = None, FIRST_BACKOFF, event.id\n",
        "                                failing_since, backoff = None, FIRST_BACKOFF\n",
        "tests/integration/test_langchain_gate.py::"
        "test_the_resumer_follows_the_event_stream_and_a_decision_made_while_the_gateway_was_down_resumes_its_thread"
        "[postgres]",
    ),
    (
        "the console opens a FastStream broker again beside its Bus",
        "services/operations/console.py",
        "from shared import consuming, keyring\n",
        "from faststream.rabbit import RabbitBroker  # noqa: F401\n\nfrom shared import consuming, keyring\n",
        "tests/unit/test_one_way.py::test_nothing_that_runs_imports_faststream_only_the_asyncapi_writer_does",
    ),
    (
        "the console signs a response itself, not through shared/responses.py",
        "services/operations/console.py",
        "        return self.signer().sign(response)\n",
        "        from shared.signatures import sign\n\n"
        "        unsigned = response.model_copy(update={'key_id': self.settings.channel})\n"
        "        return unsigned.model_copy(update={'signature': sign(self.signer().key, unsigned.signed_part())})\n",
        "tests/unit/test_one_way.py::test_a_response_is_signed_in_one_place",
    ),
    (
        "an email draws a card line of its own instead of the card's rows",
        "signoff/adapters/email.py",
        "    return [card_headline(face), *card_rows(face, details=details)]\n",
        "    return [card_headline(face), *[r.replace('(secret: withheld', '(withheld') for r in card_rows(face, details=details)]]\n",
        "tests/unit/test_one_way.py::test_the_console_an_email_and_the_sdk_draw_a_card_with_the_same_lines",
    ),
    (
        "the executor starts an MCP server for every call (no kept connection)",
        "services/tool_executor/tools.py",
        "    own = connections is None\n    if connections is None:\n",
        "    own = True\n    if True:\n",
        "tests/integration/test_mcp_tools.py::test_approved_calls_to_one_mcp_server_are_served_by_one_process_started_once"
        " tests/integration/test_mcp_proxy_ask.py::"
        "test_approved_mcp_calls_the_executor_runs_share_one_server_process_it_started_once",
    ),
    (
        "a kept MCP connection whose server died is handed the next call (never replaced)",
        "shared/mcp_upstream.py",
        "                if connection is None or not connection.open:\n",
        "                if connection is None:\n",
        "tests/integration/test_mcp_tools.py::test_a_killed_mcp_server_is_started_again_for_the_next_call",
    ),
    (
        "a kept MCP connection is not watched while idle (a dead server is found by the next call, which it fails)",
        "shared/mcp_upstream.py",
        "            group.start_soon(self._watch, connection)\n",
        "",
        "tests/integration/test_mcp_tools.py::test_a_killed_mcp_server_is_started_again_for_the_next_call",
    ),
    (
        "a kept MCP connection whose call timed out keeps serving (a stuck server is never replaced)",
        "shared/mcp_upstream.py",
        "        # A server that does not answer may be stuck: the next request gets a new connection.\n"
        "        connection.retire()\n",
        "",
        "tests/integration/test_mcp_tools.py::test_a_hanging_server_times_out_its_call_gets_a_new_connection_and_blocks_no_other",
    ),
    # Warm workers serve one reusable tool each; every other tool gets a fresh process.
    (
        "a warm tool worker serves any tool's calls (its pool not keyed by the tool)",
        "services/tool_executor/tools.py",
        "        key = (run_as, str(folder), implementation.function, tuple(sorted(call.env.items())))\n",
        "        key = (run_as, str(folder))\n",
        "tests/unit/test_warm_tool_workers.py::test_a_warm_process_serves_one_tool_and_never_another",
    ),
    (
        "every python tool is served by a warm worker, marked reusable or not",
        "services/tool_executor/tools.py",
        "        if implementation.reuse_process:\n",
        "        if True:\n",
        "tests/unit/test_warm_tool_workers.py::test_a_tool_not_marked_reusable_still_gets_a_fresh_process_per_call",
    ),
    (
        "a warm tool worker whose call timed out is kept for the next call",
        "services/tool_executor/tools.py",
        '                whole = answer is not None and answer.endswith(b"\\n")\n',
        "                whole = True\n",
        "tests/unit/test_warm_tool_workers.py::test_a_warm_process_past_its_timeout_is_killed_with_its_group_and_not_reused",
    ),
    # A logout notifies every replica's watcher, which then reads the open streams' ended logins.
    (
        "gateway: a logout does not notify the replicas' open streams (they read the ended logins only now and then)",
        "shared/ledger/gateway_logins.py",
        "                if self.notify is not None:\n",
        "                if False:\n",
        "tests/integration/test_gateway_logins.py::"
        "test_a_logout_ends_the_logins_streams_on_both_replicas_within_a_second_and_a_redis_flush_undoes_nothing",
    ),
    # Canonical JSON: the standard library's writer only where its bytes are RFC 8785's.
    (
        "canonical JSON written by the standard library for floats and integers past 2^53 too",
        "shared/signatures.py",
        "    if type(value) is not int or not -_SAFE_INTEGER <= value <= _SAFE_INTEGER:\n",
        "    if False:\n",
        "tests/unit/test_canonical_json.py::test_canonical_bytes_are_rfc_8785s_for_every_json_value",
    ),
    (
        "a step report's read says the session has no grants when it has some",
        "services/approval_ledger/store_sql.py",
        "        if not row.has_grants:\n",
        "        if True:\n",
        "tests/integration/test_gateway_grants.py::test_approve_and_remember_runs_the_next_matching_call_without_a_card_and_after_revocation_it_asks_again",
    ),
    (
        "the executor's fresh claim on asyncpg is committed though the ledger's record refuses the call",
        "shared/ledger/claims.py",
        "                if refusal is None and record is not None and record.fresh:\n",
        "                if record is not None and record.fresh:\n",
        "tests/integration/test_trust.py::"
        "test_a_sealed_command_for_a_call_not_yet_approved_runs_nothing_and_leaves_no_claim_to_block_the_approved_run",
    ),
    (
        "the gateway's ended-login check on asyncpg finds no ended login",
        "shared/ledger/gateway_logins.py",
        '                return bool(await driver.fetch(conn, _ENDED_ONE, {"session_id": session_id}))\n',
        "                return False\n",
        "tests/integration/test_gateway_logins.py::"
        "test_a_logout_ends_the_logins_streams_on_both_replicas_within_a_second_and_a_redis_flush_undoes_nothing",
    ),
    (
        "a pooled connection the server closed handed out again (after a failover)",
        "shared/ledger/database.py",
        "        if driver is not None and driver.is_closed():\n",
        "        if False:\n",
        "tests/integration/test_pooled_connections.py",
    ),
    (
        "signoff up left with SIGINT ignored when started in the background",
        "services/operations/supervisor.py",
        "        signal.signal(signal.SIGINT, signal.default_int_handler)\n",
        "",
        "tests/integration/test_supervisor.py::test_signoff_up_started_with_sigint_ignored_still_stops_its_services_on_sigint",
    ),
]

# A failure of these kinds says the revert broke the tree (an import, a name, a
# fixture), not that a test saw the invariant broken: it is not counted as caught.
BROKEN_TREE = ("ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError", "NameError")


def failures(report: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The named tests' failures in a JUnit report: (failed on a check, broken tree or setup).
    A test counts as catching a revert only if its own body failed (a `failure`, not a
    setup `error` or a collection error) with something other than a broken import."""
    import xml.etree.ElementTree as ElementTree

    if not report.exists():
        return [], [("(no report)", "pytest did not run the tests")]
    failed: list[tuple[str, str]] = []
    broken: list[tuple[str, str]] = []
    for case in ElementTree.parse(report).iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        for element in case:
            message = (
                (element.get("message") or element.get("type") or "").splitlines()[0][:160]
                if (element.get("message") or element.get("type"))
                else ""
            )
            if element.tag == "failure":
                kind = message.split(":")[0].strip()
                (broken if kind in BROKEN_TREE else failed).append((test, message))
            elif element.tag == "error":
                broken.append((test, f"error, not a failed check: {message}"))
    return failed, broken


def main(argv: list[str]) -> int:
    only = {int(i) for i in argv}
    toothless = 0
    with tempfile.TemporaryDirectory(prefix="signoff-revert-") as scratch:
        # Enterable by the services' own users: `signoff up` as root runs them from this tree.
        Path(scratch).chmod(0o755)
        root = Path(scratch) / "tree"
        # A clean copy of what is committed, so nothing uncommitted counts.
        root.mkdir()
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=PROJECT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
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
            report = Path(scratch) / f"report-{index}.xml"
            try:
                run = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-x", f"--junitxml={report}", *tests.split()],
                    cwd=root,
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
            finally:
                target.write_text(text)
            failed, broken = failures(report)
            caught = bool(failed) and not broken
            toothless += not caught
            last = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
            verdict = "caught" if caught else "NOT CAUGHT"
            print(f"{index:2d} {name}: {verdict} ({last})", flush=True)
            for test, why in failed + broken:
                print(f"       {test}: {why}", flush=True)
    print("every reverted fix was caught" if not toothless else f"{toothless} reverted fix(es) not caught")
    return 1 if toothless else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
