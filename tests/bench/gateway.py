"""The gateway level: the same approval round trip, the card read from the HTTP
gateway's event stream (`GET /v1/events`, Server-Sent Events) and the approval sent
through it (`POST /v1/requests/{id}/decision`, logged in, with the CSRF token and an
Idempotency-Key), beside an AMQP level of the same concurrency run just before it, so
the two rates are compared under the same load of the machine.

The driver starts sessions and hears turn.completed on the AMQP channel as in every
level (adapter.py); only the two steps a person's browser would take go through the
gateway. One operator login (`bench`, who sees every event) and ONE event stream carry
every slot, as one watch queue does for the AMQP levels; cards are dispatched by
session id. The gateway is one more process in the CPU table (`gateway`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import time
import uuid
from typing import Any

import httpx

from services.gateway import users
from tests.bench.adapter import BenchFailure, ChannelAdapter, RoundTrip
from tests.gateway_client import PASSWORD, GatewayClient
from tests.harness import Deployment

USER = "bench"


def add_user(deployment: Deployment) -> None:
    """The bench's operator login (an operator sees every event), before the gateway starts."""
    keys = deployment.data_dir / "keys"
    users.add(keys, keys / "gateway" / "users.yaml", USER, PASSWORD, [], True)


class GatewayChannel:
    """A person's two steps through the gateway, on the AMQP adapter's sessions."""

    def __init__(self, adapter: ChannelAdapter, url: str, connections: int) -> None:
        self.adapter = adapter
        self.client = GatewayClient(url)
        # One keep-alive connection per slot, and one for the stream.
        self.client.http = httpx.AsyncClient(
            base_url=url, timeout=60,
            limits=httpx.Limits(max_connections=connections + 1, max_keepalive_connections=connections + 1))
        self.cards: dict[str, asyncio.Future] = {}
        self.card_seen: dict[str, float] = {}
        self.events_seen = 0
        self.retries = 0
        self.reader: asyncio.Task | None = None
        self.connected = asyncio.Event()
        self.last_event_id: str | None = None

    @property
    def completed(self) -> int:
        return self.adapter.completed

    async def login(self) -> None:
        answer = await self.client.login(USER)
        if answer.status_code != 200:
            raise BenchFailure(f"gateway login failed: {answer.status_code} {answer.text[:200]}")

    async def listen(self, last_event_id: str | None) -> None:
        """Open the event stream right after `last_event_id` (the newest event: without
        one the stream starts at the ledger's beginning, every earlier level's events)."""
        self.last_event_id = last_event_id
        self.connected.clear()
        self.reader = asyncio.create_task(self._read())
        await asyncio.wait_for(self.connected.wait(), 30)

    async def stop_listening(self) -> None:
        """Closed between levels, so the gateway does no work during the AMQP reference."""
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(BaseException):
                await self.reader
            self.reader = None

    async def close(self) -> None:
        await self.stop_listening()
        await self.client.http.aclose()

    async def _read(self) -> None:
        """The event stream, from now on (the newest id first: the stream starts at the
        ledger's beginning without one), kept open; reconnects with Last-Event-ID."""
        while True:
            headers = self.client.headers(csrf=False)
            if self.last_event_id:
                headers["Last-Event-ID"] = self.last_event_id
            try:
                async with self.client.http.stream("GET", "/v1/events", headers=headers,
                                                   timeout=httpx.Timeout(60, read=None)) as answer:
                    if answer.status_code != 200:
                        raise BenchFailure(f"event stream answered {answer.status_code}")
                    self.connected.set()
                    kind, data, event_id = "", [], None
                    async for line in answer.aiter_lines():
                        if line == "":
                            if data:
                                self._deliver(kind, "\n".join(data))
                            if event_id:
                                self.last_event_id = event_id
                            kind, data, event_id = "", [], None
                        elif line.startswith("data:"):
                            data.append(line[5:].lstrip(" "))
                        elif line.startswith("event:"):
                            kind = line[6:].strip()
                        elif line.startswith("id:"):
                            event_id = line[3:].strip()
            except (httpx.HTTPError, BenchFailure) as error:
                sys.stderr.write(f"\n[bench] gateway event stream: {type(error).__name__}: {error}; reconnecting\n")
                await asyncio.sleep(0.2)

    def _deliver(self, kind: str, data: str) -> None:
        self.events_seen += 1
        if kind != "approval.requested":
            return
        at = time.time()
        body = json.loads(data)
        future = self.cards.get(body.get("session_id"))
        if future is not None and not future.done():
            self.card_seen[body["session_id"]] = at
            future.set_result(body)

    async def round_trip(self) -> RoundTrip:
        adapter = self.adapter
        session_id = f"bench-{uuid.uuid4().hex}"
        waiter = adapter.watch(session_id)
        card = self.cards[session_id] = asyncio.get_running_loop().create_future()
        try:
            started = await adapter.start(session_id)
            try:
                requested = await asyncio.wait_for(card, adapter.timeout)
            except TimeoutError:
                raise BenchFailure(f"no card for {session_id} on the gateway's event stream") from None
            responded = time.time()
            key = secrets.token_hex(16)
            for attempt in range(3):
                try:
                    answer = await self.client.post(
                        f"/v1/requests/{requested['request_id']}/decision",
                        {"decision": "approve", "args_digest": requested["args_digest"]},
                        headers={"Idempotency-Key": key})
                    break
                except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
                    # A keep-alive connection the server closed as it was reused: the same key
                    # again, as any client does (it answers the same decision, sends nothing twice).
                    self.retries += 1
                    if attempt == 2:
                        raise
            deadline = time.time() + adapter.timeout
            while answer.status_code == 202 and time.time() < deadline:
                # The ledger took longer than the gateway waits (a loaded machine): poll its link.
                await asyncio.sleep(0.1)
                answer = await self.client.get(answer.json()["links"]["poll"])
            verdict = answer.json() if answer.status_code == 200 else None
            if answer.status_code != 200 or verdict is None or verdict.get("outcome") != "accepted":
                raise BenchFailure(f"decision on {requested['request_id']}: {answer.status_code} {answer.text[:300]}")
            adapter.sent["gateway.decision"] += 1
            await adapter.finished(waiter)
            return RoundTrip(session_id, requested["call_id"], started, self.card_seen[session_id], responded,
                             waiter.times.get("tool.closed"), waiter.times["turn.completed"])
        finally:
            adapter.unwatch(session_id)
            self.cards.pop(session_id, None)
            self.card_seen.pop(session_id, None)


