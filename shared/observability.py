"""What an operator can watch: every service's metrics, and whether it lives and is
ready, on one HTTP port per process (`SIGNOFF_METRICS_PORT`, 0: none).

- `/metrics`: Prometheus text format, the metrics below plus the process collectors
  (CPU, memory, open files).
- `/healthz`: 200 while the process serves at all (a liveness probe).
- `/readyz`: 200 when every readiness check passes (its broker connection open and
  consuming, its database reachable, a publisher leading or standing by), else 503;
  the body names each check. A scrape of `/metrics` runs the same checks and sets
  `signoff_ready`, so an alert sees what a probe sees.

Names follow Prometheus conventions: `signoff_` prefix, `_total` counters, `_seconds`
histograms, and bounded labels only (message type, tool, outcome, reason, provider,
hook): never a session, request or message id. A label taken from input passes
through `bounded` first. The metric objects are made at import (they open nothing);
the server is started by the service, after its settings are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from errno import EADDRINUSE

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest

log = logging.getLogger("signoff.observability")

# The exit code of a process that cannot start as configured (sysexits.h's EX_CONFIG):
# a restart would fail the same way, so `signoff up` says why once and stops, instead
# of restarting it forever.
CANNOT_START = 78


class CannotListen(SystemExit):
    """A port this process must listen on cannot be had: most often another process (a
    second deployment on this machine) holds it. Exits with CANNOT_START, saying which
    setting moves it."""

    def __init__(self, service: str, what: str, host: str, port: int, error: OSError, setting: str) -> None:
        self.exit_code = CANNOT_START
        held = " (another process holds it: a second deployment on this machine?)" if error.errno == EADDRINUSE else ""
        super().__init__(
            f"signoff: {service} cannot listen on {host}:{port} for {what}: {error.strerror or error}{held}; "
            f"set {setting} to a free port"
        )


# --- messages (every consumer and sender) -------------------------------------------
MESSAGES_CONSUMED = Counter(
    "signoff_messages_consumed_total",
    "Inbound messages taken from a queue, by what became of them: handled, "
    "dead_lettered (parked with a reason) or retried (nacked for redelivery)",
    ["consumer", "type", "outcome"],
)
MESSAGE_HANDLING = Histogram(
    "signoff_message_handling_seconds",
    "Time from taking an inbound message to acking it (validation, handler, ack)",
    ["consumer", "type"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
MESSAGES_DEAD_LETTERED = Counter(
    "signoff_messages_dead_lettered_total",
    "Messages a consumer parked on the dead-letter exchange, by the reason it gave",
    ["consumer", "type", "reason"],
)
MESSAGES_PUBLISHED = Counter(
    "signoff_messages_published_total", "Messages published and confirmed by RabbitMQ, by type", ["type"]
)

# --- the ledger -------------------------------------------------------------------
LEDGER_TRANSACTION = Histogram(
    "signoff_ledger_transaction_seconds",
    "Duration of one ledger transition (lock, inbox, decide, commit), by inbound message type",
    ["type"],
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
MESSAGES_REJECTED = Counter(
    "signoff_messages_rejected_total",
    "Messages the ledger refused with message.rejected, by type and reason code",
    ["type", "reason"],
)
APPROVALS_REQUESTED = Counter(
    "signoff_approval_requests_total", "Approval requests committed (a person was asked), by tool", ["tool"]
)
APPROVAL_OUTCOMES = Counter(
    "signoff_approval_decisions_total",
    "Approval requests closed, by outcome: approved, denied, answered, expired, cancelled",
    ["tool", "outcome"],
)
TIME_TO_DECISION = Histogram(
    "signoff_approval_decision_seconds",
    "Time from an approval request being committed to its decision (approve, deny or respond)",
    ["tool"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600),
)
CALLS_CLOSED = Counter(
    "signoff_tool_calls_closed_total",
    "Tool calls closed by the ledger, by tool and outcome (output, error, denied, answered, expired, "
    "cancelled, outcome_unknown, ...)",
    ["tool", "outcome"],
)
ESCALATIONS = Counter(
    "signoff_approval_escalations_total",
    "Approval requests nobody decided in their tool's escalation time, announced again to its "
    "escalation group (once each), by tool",
    ["tool"],
)
TURNS_BOUNDED = Counter(
    "signoff_turns_bounded_total",
    "Turns the ledger ended because they reached their bound (step_limit), by which bound: steps or tokens",
    ["bound"],
)
DEAD_LETTERS = Counter(
    "signoff_dead_letters_total",
    "Parked messages the ledger was told about (every one, whoever parked it), by type (unreadable: "
    "not a message at all) and reason",
    ["type", "reason"],
)
APPROVALS_PENDING = Gauge(
    "signoff_approval_requests_pending",
    "Approval requests waiting for a person, by tool (the ledger's timer)",
    ["tool"],
)
OLDEST_PENDING = Gauge(
    "signoff_approval_requests_oldest_pending_age_seconds",
    "Age of the oldest approval request still waiting, by tool",
    ["tool"],
)
SOONEST_EXPIRY = Gauge(
    "signoff_approval_requests_next_expiry_seconds",
    "Seconds until the first waiting approval request of a tool expires (negative: past due)",
    ["tool"],
)
OUTBOX_UNSENT = Gauge("signoff_outbox_unsent", "Committed outbox rows not yet relayed")
RELAY_LAG = Gauge("signoff_relay_lag_seconds", "Age of the oldest committed outbox row not yet relayed (0: none)")
HOOKS_UNDELIVERED = Gauge(
    "signoff_hook_deliveries_undelivered", "Hook deliveries neither delivered nor given up, by hook", ["hook"]
)
OLDEST_UNDELIVERED = Gauge(
    "signoff_hook_deliveries_oldest_undelivered_age_seconds",
    "Age of the oldest hook delivery neither delivered nor given up, by hook",
    ["hook"],
)
BACKLOG_MEASURED = Gauge(
    "signoff_backlog_measured_timestamp_seconds", "When the ledger last measured the gauges above (Unix time)"
)

# --- the publisher ----------------------------------------------------------------
PUBLISHER_LEADING = Gauge("signoff_publisher_leading", "1 while this publisher leads the relay, 0 while it stands by")
RELAY_BATCH = Histogram(
    "signoff_relay_batch_size",
    "Outbox rows relayed per batch",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000),
)
HOOK_DELIVERIES = Counter(
    "signoff_hook_deliveries_total",
    "Hook delivery attempts, by hook and outcome: delivered, failed (retried later), given_up",
    ["hook", "outcome"],
)

# --- model-step -------------------------------------------------------------------
PROVIDER_ATTEMPTS = Counter(
    "signoff_provider_attempts_total",
    "Model provider calls, by provider and status (completed, failed, abandoned)",
    ["provider", "status"],
)
PROVIDER_TOKENS = Counter(
    "signoff_provider_tokens_total",
    "Tokens the providers reported, by provider and direction",
    ["provider", "direction"],
)

# --- tool-executor ----------------------------------------------------------------
EXECUTIONS = Counter(
    "signoff_tool_executions_total",
    "Tool calls the executor reported, by tool and outcome (output, error, outcome_unknown, ...)",
    ["tool", "outcome"],
)
EXECUTION_TIME = Histogram(
    "signoff_tool_execution_seconds",
    "Time the executor spent on a tool.execute (claim, run, record, report), by tool",
    ["tool"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)

READY = Gauge("signoff_ready", "1 when every readiness check of this process passes (as /readyz says)")

_LABEL = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_known_tools: set[str] = set()


def know_tools(names: set[str] | list[str]) -> None:
    """The tools of the catalogue: the only tool names that become label values."""
    _known_tools.update(names)


def known_tools() -> set[str]:
    return set(_known_tools)


def tool_label(name: str | None) -> str:
    """A tool name as a label: the model may propose any name, the catalogue bounds them."""
    return name if name in _known_tools else "unknown"


def bounded(value: str | None, allowed: set[str] | None = None) -> str:
    """A label value from input: kept if allowed (or, without a set, if it reads like a code), else `other`."""
    if value is None or value == "":
        return "unknown"
    if allowed is not None:
        return value if value in allowed else "other"
    return value if _LABEL.match(value) else "other"


# Counts that must only move once the transaction that implies them has committed.
_on_commit: ContextVar[list[Callable[[], None]] | None] = ContextVar("signoff_on_commit", default=None)


def when_committed(count: Callable[[], None]) -> None:
    """Count `count` once the ledger transaction at hand commits (dropped if it does not)."""
    pending = _on_commit.get()
    if pending is not None:
        pending.append(count)


@contextlib.contextmanager
def counting_on_commit() -> Iterator[Callable[[], None]]:
    """Collect `when_committed` counts inside; call the yielded function right after COMMIT."""
    pending: list[Callable[[], None]] = []
    token = _on_commit.set(pending)

    def committed() -> None:
        for count in pending:
            count()
        pending.clear()

    try:
        yield committed
    finally:
        _on_commit.reset(token)


Check = Callable[[], Awaitable[bool]]


class Health:
    """The readiness checks of one process, and the HTTP server that answers for them."""

    CHECK_TIMEOUT = 2.0

    def __init__(self, service: str) -> None:
        self.service = service
        self.checks: dict[str, Check] = {}
        self.server: asyncio.Server | None = None

    def add(self, name: str, check: Check) -> None:
        self.checks[name] = check

    async def readiness(self) -> dict[str, bool]:
        async def run(check: Check) -> bool:
            try:
                return bool(await asyncio.wait_for(check(), self.CHECK_TIMEOUT))
            except Exception:
                return False

        names = list(self.checks)
        results = await asyncio.gather(*(run(self.checks[n]) for n in names))
        verdicts = dict(zip(names, results, strict=True))
        READY.set(1 if verdicts and all(verdicts.values()) else 0)
        return verdicts

    async def start(self, host: str, port: int) -> None:
        if port == 0 or self.server is not None:
            return
        try:
            self.server = await asyncio.start_server(self._answer, host, port)
        except OSError as error:
            raise CannotListen(self.service, "metrics", host, port, error, "SIGNOFF_METRICS_PORT (0: none)") from None
        log.info("%s metrics on http://%s:%d/metrics (/healthz, /readyz)", self.service, host, port)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 1)
            self.server = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)).strip():
                pass  # headers: nothing here needs them
            parts = request.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) > 1 else ""
            status, content_type, body = await self._route(path)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except Exception as error:  # a bad client must never hurt the service
            log.debug("metrics request failed: %r", error)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _route(self, path: str) -> tuple[str, str, bytes]:
        text = "text/plain; charset=utf-8"
        if path == "/healthz":
            return "200 OK", text, b"ok\n"
        if path == "/readyz":
            verdicts = await self.readiness()
            body = "".join(f"{name}: {'ok' if ok else 'not ready'}\n" for name, ok in verdicts.items()).encode()
            ready = bool(verdicts) and all(verdicts.values())
            return ("200 OK" if ready else "503 Service Unavailable"), text, body
        if path == "/metrics":
            await self.readiness()
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(REGISTRY)
        return "404 Not Found", text, b"/metrics, /healthz or /readyz\n"


class timed:
    """`with timed(histogram.labels(...)):` observes the block's wall time, also when it raises."""

    __slots__ = ("histogram", "started")

    def __init__(self, histogram) -> None:
        self.histogram = histogram

    def __enter__(self) -> timed:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        self.histogram.observe(time.perf_counter() - self.started)
