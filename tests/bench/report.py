"""What the bench prints: percentiles, one progress line per phase on stderr, and
the table of figures at the end (the JSON has every figure; this is the summary)."""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
import time
from typing import Any


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary_ms(values: list[float]) -> dict[str, float | None]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90), "p99": percentile(ms, 99),
            "max": max(ms) if ms else None}


class Progress:
    """One updating line on stderr per phase; where stderr is not a terminal (a log
    file, CI), a plain line every `PERIOD` seconds and one at the end instead."""

    # Seconds between progress lines when stderr is not a terminal.
    PERIOD = 5.0

    def __init__(self, label: str, render) -> None:
        self.label = label
        self.render = render
        self.started = time.time()
        self.task: asyncio.Task | None = None
        self.live = sys.stderr.isatty()

    async def __aenter__(self) -> Progress:
        self.task = asyncio.create_task(self._loop())
        return self

    async def _loop(self) -> None:
        if not self.live:
            while True:
                await asyncio.sleep(self.PERIOD)
                self._write("\n")
        while True:
            self._write()
            await asyncio.sleep(0.25)

    def _write(self, end: str = "") -> None:
        text = f"[{self.label}] {self.render(time.time() - self.started)}"
        sys.stderr.write(f"\r{text.ljust(100)}{end}" if self.live else f"{text.rstrip()}{end}")
        sys.stderr.flush()

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        self._write("\n")


