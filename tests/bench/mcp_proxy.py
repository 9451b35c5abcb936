"""The MCP proxy's level of `make bench`: what `signoff mcp-proxy` adds to an allowed
call, and how many `ask` calls approved at once go through it per second.

    .venv/bin/python -m tests.bench.mcp_proxy [--store postgres] [--calls 200] [--slots 4]
                                              [--seconds 10] [--runs 1] [--quick]

Allowed: the `mcp` SDK's own client calls `read_file` of a real MCP server
(tests/fixtures/mcp_files_server.py, over stdio) directly, and through the proxy (over
stdio) fronting the same server; the calls alternate, one at a time, after a warm-up.
Printed: p50 and p99 of each, and the proxy's added latency (proxied minus direct, per
percentile). No Signoff service is involved: an allowed call passes straight through.

Ask: a fresh deployment (the four services and a gateway), the proxy filing with its
API token for the origin `mcp:desktop`; each slot calls an `ask` tool with new arguments
through the `mcp` client, and an approver program (alice's login) polls
`GET /v1/requests?status=pending&session_id=…` every 50 ms and approves the card through
`POST /v1/requests/{id}/decision` as soon as it appears; a round trip ends when the
client has the upstream's result. Two paths, one after the other:

- executor: `delete_file`, a catalogue tool with the executor's `mcp` implementation:
  Signoff's tool-executor runs it on the connection it keeps to the server (the server
  starts with the first call: a `--warmup` longer than that start leaves it out of the
  window) and records the result, which the proxy relays;
- proxy: `read_file` marked `ask` in the proxy's file and unknown to the catalogue (the
  origin's `unknown_tools`): the proxy claims the approved call and runs it on its own
  kept connection, then reports.

Exactly once: each path's upstream counter must equal the number of its approved asks
(every one of them answered, none an error); otherwise the exit status is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from services.gateway import programs
from tests.gateway_client import GatewayClient
from tests.harness import Deployment, require_services

ROOT = Path(__file__).resolve().parents[2]
FILES_SERVER = ROOT / "tests" / "fixtures" / "mcp_files_server.py"
WARMUP_CALLS = 20
# How often the approver looks for a slot's card.
POLL_SECONDS = 0.05
# A path's approved asks, the text of each result's run number.
RUN = re.compile(r"\(run (\d+)\)$")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _text(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


@contextlib.asynccontextmanager
async def stdio(command: list[str], env: dict[str, str]) -> AsyncIterator[Any]:
    from mcp import Client, StdioServerParameters

    parameters = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(ROOT))
    async with Client(parameters, read_timeout_seconds=120) as client:
        yield client


def proxy_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "services.operations.cli", "mcp-proxy", "--config", str(config)]


# --- allowed: the proxy's added latency ------------------------------------------------------


async def allowed_level(base: Path, calls: int) -> dict[str, Any]:
    counts = base / "allowed-counts"
    counts.mkdir(exist_ok=True)
    env = {**os.environ, "MCP_COUNT_DIR": str(counts)}
    config = base / "allowed-proxy.yaml"
    upstream = {
        "command": [sys.executable, str(FILES_SERVER)],
        "env": ["MCP_COUNT_DIR"],
        "tools": {"read_file": "allow"},
    }
    config.write_text(yaml.safe_dump({"upstreams": {"files": upstream}}))
    direct_times: list[float] = []
    proxied_times: list[float] = []
    async with stdio([sys.executable, str(FILES_SERVER)], env) as direct, stdio(proxy_command(config), env) as proxied:
        for index in range(WARMUP_CALLS + calls):
            for client, times in ((direct, direct_times), (proxied, proxied_times)):
                started = time.perf_counter()
                result = await client.call_tool("read_file", {"path": f"notes-{index}.txt"})
                took = time.perf_counter() - started
                if result.is_error:
                    raise RuntimeError(f"an allowed call failed: {_text(result)[:300]}")
                if index >= WARMUP_CALLS:
                    times.append(took)
    return {
        "calls": calls,
        "direct_p50_ms": ms(statistics.median(direct_times)),
        "direct_p99_ms": ms(percentile(direct_times, 0.99)),
        "proxied_p50_ms": ms(statistics.median(proxied_times)),
        "proxied_p99_ms": ms(percentile(proxied_times, 0.99)),
        "added_p50_ms": ms(statistics.median(proxied_times) - statistics.median(direct_times)),
        "added_p99_ms": ms(percentile(proxied_times, 0.99) - percentile(direct_times, 0.99)),
    }


# --- ask: approved at once ----------------------------------------------------------------------


class AskBench:
    """A deployment, the proxy's token and file, and alice's login for approving."""

    def __init__(self, store: str, base: Path) -> None:
        from tests.integration.test_gateway import add_people
        from tests.integration.test_mcp_proxy_ask import ORIGIN, PROGRAM, ask_tools

        self.base = base
        self.counts = base / "ask-counts"
        self.counts.mkdir()
        self.deployment = Deployment(store=store, data_dir=base / "data")
        self.deployment.data_dir.mkdir(parents=True)
        self.deployment.extra_env["MCP_COUNT_DIR"] = str(self.counts)
        self.deployment.tools_file = ask_tools(self.deployment, self.counts)
        add_people(self.deployment)
        keys = self.deployment.data_dir / "keys"
        token, _ = programs.create(keys, keys / "gateway" / "users.yaml", PROGRAM, programs.parse_scopes("calls:file"))
        self.origin, self.program = ORIGIN, PROGRAM
        self.env = {**os.environ, "MCP_COUNT_DIR": str(self.counts), "PROXY_TOKEN": token}
        self.config = base / "ask-proxy.yaml"

    def start(self) -> None:
        self.deployment.start()
        self.deployment.start("gateway")
        upstream = {
            "command": [sys.executable, str(FILES_SERVER)],
            "env": ["MCP_COUNT_DIR"],
            "timeout_seconds": 60,
            "tools": {"delete_file": "ask", "read_file": "ask"},
        }
        signoff = {"gateway": self.url, "token": "${env:PROXY_TOKEN}", "origin": self.origin, "wait_seconds": 60}
        self.config.write_text(yaml.safe_dump({"upstreams": {"files": upstream}, "signoff": signoff}))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.deployment.gateway_ports['gateway']}"

    def session_of(self, tool: str, arguments: dict[str, Any]) -> str:
        from services.mcp_proxy.config import call_id_for
        from shared.messages import filed_session_id

        return filed_session_id(f"bot:{self.program}", call_id_for(self.origin, tool, arguments, None))

    async def approve_when_shown(self, approver: GatewayClient, session_id: str) -> None:
        while True:
            answer = await approver.get("/v1/requests", params={"status": "pending", "session_id": session_id})
            if answer.status_code != 200:
                raise RuntimeError(f"the inbox refused the approver: {answer.text[:300]}")
            cards = answer.json()["requests"]
            if cards:
                decided = await approver.decide(cards[0]["id"], "approve")
                if decided.status_code != 200:
                    raise RuntimeError(f"approval refused: {decided.text[:300]}")
                return
            await asyncio.sleep(POLL_SECONDS)

    async def level(self, client: Any, tool: str, slots: int, seconds: float, warmup: float) -> dict[str, Any]:
        """Closed-loop slots for `seconds` after `warmup`; every approved ask's result kept."""
        results: list[str] = []
        times: list[tuple[float, float]] = []
        ends = time.monotonic() + warmup + seconds
        window_starts = time.monotonic() + warmup
        async with GatewayClient(self.url) as approver:
            login = await approver.login("alice")
            if login.status_code != 200:
                raise RuntimeError(f"alice cannot log in: {login.text[:300]}")

            async def slot(number: int) -> None:
                index = 0
                while time.monotonic() < ends:
                    index += 1
                    arguments = {"path": f"bench-{tool}-{number}-{index}-{time.monotonic_ns()}"}
                    started = time.monotonic()
                    call = asyncio.create_task(client.call_tool(tool, arguments))
                    await self.approve_when_shown(approver, self.session_of(tool, arguments))
                    result = await call
                    if result.is_error:
                        raise RuntimeError(f"an approved {tool} failed: {_text(result)[:300]}")
                    results.append(_text(result))
                    times.append((time.monotonic(), time.monotonic() - started))

            await asyncio.gather(*(slot(number) for number in range(slots)))
            window_ends = time.monotonic()
        counted = [took for at, took in times if at >= window_starts]
        return {
            "path": tool,
            "slots": slots,
            "approved_asks": len(results),
            "round_trips": len(counted),
            "round_trips_per_second": round(len(counted) / max(0.001, window_ends - window_starts), 2),
            "p50_ms": ms(statistics.median(counted)) if counted else None,
            "p99_ms": ms(percentile(counted, 0.99)) if counted else None,
            "runs_seen": sorted(int(m.group(1)) for m in map(RUN.search, results) if m),
        }

    def ran(self, tool: str) -> int:
        path = self.counts / f"{tool}.count"
        return int(path.read_text()) if path.exists() else 0