def gateway_url(deployment: Deployment) -> str:
    return f"http://127.0.0.1:{deployment.gateway_ports['gateway']}"


def pair(amqp: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """The gateway level beside its AMQP reference: rates, their ratio, the gateway's CPU."""
    a, g = amqp["round_trips_per_second"], gateway["round_trips_per_second"]
    cpu = gateway["cpu_ms_per_rt"]
    return {
        "concurrency": gateway["concurrency"],
        "amqp_round_trips_per_second": a,
        "gateway_round_trips_per_second": g,
        "rate_ratio": g / a if a else None,
        "gateway_cpu_ms_per_rt": cpu.get("gateway", 0.0),
        "signoff_cpu_ms_per_rt_amqp": amqp["cpu_ms_per_rt"]["signoff_total"] - amqp["cpu_ms_per_rt"].get("gateway", 0),
        "signoff_cpu_ms_per_rt_gateway": cpu["signoff_total"] - cpu.get("gateway", 0.0),
        "p50_turn_ms_amqp": amqp["latency_ms"]["turn_start_to_turn_completed"].get("p50"),
        "p50_turn_ms_gateway": gateway["latency_ms"]["turn_start_to_turn_completed"].get("p50"),
        "p50_to_card_ms_amqp": amqp["latency_ms"]["turn_start_to_approval_event"].get("p50"),
        "p50_to_card_ms_gateway": gateway["latency_ms"]["turn_start_to_approval_event"].get("p50"),
        # What the gateway spends per second with the stream open and nothing happening (its
        # polls): under a slow machine's low rates this is much of its CPU per round trip.
        "gateway_idle_cpu_ms_per_second": gateway.get("gateway_idle_cpu_ms_per_second"),
        # Its CPU per round trip less what it spends idle in the same time: the per-request part.
        "gateway_cpu_ms_per_rt_less_idle": (cpu.get("gateway", 0.0) - (gateway.get("gateway_idle_cpu_ms_per_second")
                                            or 0.0) / g) if g else None,
        "meets_cpu_target": cpu.get("gateway", 0.0) <= 3.0,
        "meets_rate_target": bool(a) and g >= 0.9 * a,
    }


async def idle_cpu(deployment: Deployment, seconds: float = 5.0) -> float:
    """The gateway's CPU per second, in ms, with the stream open and no round trips: its
    threads' time on a CPU from /proc/<pid>/task/*/schedstat, in nanoseconds (utime and
    stime count 10 ms ticks: over a few seconds that is no finer than 2-3 ms per second,
    coarser than what is measured here)."""
    from tests.bench.cpu import process_cpu

    pid = deployment.processes["gateway"].pid
    before = on_cpu_seconds(pid)
    if before is None:  # no schedstat (a kernel without it): the ticks
        ticks = process_cpu(pid) or 0.0
        await asyncio.sleep(seconds)
        return ((process_cpu(pid) or 0.0) - ticks) / seconds * 1000
    await asyncio.sleep(seconds)
    return ((on_cpu_seconds(pid) or before) - before) / seconds * 1000


def on_cpu_seconds(pid: int) -> float | None:
    """The time the process's threads have run on a CPU, from schedstat (nanoseconds)."""
    import glob

    total = 0
    try:
        for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
            with open(path) as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9 if total else None


async def newest_event_id(ledger) -> str | None:
    """The stream's id of the newest committed event (reads.py `events_after`'s order)."""
    row = await ledger.db.fetchrow("SELECT coalesce(txid, 0) AS txid, id FROM outbox ORDER BY 1 DESC, 2 DESC LIMIT 1")
    return f"{row['txid']}.{row['id']}" if row else None


async def gateway_levels(ctx, args) -> dict[str, Any]:
    """Start the gateway; per concurrency, an AMQP level and then the gateway level right
    after it (the same load on the machine for both, within seconds), `args.gateway_runs`
    times; the median pair by rate ratio is the figure, every run kept."""
    from tests.bench.levels import Context, run_level
    from tests.bench.report import median_of

    deployment = ctx.deployment
    sys.stderr.write("[bench] the gateway level: starting the HTTP gateway\n")
    await asyncio.to_thread(deployment.start, "gateway")
    channel = GatewayChannel(ctx.adapter, gateway_url(deployment), max(args.gateway_levels))
    via_gateway = Context(deployment, channel, ctx.ledger, ctx.failures)  # type: ignore[arg-type]
    found: dict[str, Any] = {"runs": [], "pairs": []}
    try:
        await channel.login()
        await ctx.ledger.quiescent()
        await channel.listen(await newest_event_id(ctx.ledger))
        await run_level(via_gateway, min(4, max(args.gateway_levels)), args.warmup_seconds, "gateway warm-up")
        await channel.stop_listening()
        for concurrency in args.gateway_levels:
            pairs = []
            for attempt in range(args.gateway_runs):
                suffix = f" run {attempt + 1}/{args.gateway_runs}" if args.gateway_runs > 1 else ""
                amqp = await run_level(ctx, concurrency, args.seconds, f"amqp level {concurrency}{suffix}")
                await ctx.ledger.quiescent()
                await channel.listen(await newest_event_id(ctx.ledger))
                idle = await idle_cpu(deployment)
                profile = None
                if args.profile and attempt == 0 and concurrency == max(args.gateway_levels):
                    profile = args.profile / "gateway-level"
                try:
                    gateway = await run_level(via_gateway, concurrency, args.seconds,
                                              f"gateway level {concurrency}{suffix}", profile)
                finally:
                    await channel.stop_listening()
                gateway["gateway_idle_cpu_ms_per_second"] = idle
                gateway["decision_retries"] = channel.retries
                found["runs"].append({"concurrency": concurrency, "amqp": amqp, "gateway": gateway})
                pairs.append(pair(amqp, gateway))
            ratios = [p["rate_ratio"] for p in pairs]
            middle = sorted(pairs, key=lambda p: p["rate_ratio"] or 0)[len(pairs) // 2]
            found["pairs"].append({**middle, "runs": len(pairs),
                                   "rate_ratios": ratios,
                                   "gateway_cpu_ms_per_rt_runs": [p["gateway_cpu_ms_per_rt"] for p in pairs],
                                   "median_gateway_cpu_ms_per_rt": median_of(
                                       [p["gateway_cpu_ms_per_rt"] for p in pairs]),
                                   "median_rate_ratio": median_of(ratios)})
    finally:
        await channel.close()
    return found