def median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def render_table(result: dict[str, Any]) -> str:
    lines = []
    floor = result.get("floor", {})
    pg = floor.get("postgres", {}).get("commits_per_second")
    mq = floor.get("rabbitmq", {}).get("messages_per_second")
    lines.append(f"Signoff bench: {result['machine']['cpus']} CPUs, {result['machine']['platform']}, "
                 f"PostgreSQL ledger, {result['settings']['seconds']:.0f} s per level, load average at start "
                 f"{result['machine']['load_average_at_start'][0]:.1f}")
    lines.append(f"floor: PostgreSQL {_f(pg, 0)} one-row commits/s (16 connections); "
                 f"RabbitMQ {_f(mq, 0)} confirmed persistent 1 KB msgs/s published+consumed "
                 f"({result['settings'].get('queue_type', 'quorum')} queue)")
    lines.append("")
    head = (f"{'sessions':>8} {'rt/s':>7} │ {'resp→executed ms':^20} │ {'start→approval ms':^20} │ "
            f"{'txn/rt':>6} {'wtx/rt':>6} {'msg/rt':>6} │ {'pg limit':>8} {'mq limit':>8}")
    lines.append(head)
    lines.append(f"{'':>8} {'':>7} │ {'p50':>6} {'p90':>6} {'p99':>6} │ {'p50':>6} {'p90':>6} {'p99':>6} │"
                 f" {'':>6} {'':>6} {'':>6} │ {'txn':>8} {'msgs':>8}")
    lines.append("─" * len(head))
    for level in result["levels"]:
        ex = level["latency_ms"]["response_to_tool_executed"]
        ap = level["latency_ms"]["turn_start_to_approval_event"]
        txn, msgs = level["ledger_transactions_per_rt"], level["messages_per_rt"]
        lines.append(
            f"{level['concurrency']:>8} {level['round_trips_per_second']:>6.1f}{' ' if level['steady_state'] else '*'}"
            f" │ {_f(ex['p50']):>6} {_f(ex['p90']):>6}"
            f" {_f(ex['p99']):>6} │ {_f(ap['p50']):>6} {_f(ap['p90']):>6} {_f(ap['p99']):>6} │ {txn:>6.2f}"
            f" {level['write_transactions_per_rt']:>6.2f} {msgs:>6.2f} │"
            f" {_f(pg / txn if pg and txn else None, 0):>8} {_f(mq / msgs if mq and msgs else None, 0):>8}")
    lines.append("")
    head = (f"{'sessions':>8} │ {'CPU ms per round trip':^47} │ {'driver':>6} │ {'deps ms/rt':^20} │ "
            f"{'cpu limit':>9}")
    lines.append(head)
    lines.append(f"{'':>8} │ {'ledger':>8} {'publisher':>9} {'model':>8} {'executor':>8} {'total':>8} │"
                 f" {'':>6} │ {'pg':>6} {'mq':>6} {'redis':>6} │ {'rt/s':>9}")
    lines.append("─" * len(head))
    for level in result["levels"]:
        cpu, deps = level["cpu_ms_per_rt"], level["dependency_cpu_ms_per_rt"]
        lines.append(
            f"{level['concurrency']:>8} │ {cpu.get('ledger', 0):>8.2f} {cpu.get('publisher', 0):>9.2f}"
            f" {cpu.get('model', 0):>8.2f} {cpu.get('executor', 0):>8.2f} {cpu['signoff_total']:>8.2f} │"
            f" {level['driver_cpu_ms_per_rt']:>6.2f} │ {deps.get('postgres', 0):>6.2f} {deps.get('beam.smp', 0):>6.2f}"
            f" {deps.get('redis-server', 0):>6.2f} │ {level['cpu_bound_round_trips_per_second']:>9.1f}")
    lines.append("python tool processes (the services' children; in neither total nor limit): " + ", ".join(
        f"{level['concurrency']} sessions {level.get('tool_process_cpu_ms_per_rt', 0):.2f} ms/rt"
        for level in result["levels"]))
    lines.append("")
    lines.append("ledger bytes per round trip (rows written, before retention): " + ", ".join(
        f"{level['concurrency']} sessions {level['ledger_bytes_per_rt']:,.0f}" for level in result["levels"]))
    long = result.get("long_session")
    if long:
        by_turn = long["ledger_bytes_per_step_by_turn"]
        lines.append(f"ledger bytes per model step across a {long['steps']}-step session, by turn of "
                     f"{long['steps_per_turn']}: {', '.join(f'{b:,}' for b in by_turn)} (outbox: "
                     f"{', '.join(f'{b:,}' for b in long['outbox_bytes_per_step_by_turn'])})")
    head = f"{'sessions':>8} │ {'SQL statements per round trip (+ commits)':^58} │ {'total':>12}"
    lines.append(head)
    lines.append("─" * len(head))
    for level in result["levels"]:
        sql = level.get("sql_per_rt") or {}
        parts = [f"{name} {v['statements']:.1f} + {v['commits']:.1f}" for name, v in sorted(sql.items())
                 if v.get("statements") or v.get("commits")]
        statements = sum(v.get("statements", 0) for v in sql.values())
        commits = sum(v.get("commits", 0) for v in sql.values())
        lines.append(f"{level['concurrency']:>8} │ {' · '.join(parts):<58} │ {statements:>5.1f} + {commits:>4.1f}")
    lines.append("")
    lines.append("txn/rt: ledger transitions (inbox rows); wtx/rt: all write transactions (ledger + executor claims + "
                 "publisher mark-sent);")
    if not all(level["steady_state"] for level in result["levels"]):
        lines.append("* the level was too short to reach steady state at this concurrency: rate over the whole level.")
    lines.append("pg limit = PostgreSQL floor ÷ txn/rt; mq limit = RabbitMQ floor ÷ msg/rt; cpu limit = CPUs ÷ "
                 "(Signoff + driver + deps CPU per rt).")
    lines.extend(_gateway_lines(result.get("gateway")))
    sqlite = result.get("sqlite")
    if sqlite and sqlite.get("levels"):
        lines.append("")
        lines.append("the embedded default (SQLite ledger, one writer, the publisher polling):")
        lines.append(f"{'sessions':>8} {'rt/s':>7} │ {'resp→executed ms':^20} │ {'CPU ms per round trip':^47} │ "
                     f"{'SQL/rt':>7}")
        lines.append(f"{'':>8} {'':>7} │ {'p50':>6} {'p90':>6} {'p99':>6} │ {'ledger':>8} {'publisher':>9} {'model':>8}"
                     f" {'executor':>8} {'total':>8} │ {'':>7}")
        for level in sqlite["levels"]:
            ex, cpu = level["latency_ms"]["response_to_tool_executed"], level["cpu_ms_per_rt"]
            statements = sum(v.get("statements", 0) for v in (level.get("sql_per_rt") or {}).values())
            lines.append(
                f"{level['concurrency']:>8} {level['round_trips_per_second']:>6.1f}"
                f"{' ' if level['steady_state'] else '*'} │ {_f(ex['p50']):>6} {_f(ex['p90']):>6} {_f(ex['p99']):>6} │"
                f" {cpu.get('ledger', 0):>8.2f} {cpu.get('publisher', 0):>9.2f} {cpu.get('model', 0):>8.2f}"
                f" {cpu.get('executor', 0):>8.2f} {cpu['signoff_total']:>8.2f} │ {statements:>7.1f}")
    recovery = result.get("recovery")
    if recovery and recovery.get("tries"):
        lines.append("")
        for mode, m in recovery["median"].items():
            tries = [t for t in recovery["tries"] if t["mode"] == mode]
            if mode == "failover":
                lines.append(f"recovery, failover ({len(tries)} tries, {tries[0]['sessions']} pending, median s from "
                             f"the kill): first executed {_f(m['first_executed'], 3)}, first closed "
                             f"{_f(m['first_closed'], 3)}, all closed {_f(m['all_closed'], 3)}")
                continue
            lines.append(f"recovery, {mode} restart ({len(tries)} tries, {tries[0]['sessions']} pending, median s "
                         f"from restart): ledger ready {_f(m['ledger_ready'], 3)}, publisher ready "
                         f"{_f(m['publisher_ready'], 3)}, first executed {_f(m['first_executed'], 3)}, first closed "
                         f"{_f(m['first_closed'], 3)}, all closed {_f(m['all_closed'], 3)}")
        lines.append("  warm: a fork of an interpreter with the services loaded, as `signoff up` restarts a service; "
                     "cold: a new interpreter, as a container restarts; failover: nothing restarts, a second ledger "
                     "and a standby publisher carry on")
    checks = result.get("checks") or {}
    lines.append("")
    if checks.get("passed") and not result["failures"]:
        lines.append(f"exactly once: OK ({checks['round_trips_completed']} round trips, {checks['tool_calls']} calls, "
                     f"{checks['claims']['n']} claims with attempts == 1, counter 1..{checks['counter_max']})")
    else:
        lines.append("FAILED:")
        for problem in result["failures"] + checks.get("violations", []):
            lines.append(f"  - {problem}")
    return "\n".join(lines)



