"""Run Signoff's services as real processes against real RabbitMQ, Redis and
PostgreSQL, each deployment isolated by its own namespace (queues, exchanges,
Redis keys) and its own database schema or SQLite file.

Used by the integration and crash tests, `make chaos` and `make bench`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from shared.ledger.database import create_engine, sessionmaker
from services.operations.console import Console
from services.gateway import users as gateway_users
from services.operations.warm_start import SERVICES as SERVICE_MODULES
from shared import keyring
from shared.amqp_hosts import connect_robust
from shared.provisioning import (
    provision_broker,
    provision_database,
    provision_redis,
    remove_broker_identities,
    remove_database_identities,
    remove_redis_identities,
)
from shared.messages import EVENT
from shared.settings import PROJECT_ROOT, Settings
from tests.invariants import queues_left

RABBITMQ_URL = os.environ.get("SIGNOFF_TEST_RABBITMQ_URL", "amqp://guest:guest@localhost:5672/")
REDIS_URL = os.environ.get("SIGNOFF_TEST_REDIS_URL", "redis://localhost:6379/0")
# RabbitMQ's management API: `signoff setup` makes each deployment's broker users through it.
RABBITMQ_ADMIN_URL = os.environ.get("SIGNOFF_TEST_RABBITMQ_ADMIN_URL", "http://guest:guest@localhost:15672/")
POSTGRES_URL = os.environ.get("SIGNOFF_TEST_POSTGRES_URL", "postgresql://postgres@localhost:5432/test")
# The services a deployment starts by default; the HTTP gateway only when a test names it.
SERVICES = tuple(s for s in SERVICE_MODULES if s != "gateway")


def log_records(path: Path) -> list[dict[str, Any]]:
    """A service log's lines as the JSON objects they are (shared/logs.py), each
    start's `--- start` marker (the harness's own) left out."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(errors="replace").splitlines()
            if line.strip() and not line.startswith("--- start ")]


