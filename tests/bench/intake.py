"""The intake level of `make bench`: a program's whole round trip through the gateway,
file → a person approves → claim → report (a `runs: caller` tool), in closed-loop slots.

    .venv/bin/python -m tests.bench.intake [--store postgres] [--slots 8] [--seconds 20]

A fresh deployment (the four services and a gateway), one API token (the program) and
one operator login (the approver, through `POST /v1/requests/{id}/decision`). Each slot
files a call with a new call id, long-polls it until approved, claims it and reports its
result, then starts again. Printed: round trips per second (over the level's window,
after a warm-up), p50 and p99 of a round trip, and Signoff's CPU per round trip (the
services' and the gateway's own /proc CPU over the window, in ms; PostgreSQL, RabbitMQ
and Redis apart, machine-wide, so they count other work of a shared machine too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from services.gateway import programs, users
from tests.bench.cpu import dependency_cpu, dependency_cpu_delta, service_cpu
from tests.gateway_client import PASSWORD, GatewayClient
from tests.harness import Deployment, require_services
from tests.integration.test_intake import ORIGIN, intake_tools

# The tools' `send_refund` names alice its approver (tests/integration/test_intake.py).
APPROVER = "alice"


async def round_trip(bot: httpx.AsyncClient, approver: GatewayClient) -> float:
    started = time.monotonic()
    call_id = "bench-" + secrets.token_hex(8)
    body = {"tool": "send_refund", "origin": ORIGIN, "call_id": call_id,
            "arguments": {"customer": "c-1", "amount": 1}}
    filed = (await bot.post("/v1/calls", json=body)).json()
    decided = await approver.decide(filed["request_id"], "approve")
    if decided.status_code != 200:
        raise RuntimeError(f"approval refused: {decided.text[:300]}")
    shown = filed
    while shown["status"] != "approved":
        shown = (await bot.get(f"/v1/calls/{filed['id']}", params={"wait": 30})).json()
    claim = (await bot.post(f"/v1/calls/{filed['id']}/claim", json={})).json()
    closed = await bot.post(f"/v1/calls/{filed['id']}/result",
                            json={"claim_token": claim["claim_token"], "outcome": "output", "output": {"ok": True}})
    if closed.json().get("status") != "closed":
        raise RuntimeError(f"report refused: {closed.text[:300]}")
    return time.monotonic() - started


async def level(deployment: Deployment, token: str, url: str, slots: int, seconds: float, warmup: float) -> dict:
    limits = httpx.Limits(max_connections=slots * 2, max_keepalive_connections=slots * 2)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits,
                                 headers={"Authorization": f"Bearer {token}"}) as bot, GatewayClient(url) as approver:
        approver.http = httpx.AsyncClient(base_url=url, timeout=60, limits=limits)
        await approver.login(APPROVER)
        times: list[tuple[float, float]] = []
        ends = time.monotonic() + warmup + seconds

        async def slot() -> None:
            while time.monotonic() < ends:
                took = await round_trip(bot, approver)
                times.append((time.monotonic(), took))

        window_starts = time.monotonic() + warmup
        marks: dict[str, Any] = {}

        async def mark() -> None:
            await asyncio.sleep(warmup)
            marks["cpu"], marks["deps"] = service_cpu(deployment), dependency_cpu()

        await asyncio.gather(mark(), *(slot() for _ in range(slots)))
        window_ends = time.monotonic()
        cpu, deps = service_cpu(deployment), dependency_cpu()
    counted = [took for at, took in times if at >= window_starts]
    spent = {name: cpu[name] - marks["cpu"].get(name, 0.0) for name in cpu}
    per = max(1, len(counted))
    ordered = sorted(counted) or [0.0]
    return {
        "store": deployment.store,
        "slots": slots,
        "round_trips": len(counted),
        "round_trips_per_second": round(len(counted) / max(0.001, window_ends - window_starts), 2),
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 1),
        "signoff_cpu_ms_per_round_trip": round(sum(spent.values()) / per * 1000, 2),
        "cpu_ms_per_round_trip": {name: round(value / per * 1000, 2) for name, value in sorted(spent.items())},
        "dependencies_cpu_ms_per_round_trip": {
            name: round(value / per * 1000, 2)
            for name, value in dependency_cpu_delta(marks["deps"], deps).items()
        },
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    args = parser.parse_args(argv)
    require_services(postgres=args.store == "postgres")
    base = Path(tempfile.mkdtemp(prefix="signoff-bench-intake-"))
    deployment = Deployment(store=args.store, data_dir=base / "data",
                            extra_env={"SIGNOFF_GATEWAY_DECISION_WAIT_SECONDS": "30"})
    deployment.data_dir.mkdir(parents=True)
    deployment.tools_file = intake_tools(deployment)
    keys = deployment.data_dir / "keys"
    try:
        users.add(keys, keys / "gateway" / "users.yaml", APPROVER, PASSWORD, [], False)
        token, _ = programs.create(keys, keys / "gateway" / "users.yaml", "agent", frozenset({"calls:file"}))
        deployment.start()
        deployment.start("gateway")
        url = f"http://127.0.0.1:{deployment.gateway_ports['gateway']}"
        found = asyncio.run(level(deployment, token, url, args.slots, args.seconds, args.warmup))
    finally:
        deployment.stop_all()
        asyncio.run(deployment.cleanup())
    print("intake level (file → approve → claim → report, through the gateway):")
    print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
