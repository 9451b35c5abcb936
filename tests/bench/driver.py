"""The run: arguments, the phases in order (services, floors, warm-up, levels,
recovery, the end-of-run check), the JSON and the exit status."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import tests.bench
from shared.settings import PROJECT_ROOT
from tests.bench.adapter import BenchFailure, ChannelAdapter
from tests.bench.cpu import find_py_spy, summarize_profile
from tests.bench.floors import postgres_floor, rabbitmq_floor
from tests.bench.gateway import add_user, gateway_levels
from tests.bench.levels import Context, LedgerReader, SqliteLedgerReader, run_level
from tests.bench.recovery import RECOVERY_MODES, recovery_try
from tests.bench.report import Progress, median_of, render_table
from tests.harness import Deployment, require_services
from tests.invariants import check_run
from tests.long_session import bytes_per_step, long_script

# The long session's turns are this many model steps each (tests/long_session.py).
LONG_SESSION_STEPS_PER_TURN = 50


async def check_exactly_once(ctx: Context) -> dict[str, Any]:
    """tests/invariants.py's end-of-run check, given the bench's workload and what the
    adapter saw; its figures as the JSON's `checks`."""
    adapter = ctx.adapter
    seen = [f"rejections or failed turns: {adapter.problems[:5]}"] if adapter.problems else []
    verdict = await check_run(adapter.console, shown=adapter.shown, round_trips=adapter.completed, seen=seen)
    figures = verdict.figures
    return {
        "round_trips_completed": adapter.completed,
        **{key: figures[key] for key in ("tool_calls", "closures_by_kind", "claims", "counter_max",
                                         "counter_distinct", "sessions_by_status", "dead_letters")},
        "events_seen": dict(adapter.events),
        "driver_sent": dict(adapter.sent),
        "violations": verdict.violations,
        "passed": verdict.passed,
    }


async def long_session(ctx: Context, turns: int) -> dict[str, Any]:
    """One session of `turns` x 50 model steps, after the checks (its calls are no round
    trips): the ledger bytes each step added, per turn; flat is the claim."""
    steps = LONG_SESSION_STEPS_PER_TURN
    async with Progress("long session", lambda e: f"{turns} turns of {steps} model steps  {e:5.1f} s"):
        per_step = await bytes_per_step(ctx.adapter.console, ctx.ledger.table_bytes, turns=turns,
                                        steps_per_turn=steps)
    return {
        "steps": turns * steps,
        "steps_per_turn": steps,
        "ledger_bytes_per_step_by_turn": [round(sum(turn.values())) for turn in per_step],
        "outbox_bytes_per_step_by_turn": [round(turn["outbox"]) for turn in per_step],
        "by_table_first_turn": {k: round(v) for k, v in per_step[0].items() if v},
        "by_table_last_turn": {k: round(v) for k, v in per_step[-1].items() if v},
    }