class ServiceUnreachable(AssertionError):
    """A test needs a service it cannot reach: fail loudly, never skip."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def require_services(*, postgres: bool = True) -> None:
    wanted = [("RabbitMQ", RABBITMQ_URL, "SIGNOFF_TEST_RABBITMQ_URL"), ("Redis", REDIS_URL, "SIGNOFF_TEST_REDIS_URL")]
    if postgres:
        wanted.append(("PostgreSQL", POSTGRES_URL, "SIGNOFF_TEST_POSTGRES_URL"))
    for name, url, variable in wanted:
        # A cluster's URL names several hosts (tests/cluster): its first is asked.
        parts = urlsplit(url.replace(urlsplit(url).netloc, urlsplit(url).netloc.split(",")[0], 1))
        try:
            socket.create_connection((parts.hostname, parts.port), timeout=3).close()
        except OSError as error:
            raise ServiceUnreachable(
                f"{name} is not reachable at {parts.hostname}:{parts.port} ({error}). Start it (`.ci/run` does) "
                f"or point {variable} at one."
            ) from None


class WarmChild:
    """A service forked by `WarmStarts`, with the part of `subprocess.Popen` the tests use."""

    def __init__(self, starts: WarmStarts, request_id: int, pid: int) -> None:
        self._starts = starts
        self._id = request_id
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self._starts.exits.get(self._id)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._starts.exited:
            if not self._starts.exited.wait_for(lambda: self._id in self._starts.exits, timeout):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self._starts.exits[self._id]

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # gone, and its exit not read yet
                os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WarmStarts:
    """One `python -m services.operations.warm_start` per test process, shared by its deployments:
    each service starts as a fork of an interpreter that has imported them all, as
    `signoff up` starts them, instead of paying imports for every start and restart."""

    _shared: WarmStarts | None = None
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls) -> WarmStarts:
        with cls._shared_lock:
            if cls._shared is None or cls._shared.process.poll() is not None:
                cls._shared = cls()
            return cls._shared

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.operations.warm_start"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            cwd=PROJECT_ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")},
        )
        self.exits: dict[int, int] = {}
        self.exited = threading.Condition()
        self._replies: dict[int, dict] = {}
        self._lock = threading.Lock()
        ready = json.loads(self.process.stdout.readline() or b"{}")
        if "ready" not in ready:
            raise AssertionError(f"services.operations.warm_start did not start (exit {self.process.wait(10)})")
        threading.Thread(target=self._read, name="warm-starts", daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            reply = json.loads(line)
            with self.exited:
                if "code" in reply:
                    self.exits[reply["id"]] = reply["code"]
                else:
                    self._replies[reply["id"]] = reply
                self.exited.notify_all()

    def start(self, service: str, env: dict[str, str], log: Path) -> WarmChild:
        with self._lock:
            self.process.stdin.write(json.dumps({"service": service, "env": env, "log": str(log),
                                                 "cwd": str(PROJECT_ROOT)}).encode() + b"\n")
            self.process.stdin.flush()
            with self.exited:
                if not self.exited.wait_for(lambda: self._replies, 30):
                    raise AssertionError("services.operations.warm_start did not answer a start request")
                request_id, reply = self._replies.popitem()
        if "error" in reply:
            raise AssertionError(f"services.operations.warm_start could not start {service}: {reply['error']}")
        return WarmChild(self, request_id, reply["pid"])


# Whom the tests' CLI channel may assert: the people the tests act as through it, and
# the OS user running them (the CLI's default `--as`), as `signoff setup
# --cli-principal …` registers them; never anyone at all. Not carol
# (tests/integration/test_channels.py: the CLI refuses `--as carol`). "unknown" is
# the name a RespondToApproval or CancelTurn carries when it names nobody.
CLI_PRINCIPALS = [
    keyring.os_user(),
    "tester", "t", "a", "alice", "bob", "sam", "ann", "lee", "mallory", "channel-a", "channel-b",
    "chaos", "fuzzer", "bench", "unknown",
]


@dataclass
class Deployment:
    """One isolated Signoff deployment: its settings, its processes, its data."""

    store: str  # "sqlite" or "postgres"
    data_dir: Path
    namespace: str = field(default_factory=lambda: "t" + uuid.uuid4().hex[:12])
    tools_file: Path = PROJECT_ROOT / "tests" / "fixtures" / "tools.yaml"
    script_file: Path = PROJECT_ROOT / "tests" / "fixtures" / "script.yaml"
    extra_env: dict[str, str] = field(default_factory=dict)
    # A metrics port per process name (`publisher`, `publisher#2`); others serve none.
    metrics_ports: dict[str, int] = field(default_factory=dict)
    # The HTTP port of each gateway process (`gateway`, `gateway#2`), chosen when it first starts.
    gateway_ports: dict[str, int] = field(default_factory=dict)
    # The port `signoff up` gives its gateway in this deployment.
    gateway_port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen | WarmChild] = field(default_factory=dict)
    # True: every start is a new interpreter (`python -m services.operations.cli run`), as a
    # container starts; False: a fork of a preloaded one (`WarmStarts`), as `signoff up` starts.
    cold: bool = False
    # Where it runs: the machine's services unless a test points it elsewhere (a cluster's
    # nodes, tests/cluster: several hosts in one URL).
    rabbitmq_url: str = RABBITMQ_URL
    rabbitmq_admin_url: str = RABBITMQ_ADMIN_URL
    postgres_url: str = POSTGRES_URL
    _set_up: bool = False

    @property
    def schema(self) -> str | None:
        return self.namespace if self.store == "postgres" else None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
        env.update(
            SIGNOFF_NAMESPACE=self.namespace,
            SIGNOFF_DATA_DIR=str(self.data_dir),
            SIGNOFF_RABBITMQ_URL=self.rabbitmq_url,
            SIGNOFF_RABBITMQ_ADMIN_URL=self.rabbitmq_admin_url,
            SIGNOFF_REDIS_URL=REDIS_URL,
            SIGNOFF_TOOLS_FILE=str(self.tools_file),
            SIGNOFF_SCRIPT_FILE=str(self.script_file),
            SIGNOFF_CLAIM_LEASE_SECONDS="1.5",
            # No metrics port unless a test asks for one: parallel deployments would share 9464.
            SIGNOFF_METRICS_PORT="0",
            # A gateway's port of its own (`signoff up` starts one): parallel deployments would share 8080.
            SIGNOFF_GATEWAY_PORT=str(self.gateway_port),
            PYTHONUNBUFFERED="1",
        )
        if self.store == "postgres":
            env.update(SIGNOFF_DATABASE_URL=self.postgres_url, SIGNOFF_DATABASE_SCHEMA=self.namespace)
        # The python tools' fork server on or off, as whoever runs the tests says (an A/B of the bench).
        if "SIGNOFF_TOOL_FORK_SERVER" in os.environ:
            env["SIGNOFF_TOOL_FORK_SERVER"] = os.environ["SIGNOFF_TOOL_FORK_SERVER"]
        # The fixture tools' credential (tests/fixtures/tools.yaml): an unset `${env:…}` is an error.
        env.setdefault("SINK_TOKEN", "sink-token-for-tests")
        env.update(self.extra_env)
        return env

    @property
    def settings(self) -> Settings:
        env = self.env()
        return Settings(**{k[len("SIGNOFF_"):].lower(): v for k, v in env.items() if k.startswith("SIGNOFF_")})

    # --- processes ---------------------------------------------------------

    def log_path(self, service: str) -> Path:
        return self.data_dir / "logs" / f"{service}.log"

    def start(self, *names: str, faults: str = "") -> None:
        """Start services by name and wait until each is ready. A name is a service,
        or `<service>#<n>` for another replica of it (its own log)."""
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.setup()
        started = []
        for name in names or SERVICES:
            service = name.split("#")[0]
            env = self.env()
            if faults:
                env["SIGNOFF_FAULTS"] = faults
            if name in self.metrics_ports:
                env["SIGNOFF_METRICS_PORT"] = str(self.metrics_ports[name])
            if service == "gateway":
                env["SIGNOFF_GATEWAY_PORT"] = str(self.gateway_ports.setdefault(name, free_port()))
            with open(self.log_path(name), "ab") as log:
                log.write(f"--- start {time.time():.3f} faults={faults!r}\n".encode())
                log.flush()
                if self.cold:
                    self.processes[name] = subprocess.Popen(
                        [sys.executable, "-m", "services.operations.cli", "run", service],
                        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT,
                    )
                else:
                    self.processes[name] = WarmStarts.shared().start(service, env, self.log_path(name))
            started.append(name)
        for name in started:
            self.wait_ready(name)

    def setup(self) -> None:
        """What `signoff setup` makes for a deployment, made once: its keys, its broker
        users (one per service and channel) and its topology. Services and consoles
        then connect as their own identities, never as the broker's administrator."""
        if self._set_up:
            return
        # The default keys folder, read without the settings: a test may give bad settings on purpose.
        keyring.create(self.data_dir / "keys", {"cli": CLI_PRINCIPALS})
        # The gateway's channel, registered for its users (none until a test adds some), and its session key.
        gateway_users.register_channel(self.data_dir / "keys", self.data_dir / "keys" / "gateway" / "users.yaml")
        gateway_users.make_session_key(self.data_dir / "keys")
        channels = sorted(keyring.channels(self.data_dir / "keys"))
        with ThreadPoolExecutor(1) as thread:  # callers may be inside an event loop
            thread.submit(asyncio.run, provision_broker(self.settings, channels)).result()
            thread.submit(asyncio.run, provision_redis(self.settings)).result()
            thread.submit(asyncio.run, provision_database(self.settings)).result()
        self._set_up = True

    def wait_ready(self, name: str, timeout: float = 30.0) -> None:
        """Until the process logs that it is ready, or (a standby publisher) standing by."""
        service = name.split("#")[0]
        deadline = time.monotonic() + timeout
        process = self.processes[name]
        while time.monotonic() < deadline:
            lines = self.log_path(name).read_text(errors="replace").split("--- start ")[-1]
            if f"{service} ready" in lines or f"{service} standing by" in lines:
                return
            if process.poll() is not None:
                raise AssertionError(f"{name} exited with {process.returncode} during start-up:\n{lines[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"{name} not ready after {timeout}s:\n{self.log_path(name).read_text()[-3000:]}")

    def kill(self, service: str) -> None:
        """SIGKILL: no cleanup, no goodbye."""
        process = self.processes.pop(service)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(10)

    def wait_exit(self, service: str, timeout: float = 30.0) -> int:
        """Wait for a process that is expected to kill itself at a fault point."""
        process = self.processes.pop(service)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError(f"{service} did not reach its fault point within {timeout}s:\n"
                                 f"{self.log_path(service).read_text()[-3000:]}") from None

    def start_with_fault(self, service: str, faults: str) -> None:
        """All four services, with `faults` armed in one of them."""
        self.start(*(s for s in SERVICES if s != service))
        self.start(service, faults=faults)

    async def replace_after_fault(self, service: str) -> None:
        """Wait for the armed service to kill itself, then start its replacement on the same data."""
        await asyncio.to_thread(self.wait_exit, service)
        self.start(service)

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.processes.clear()

    # --- fault points --------------------------------------------------------

    def fault_reached(self, point: str) -> bool:
        return (self.data_dir / "faults" / f"{point}.reached").exists()

    def release(self, point: str) -> None:
        (self.data_dir / "faults").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "faults" / f"{point}.release").touch()

    # --- clients -------------------------------------------------------------

    @asynccontextmanager
    async def console(self, identity: str | None = None):
        """A console as the CLI's channel, or as `identity` (a service: what it may do)."""
        self.setup()
        async with Console(self.settings, identity) as console:
            yield console

    @asynccontextmanager
    async def observer(self):
        """A channel as the broker's administrator, for a test that watches what no Signoff
        identity may read (e.g. a copy of every `tool.execute` bound to the commands)."""
        self.setup()
        connection = await connect_robust(self.rabbitmq_url)
        async with connection:
            yield await connection.channel()

    @asynccontextmanager
    async def engine(self, identity: str):
        """An engine on the ledger as one service's own role (a test acting as that service)."""
        engine = create_engine(self.settings, identity=identity, pool_size=2)
        try:
            yield engine
        finally:
            await engine.dispose()

    @asynccontextmanager
    async def ledger(self):
        """A read connection to the ledger, for assertions."""
        engine = create_engine(self.settings, identity="console", pool_size=2)
        try:
            yield sessionmaker(engine)
        finally:
            await engine.dispose()

    async def forget_redis(self) -> int:
        """Delete every Redis key of this deployment (a flush that spares the other tests); how many went."""
        async with Redis.from_url(REDIS_URL) as redis:
            keys = [k async for k in redis.scan_iter(f"{self.namespace}:*")]
            if keys:
                await redis.delete(*keys)
            return len(keys)

    async def cleanup(self) -> None:
        self.stop_all()
        connection = await connect_robust(self.rabbitmq_url)
        async with connection:
            channel = await connection.channel()
            settings = self.settings
            from shared.topology import Topology

            topology = Topology(settings.namespace)
            for name in topology.all_queue_names():
                await channel.queue_delete(name)
            for name in topology.all_exchange_names():
                await channel.exchange_delete(name)
        await self.forget_redis()
        # The ACL users `signoff setup` makes (also when a test ran `signoff setup` itself).
        await remove_redis_identities(self.settings)
        if self._set_up:
            await remove_broker_identities(self.settings, sorted(keyring.channels(self.data_dir / "keys")))
        if self.store == "postgres":
            engine = create_async_engine(Settings(database_url=self.postgres_url).ledger_url)
            async with engine.begin() as conn:
                await conn.execute(text(f'DROP SCHEMA IF EXISTS "{self.namespace}" CASCADE'))
            await engine.dispose()
            if self._set_up:
                await remove_database_identities(self.settings)