async def ask_levels(bench: AskBench, slots: int, seconds: float, warmup: float, runs: int) -> list[dict[str, Any]]:
    found = []
    async with stdio(proxy_command(bench.config), bench.env) as client:
        for tool in ("delete_file", "read_file"):
            for _ in range(runs):
                found.append(await bench.level(client, tool, slots, seconds, warmup))
    return found


def exactly_once(bench: AskBench, levels: list[dict[str, Any]]) -> list[str]:
    """What broke exactly once: per path, the upstream ran as many times as asks were
    approved, and the results name each run once."""
    broken = []
    for tool in ("delete_file", "read_file"):
        approved = sum(level["approved_asks"] for level in levels if level["path"] == tool)
        ran = bench.ran(tool)
        if ran != approved:
            broken.append(f"{tool}: the upstream ran {ran} times for {approved} approved asks")
        if tool == "delete_file":
            seen = sorted(run for level in levels if level["path"] == tool for run in level["runs_seen"])
            if seen != list(range(1, approved + 1)):
                broken.append(f"{tool}: the results name runs {seen[:20]}…, not 1..{approved} once each")
    return broken


def median_of(levels: list[dict[str, Any]], key: str) -> float | None:
    values = [level[key] for level in levels if level[key] is not None]
    return round(statistics.median(values), 2) if values else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--calls", type=int, default=200, help="allowed calls, each way, per run")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="each ask path's window, per run")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=1, help="runs of each; the figures are their median")
    parser.add_argument("--quick", action="store_true", help="50 allowed calls, 4 s windows, one run")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.seconds, args.warmup, args.runs = 50, 4.0, 1.0, 1
    require_services(postgres=args.store == "postgres")
    base = Path(tempfile.mkdtemp(prefix="signoff-bench-mcp-"))
    allowed = [asyncio.run(allowed_level(base, args.calls)) for _ in range(args.runs)]
    bench = AskBench(args.store, base)
    try:
        bench.start()
        levels = asyncio.run(ask_levels(bench, args.slots, args.seconds, args.warmup, args.runs))
    finally:
        bench.deployment.stop_all()
        asyncio.run(bench.deployment.cleanup())
    broken = exactly_once(bench, levels)
    summary = {
        "store": args.store,
        "runs": args.runs,
        "allowed": {key: median_of(allowed, key) for key in allowed[0] if key != "calls"} | {"calls": args.calls},
        "ask": {
            tool: {
                "slots": args.slots,
                **{
                    key: median_of([lv for lv in levels if lv["path"] == tool], key)
                    for key in ("round_trips_per_second", "p50_ms", "p99_ms")
                },
                "approved_asks": sum(lv["approved_asks"] for lv in levels if lv["path"] == tool),
                "upstream_ran": bench.ran(tool),
            }
            for tool in ("delete_file", "read_file")
        },
        "each_run": {"allowed": allowed, "ask": [{k: v for k, v in lv.items() if k != "runs_seen"} for lv in levels]},
        "exactly_once": broken or "held",
    }
    print("MCP proxy level (allowed: added latency; ask: approved at once, through the gateway):")
    print(json.dumps(summary, indent=2))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