def _gateway_lines(gateway: dict[str, Any] | None) -> list[str]:
    """Each gateway level beside the AMQP level run just before it (the median pair)."""
    if not gateway or not gateway.get("pairs"):
        return []
    lines = ["", "the gateway level (card from GET /v1/events, approval by POST .../decision), beside an AMQP level "
             "of the same concurrency run just before it (target: gateway CPU <= 3 ms/rt, rt/s >= 90 % of AMQP's):"]
    head = (f"{'sessions':>8} │ {'rt/s amqp':>9} {'gateway':>8} {'ratio':>6} │ {'gateway CPU ms/rt':>17} │ "
            f"{'other Signoff ms/rt':^19} │ {'start→card p50 ms':^19} │ {'turn p50 ms':^15} │ {'runs':>4}")
    lines.append(head)
    lines.append(f"{'':>8} │ {'':>9} {'':>8} {'':>6} │ {'':>17} │ {'amqp':>9} {'gateway':>9} │"
                 f" {'amqp':>9} {'gateway':>9} │ {'amqp':>7} {'gateway':>7} │ {'':>4}")
    lines.append("─" * len(head))
    for p in gateway["pairs"]:
        ratio = p["rate_ratio"]
        lines.append(
            f"{p['concurrency']:>8} │ {p['amqp_round_trips_per_second']:>9.1f}"
            f" {p['gateway_round_trips_per_second']:>8.1f}"
            f" {_f(ratio * 100 if ratio else None, 0):>5}% │ {p['median_gateway_cpu_ms_per_rt']:>17.2f} │"
            f" {p['signoff_cpu_ms_per_rt_amqp']:>9.2f} {p['signoff_cpu_ms_per_rt_gateway']:>9.2f} │"
            f" {_f(p['p50_to_card_ms_amqp']):>9} {_f(p['p50_to_card_ms_gateway']):>9} │"
            f" {_f(p['p50_turn_ms_amqp']):>7} {_f(p['p50_turn_ms_gateway']):>7} │ {p['runs']:>4}")
        lines.append(f"{'':>8}   gateway idle (stream open, no traffic): {_f(p.get('gateway_idle_cpu_ms_per_second'))}"
                     f" ms CPU/s; CPU per rt less idle: {_f(p.get('gateway_cpu_ms_per_rt_less_idle'), 2)} ms")
        if p["runs"] > 1:
            lines.append(f"{'':>8}   ratios by run: {', '.join(f'{r * 100:.0f} %' for r in p['rate_ratios'] if r)};"
                         f" gateway CPU ms/rt by run: {', '.join(f'{c:.2f}' for c in p['gateway_cpu_ms_per_rt_runs'])}")
    return lines