async def next_event(queue: aio_pika.abc.AbstractQueue, *types: str, timeout: float = 20.0) -> Any:
    """The next event of one of these types on a watch queue (others are passed over)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raw = await queue.get(no_ack=True, fail=False)
        if raw is None:
            await asyncio.sleep(0.02)
            continue
        event = EVENT.validate_json(raw.body)
        if not types or event.type in types:
            return event
    raise AssertionError(f"no {' or '.join(types) or 'event'} within {timeout}s")


async def drain_events(queue: aio_pika.abc.AbstractQueue, settle: float = 0.3):
    """Every event left on a watch queue, after letting late ones arrive for `settle` seconds."""
    await asyncio.sleep(settle)
    while (raw := await queue.get(no_ack=True, fail=False)) is not None:
        yield EVENT.validate_json(raw.body)


async def eventually(check, timeout: float = 20.0, interval: float = 0.05):
    """Poll an async check until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")


async def start_and_wait_for_approval(console, session_id: str, text: str = "go"):
    """Start a turn and return (the session's event queue, its first approval.requested)."""
    from shared.messages import StartTurn

    events = await console.watch(session_id)
    await console.send(StartTurn(session_id=session_id, text=text))
    return events, await next_event(events, "approval.requested")


async def rows(deployment: Deployment, model, **where) -> list:
    """All ledger rows of one table matching column == value filters."""
    from sqlalchemy import select

    async with deployment.ledger() as sessions, sessions() as db:
        query = select(model)
        for column, value in where.items():
            query = query.where(getattr(model, column) == value)
        return list((await db.scalars(query)).all())


async def assert_nothing_left_in_any_queue(console, namespace: str, timeout: float = 10.0) -> None:
    """No message lost or stuck: every queue of the deployment drains, nothing is dead-lettered
    (the queue part of tests/invariants.py's end-of-run check)."""
    counts = await queues_left(console, namespace, timeout)
    assert not counts, f"messages left behind: {counts}"