async def embedded_levels(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    """The same round trip on the embedded default (SQLite, one ledger writer, the
    publisher polling), a deployment of its own: its levels and its own
    exactly-once check."""
    deployment = Deployment(store="sqlite", data_dir=data_dir / "sqlite",
                            extra_env={"SIGNOFF_LOG_LEVELS": args.log_levels})
    adapter = ChannelAdapter()
    ledger = SqliteLedgerReader(deployment.settings)
    ctx = Context(deployment, adapter, ledger, [])  # type: ignore[arg-type]
    found: dict[str, Any] = {"levels": [], "failures": ctx.failures}
    opened = contextlib.AsyncExitStack()
    try:
        sys.stderr.write(f"[bench] the embedded default: SQLite ledger (namespace {deployment.namespace})\n")
        await asyncio.to_thread(deployment.start)
        await adapter.open(await opened.enter_async_context(deployment.console()))
        await ledger.open()
        opened.push_async_callback(ledger.close)
        await run_level(ctx, min(4, max(args.sqlite_levels)), args.warmup_seconds, "sqlite warm-up")
        for concurrency in args.sqlite_levels:
            found["levels"].append(await run_level(ctx, concurrency, args.seconds, f"sqlite level {concurrency}"))
        found["checks"] = await check_exactly_once(ctx)
    finally:
        try:
            await opened.aclose()
        except Exception:  # noqa: BLE001 - best effort
            pass
        await deployment.cleanup()
    return found


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    require_services(postgres=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    data_dir = PROJECT_ROOT / "data" / "bench" / f"run-{stamp}"
    deployment = Deployment(store="postgres", data_dir=data_dir,
                            extra_env={"SIGNOFF_QUEUE_TYPE": args.queue_type, "SIGNOFF_LOG_LEVELS": args.log_levels,
                                       **dict(args.service_env)})
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.gateway_levels:
        add_user(deployment)  # the gateway's login for its level, before its channel is registered
    # The fixtures' script with the long session's (`long-*`); the round trips' `bench-*` unchanged.
    deployment.script_file = long_script(data_dir / "script.yaml", turns=args.long_session_turns,
                                         steps_per_turn=LONG_SESSION_STEPS_PER_TURN)
    result: dict[str, Any] = {
        "started_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average_at_start": os.getloadavg()},
        "settings": {"seconds": args.seconds, "levels": args.levels, "recovery_tries": args.recovery_tries,
                     "recovery_sessions": args.recovery_sessions, "floor_seconds": args.floor_seconds,
                     "queue_type": args.queue_type, "log_levels": args.log_levels,
                     "gateway_levels": args.gateway_levels, "gateway_runs": args.gateway_runs,
                     "service_env": dict(args.service_env),
                     "namespace": deployment.namespace},
        "levels": [],
        "failures": [],
    }
    adapter = ChannelAdapter()
    ledger = LedgerReader(deployment.schema)
    ctx = Context(deployment, adapter, ledger, result["failures"])
    opened = contextlib.AsyncExitStack()
    # SIGTERM (and SIGINT, even where a shell left it ignored) stops the run; the finally clause cleans up.
    loop, main_task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main_task.cancel)
    try:
        sys.stderr.write(f"[bench] starting the four services (namespace {deployment.namespace}, logs in {data_dir})\n")
        await asyncio.to_thread(deployment.start)
        await adapter.open(await opened.enter_async_context(deployment.console()))
        await ledger.open()
        opened.push_async_callback(ledger.close)

        result["floor"] = {
            "postgres": await postgres_floor(deployment.schema, args.floor_seconds),
            "rabbitmq": await rabbitmq_floor(deployment.namespace, args.floor_seconds, queue_type=args.queue_type),
        }
        # Warm every process's pools, caches and imports before measuring.
        await run_level(ctx, min(4, max(args.levels)), args.warmup_seconds, "warm-up")
        for concurrency in args.levels:
            profile = args.profile if args.profile and concurrency == max(args.levels) else None
            level = await run_level(ctx, concurrency, args.seconds, f"level {concurrency}", profile)
            result["levels"].append(level)
        if args.gateway_levels:
            result["gateway"] = await gateway_levels(ctx, args)
        tries = []
        for attempt in range(args.recovery_tries):
            for mode in RECOVERY_MODES:
                async with Progress("recovery", lambda e, a=attempt, m=mode: f"{m} try {a + 1}/{args.recovery_tries}"
                                                                             f"  {e:4.1f} s"):
                    tries.append(await recovery_try(ctx, args.recovery_sessions, mode))
        if tries:
            result["recovery"] = {"tries": tries, "median": {
                mode: {k: median_of([t[k] for t in tries if t["mode"] == mode]) for k in tries[0]
                       if k not in ("sessions", "mode")}
                for mode in RECOVERY_MODES}}
        result["checks"] = await check_exactly_once(ctx)
        if args.long_session_turns:
            result["long_session"] = await long_session(ctx, args.long_session_turns)
        if args.sqlite_levels:
            result["sqlite"] = await embedded_levels(args, data_dir)
    except asyncio.CancelledError:
        result["failures"].append("interrupted")
        sys.stderr.write(f"\n[bench] interrupted; cleaning up namespace and schema {deployment.namespace}\n")
    except Exception as error:
        result["failures"].append(f"{type(error).__name__}: {error}")
        sys.stderr.write(f"\n[bench] failed: {type(error).__name__}: {error}; service logs in {data_dir / 'logs'}\n")
        if not isinstance(error, BenchFailure):
            import traceback

            traceback.print_exc()
    finally:
        try:
            await opened.aclose()  # each one closed, even if another fails
        except Exception:  # noqa: BLE001 - best effort
            pass
        await deployment.cleanup()
    sqlite = result.get("sqlite")
    if sqlite is not None:
        result["failures"].extend(f"sqlite: {f}" for f in sqlite["failures"])
        if not sqlite.get("checks", {}).get("passed"):
            result["failures"].append("sqlite: the exactly-once check failed: "
                                      f"{sqlite.get('checks', {}).get('violations', 'not run')}")
    result["passed"] = not result["failures"] and bool(result.get("checks", {}).get("passed"))
    if result["passed"] and not args.keep_logs:
        shutil.rmtree(data_dir, ignore_errors=True)
    if args.profile:
        summaries = [summarize_profile(p) for p in sorted(args.profile.rglob("*.txt"))
                     if p.stat().st_size and p.name != "summary.txt"]
        (args.profile / "summary.txt").write_text("\n\n".join(summaries) + "\n")
        result["profile"] = str(args.profile)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=tests.bench.__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per level (default 20)")
    parser.add_argument("--levels", default="1,16,64", help="concurrent sessions per level (default 1,16,64)")
    parser.add_argument("--recovery-tries", type=int, default=3, help="kill-and-restart tries (default 3)")
    parser.add_argument("--recovery-sessions", type=int, default=8, help="sessions pending during recovery")
    parser.add_argument("--floor-seconds", type=float, default=4.0, help="seconds per floor measurement")
    parser.add_argument("--warmup-seconds", type=float, default=2.0, help="unmeasured warm-up before the levels")
    parser.add_argument("--output", type=Path, help="JSON figures (default data/bench/bench-<timestamp>.json)")
    parser.add_argument("--quick", action="store_true", help="levels 1,4 at 3 s each, 1 recovery try")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="py-spy every service during the highest level; raw stacks and summary.txt in DIR")
    parser.add_argument("--long-session-turns", type=int, default=None,
                        help="turns of 50 model steps in the long session that measures ledger bytes per step "
                             "(default 10: 500 steps, with --quick 2; 0: none)")
    parser.add_argument("--sqlite-levels", default="16",
                        help="levels on the embedded default, SQLite (default 16; 0 or empty: none)")
    parser.add_argument("--queue-type", choices=("quorum", "classic"), default="quorum",
                        help="the inbound queues' type (SIGNOFF_QUEUE_TYPE; default quorum)")
    parser.add_argument("--gateway-levels", default="16",
                        help="levels whose approvals go through the HTTP gateway (the card from its event stream, "
                             "the decision by POST), each right after an AMQP level of the same concurrency "
                             "(default 16; 0 or empty: none)")
    parser.add_argument("--gateway-runs", type=int, default=1,
                        help="AMQP/gateway pairs per gateway level; the median is reported (default 1)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the services' logs of a passing run")
    parser.add_argument("--log-levels", default="",
                        help="the services' SIGNOFF_LOG_LEVELS, e.g. signoff.ledger=WARNING,signoff.model_step=WARNING "
                             "for an A/B of the INFO line per ledger transition and per model step")
    parser.add_argument("--service-env", action="append", default=[], type=lambda s: tuple(s.split("=", 1)),
                        metavar="SIGNOFF_X=VALUE",
                        help="an environment variable for every service, for an A/B of a setting "
                             "(e.g. SIGNOFF_GATEWAY_HTTP=h11); repeatable")
    args = parser.parse_args(argv)
    if args.quick:
        args.levels, args.seconds, args.recovery_tries, args.sqlite_levels = "1,4", 3.0, 1, "4"
        args.gateway_levels = "4"
        args.floor_seconds, args.warmup_seconds = 1.5, 1.0
    if args.long_session_turns is None:
        args.long_session_turns = 2 if args.quick else 10
    args.levels = [int(x) for x in str(args.levels).split(",") if x.strip()]
    args.gateway_levels = [int(x) for x in str(args.gateway_levels).split(",") if x.strip() and int(x) > 0]
    args.sqlite_levels = [int(x) for x in str(args.sqlite_levels).split(",") if x.strip() and int(x) > 0]
    if not args.levels or min(args.levels) < 1:
        parser.error("--levels needs positive integers, e.g. 1,16,64")
    if args.output is None:
        args.output = PROJECT_ROOT / "data" / "bench" / f"bench-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    if args.profile is not None:
        if find_py_spy() is None:
            parser.error("--profile needs py-spy: .venv/bin/pip install py-spy (it is not a project dependency)")
        args.profile = args.profile.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    result = asyncio.run(bench(args))
    result["wall_seconds"] = round(time.time() - started, 1)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(render_table(result))
    print(f"\nfigures: {args.output}  ({result['wall_seconds']:.0f} s in all)")
    if args.profile:
        print(f"profile: {args.profile}/summary.txt")
    return 0 if result["passed"] else 1
