"""`signoff status`: one table an on-call engineer reads: each service replica (ready or
not, from its /readyz), each queue of the deployment, the relay's lag, the approvals
waiting and the oldest, and the parked messages. Exits 1 when something needs a person,
naming it.

Scripts gate on its exit code, so what it judges is read as of now: each queue's ready
messages and consumers from a passive declare over AMQP (the broker's own answer, at
once), never from the management API, whose statistics are sampled every few seconds
(after every /readyz answered 200 it still said "nobody consumes"; after `dead-letters
drop` it still named the dropped message). A passive declare needs no permission on the
queue, so it is made as the operator's console identity (`<ns>.console`, which may read
only the dead letters). Only the unacknowledged counts, which nothing but the management
API knows, come from it: shown, marked as sampled, and never judged.

Past one machine it also says where each service is connected: the RabbitMQ node of each
of its connections (the management API lists them by broker user, `<ns>.<service>`) and
the PostgreSQL server of each of its sessions (each host of SIGNOFF_DATABASE_URL asked,
primary or standby, for the sessions of the deployment's roles). Shown, never judged: a
service that lost its node or its primary is judged by its queues and its /readyz."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import aiormq
import httpx

from services.operations.warm_start import SERVICES
from shared.amqp_hosts import hosts_of, split_hosts
from shared.catalogue import load_catalogue
from shared.ledger.backlog import Backlog
from shared.ledger.status_reads import DatabaseServer, has_database_servers, measured_backlog
from shared.messages import now
from shared.observability import know_tools
from shared.on_screen import FIELD_CHARS, TEXT_CHARS, visible
from shared.provisioning import DATABASE_IDENTITIES, management_api, vhost_in_path
from shared.redaction import redact_text
from shared.runtime import address
from shared.settings import Settings
from shared.topology import OPERATOR, Topology

# Past these, a person should look (the alert rules use the same: deploy/prometheus/alerts.yml).
RELAY_LAG_LIMIT = 30.0
EXPIRY_WARNING = 900.0


@dataclass
class Replica:
    name: str
    url: str
    ready: bool
    said: str


@dataclass
class QueueState:
    name: str
    # As the broker answered a passive declare, at once.
    ready: int
    # The management API's sample, seconds old (None: it could not be read); shown, never judged.
    unacked: int | None
    consumers: int
    exists: bool = True


@dataclass
class Placement:
    """Where each identity (a service, the console, a channel) has its connections: how many
    on each RabbitMQ node and on each PostgreSQL server (`host:port`)."""

    broker: dict[str, Counter[str]] = field(default_factory=dict)
    broker_error: str | None = None
    database: dict[str, Counter[str]] = field(default_factory=dict)
    # Each server of SIGNOFF_DATABASE_URL: "primary", "standby", or why it did not answer.
    servers: dict[str, str] = field(default_factory=dict)


@dataclass
class Status:
    replicas: list[Replica] = field(default_factory=list)
    queues: list[QueueState] = field(default_factory=list)
    queues_error: str | None = None
    # Why the management API's unacknowledged counts are missing (shown, not a problem of the deployment).
    unacked_error: str | None = None
    backlog: Backlog | None = None
    backlog_error: str | None = None
    placement: Placement = field(default_factory=Placement)
    at: datetime = field(default_factory=now)

    def needs_a_person(self, topology: Topology) -> list[str]:
        """What is wrong, one sentence each; empty: nothing."""
        # What a replica answered and what an error says come from outside: shown, never obeyed.
        wrong = [
            f"{visible(r.name, FIELD_CHARS)} at {visible(r.url, FIELD_CHARS)} is not ready "
            f"({visible(r.said, FIELD_CHARS)})"
            for r in self.replicas
            if not r.ready
        ]
        if self.queues_error:
            wrong.append(f"the queues cannot be read: {visible(self.queues_error, TEXT_CHARS)}")
        for queue in self.queues:
            if not queue.exists:
                wrong.append(f"{queue.name} does not exist: run `signoff setup`")
            elif queue.name == topology.dead_letter_queue.name:
                # Its ready count alone: nobody consumes the dead letters, and the unacknowledged
                # count is a sample that would name a message dropped seconds ago.
                if queue.ready:
                    wrong.append(f"{queue.ready} parked message(s): see `signoff dead-letters`")
            elif queue.consumers == 0:
                wrong.append(f"nobody consumes {queue.name} ({queue.ready} waiting)")
        if self.backlog_error:
            wrong.append(f"the ledger cannot be read: {visible(self.backlog_error, TEXT_CHARS)}")
        if self.backlog is not None:
            lag = _age(self.backlog.oldest_unsent, self.at)
            if lag > RELAY_LAG_LIMIT:
                wrong.append(f"the relay is {lag:.0f} s behind ({self.backlog.unsent} unsent): is a publisher leading?")
            for tool, (_, _, soonest) in sorted(self.backlog.pending.items()):
                if soonest is not None and (soonest - self.at).total_seconds() < EXPIRY_WARNING:
                    left = (soonest - self.at).total_seconds()
                    wrong.append(
                        f"an approval for {visible(tool, FIELD_CHARS)} expires in {left:.0f} s: "
                        "answer it (`signoff pending`)"
                    )
        return wrong


def _age(since: datetime | None, at: datetime) -> float:
    return max(0.0, (at - since).total_seconds()) if since else 0.0


def targets(settings: Settings) -> list[tuple[str, str]]:
    """(name, base URL) of each replica to ask: SIGNOFF_STATUS_TARGETS, else the four of `signoff up`."""
    if settings.status_targets.strip():
        pairs = []
        for item in settings.status_targets.split(","):
            name, _, url = item.strip().partition("=")
            pairs.append((name.strip(), url.strip().rstrip("/")))
        return pairs
    if not settings.metrics_port:
        return []
    host = "127.0.0.1" if settings.metrics_host in ("0.0.0.0", "") else settings.metrics_host
    return [(service, f"http://{host}:{settings.metrics_port + i}") for i, service in enumerate(SERVICES)]


async def _replica(http: httpx.AsyncClient, name: str, url: str) -> Replica:
    try:
        answer = await http.get(f"{url}/readyz", timeout=3)
    except httpx.HTTPError as error:
        return Replica(name, url, False, f"no answer: {type(error).__name__}")
    failing = [line.split(":")[0] for line in answer.text.splitlines() if line.endswith("not ready")]
    said = "ready" if answer.status_code == 200 else f"{', '.join(failing) or answer.status_code} not ready"
    return Replica(name, url, answer.status_code == 200, said)


async def _connect_to_any(url: str) -> aio_pika.abc.AbstractConnection:
    """A connection to the first node of `url` that takes one (a cluster's URL names several)."""
    urls = split_hosts(url)
    for one in urls[:-1]:
        try:
            return await aio_pika.connect(one)
        except Exception:  # that node is down: the next
            continue
    return await aio_pika.connect(urls[-1])


async def _queues(settings: Settings, topology: Topology) -> list[QueueState]:
    """Each queue's ready messages and consumers as the broker answers a passive declare
    now, made as the operator's console identity (a passive declare needs no permission)."""
    url, user = settings.amqp_login(OPERATOR)
    try:
        connection = await _connect_to_any(url)
    except Exception as error:
        raise ConnectionError(
            f"cannot connect to RabbitMQ at {address(settings.rabbitmq_url)} as {user} "
            f"({type(error).__name__}: {redact_text(str(error))})"
        ) from None
    states = []
    async with connection:
        # The protocol's own channel: aio-pika may answer a repeated declare from its cache.
        channel = await (await connection.channel()).get_underlay_channel()
        for name in topology.all_queue_names():
            try:
                declared = await channel.queue_declare(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                states.append(QueueState(name, 0, None, 0, exists=False))
                # The broker closed the channel that asked.
                channel = await (await connection.channel()).get_underlay_channel()
                continue
            states.append(QueueState(name, declared.message_count or 0, None, declared.consumer_count or 0))
    return states


async def _unacked(settings: Settings) -> dict[str, int]:
    """Each queue's unacknowledged messages, which only the management API knows: its
    statistics, sampled every few seconds."""
    async with management_api(settings) as api:
        answer = await api.get(f"/queues/{vhost_in_path(settings)}", params={"columns": "name,messages_unacknowledged"})
        answer.raise_for_status()
    return {q["name"]: int(q.get("messages_unacknowledged") or 0) for q in answer.json()}


async def _broker_nodes(settings: Settings) -> dict[str, Counter[str]]:
    """Each broker user's connections by RabbitMQ node, as the management API lists them
    (the deployment's users, `<ns>.<identity>`, shown as `<identity>`)."""
    async with management_api(settings) as api:
        answer = await api.get("/connections", params={"columns": "user,node,vhost"})
        answer.raise_for_status()
    vhost = urlsplit(settings.rabbitmq_url).path.lstrip("/") or "/"
    prefix = f"{settings.namespace}."
    nodes: dict[str, Counter[str]] = {}
    for connection in answer.json():
        user = str(connection.get("user") or "")
        if connection.get("vhost", vhost) != vhost or not (user.startswith(prefix) or not settings.broker_identities):
            continue
        identity = user[len(prefix) :] if user.startswith(prefix) else user
        nodes.setdefault(identity, Counter())[str(connection.get("node") or "?")] += 1
    return nodes


def database_servers(settings: Settings) -> list[tuple[str, Settings]]:
    """(`host:port`, settings naming that server alone) for each host of SIGNOFF_DATABASE_URL,
    a standby too (target_session_attrs dropped: it is asked, not written to)."""
    url = settings.database_url
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    query = "&".join(q for q in parts.query.split("&") if q and not q.startswith("target_session_attrs="))
    servers = []
    for host in hosts_of(url):
        one = urlunsplit((parts.scheme, f"{userinfo}{at}{host}", parts.path, query, parts.fragment))
        shown = host if ":" in host.rsplit("]", 1)[-1] else f"{host}:5432"
        servers.append((shown, settings.model_copy(update={"database_url": one})))
    return servers


async def _database_sessions(settings: Settings) -> tuple[dict[str, Counter[str]], dict[str, str]]:
    """Each service's sessions by PostgreSQL server, and whether each server is the
    primary or a standby (shared/ledger/status_reads.py asks them)."""
    roles = {settings.database_role(name): name for name in DATABASE_IDENTITIES}
    sessions: dict[str, Counter[str]] = {}
    servers: dict[str, str] = {}
    for shown, one in database_servers(settings):
        server = DatabaseServer(one)
        try:
            standby, rows = await server.sessions()
            servers[shown] = "standby" if standby else "primary"
            for user, count in rows:
                if user in roles:
                    sessions.setdefault(roles[user], Counter())[shown] += count
        except (Exception, SystemExit) as error:  # a server down is what this is for: shown
            servers[shown] = f"no answer: {type(error).__name__}"
        finally:
            await server.close()
    return sessions, servers


async def placement(settings: Settings) -> Placement:
    """Where each service is connected (shown, never judged)."""
    where = Placement()
    try:
        where.broker = await _broker_nodes(settings)
    except (httpx.HTTPError, ValueError) as error:
        where.broker_error = f"{type(error).__name__}: {redact_text(str(error))}"
    if has_database_servers(settings) and settings.database_identities:
        where.database, where.servers = await _database_sessions(settings)
    return where


async def replicas_of(name: str, url: str) -> list[tuple[str, str]]:
    """Every replica behind a target: a host name that resolves to several addresses (a
    compose service, a Kubernetes headless service) is asked at each of them."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host == "localhost" or not host or host.replace(".", "").isdigit() or ":" in host:
        return [(name, url)]
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, parts.port, type=socket.SOCK_STREAM)
    except OSError:
        return [(name, url)]
    addresses = sorted({info[4][0] for info in found})
    if len(addresses) <= 1:
        return [(name, url)]
    return [(name, urlunsplit((parts.scheme, f"{a}:{parts.port}", "", "", ""))) for a in addresses]


async def gather(settings: Settings) -> Status:
    status = Status()
    topology = Topology(settings.namespace, settings.delivery_limit)
    asked = [pair for n, u in targets(settings) for pair in await replicas_of(n, u)]
    async with httpx.AsyncClient() as http:
        status.replicas = list(await asyncio.gather(*(_replica(http, n, u) for n, u in asked)))
    try:
        status.queues = await _queues(settings, topology)
    except ConnectionError as error:
        status.queues_error = str(error)
    except (aiormq.exceptions.AMQPError, OSError, SystemExit) as error:  # SystemExit: no console password
        status.queues_error = f"{type(error).__name__}: {redact_text(str(error))}"
    if status.queues:
        try:
            unacked = await _unacked(settings)
            for queue in status.queues:
                queue.unacked = unacked.get(queue.name) if queue.exists else None
        except (httpx.HTTPError, ValueError) as error:
            status.unacked_error = f"{type(error).__name__}: {redact_text(str(error))}"
    try:
        know_tools([spec.name for spec in load_catalogue(settings.tools_file).tools])
        status.backlog = await measured_backlog(settings, within=10)
    except (Exception, SystemExit) as error:
        status.backlog_error = f"{type(error).__name__}: {error}"
    status.placement = await placement(settings)
    status.at = now()
    return status


def _duration(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def render(status: Status, topology: Topology) -> str:
    lines = [f"{'SERVICE':<20} {'ADDRESS':<28} STATE"]
    if not status.replicas:
        lines.append("(none asked: SIGNOFF_METRICS_PORT is 0 and SIGNOFF_STATUS_TARGETS is empty)")
    for r in status.replicas:
        state = "ready" if r.ready else "NOT READY: " + visible(r.said, FIELD_CHARS)
        lines.append(f"{visible(r.name, FIELD_CHARS):<20} {visible(r.url, FIELD_CHARS):<28} {state}")
    lines.append("")
    lines.append(f"{'QUEUE':<44} {'READY':>7} {'UNACKED':>8} {'CONSUMERS':>10}")
    if status.queues_error:
        lines.append(f"(cannot read the queues: {visible(status.queues_error, TEXT_CHARS)})")
    for q in status.queues:
        unacked = "?" if q.unacked is None else str(q.unacked)
        if not q.exists:
            lines.append(f"{visible(q.name, FIELD_CHARS):<44} (does not exist)")
            continue
        lines.append(f"{visible(q.name, FIELD_CHARS):<44} {q.ready:>7} {unacked:>8} {q.consumers:>10}")
    if status.queues:
        lines.append(
            "(READY and CONSUMERS as the broker answers now; UNACKED is the management API's sample, seconds old"
            + (f": cannot be read: {visible(status.unacked_error, TEXT_CHARS)})" if status.unacked_error else ")")
        )
    lines.extend(["", *render_placement(status.placement)])
    lines.append("")
    backlog = status.backlog
    if backlog is None:
        lines.append(f"ledger: cannot be read ({visible(status.backlog_error, TEXT_CHARS)})")
    else:
        lag = _age(backlog.oldest_unsent, status.at)
        lines.append(f"relay lag            {_duration(lag)} ({backlog.unsent} outbox rows unsent)")
        waiting = sum(n for n, _, _ in backlog.pending.values())
        oldest = min((o for _, o, _ in backlog.pending.values() if o), default=None)
        soonest = min((s for _, _, s in backlog.pending.values() if s), default=None)
        said = f"approvals waiting    {waiting}"
        if oldest is not None:
            said += f" (oldest {_duration(_age(oldest, status.at))}"
            said += f", first expires in {_duration((soonest - status.at).total_seconds())})" if soonest else ")"
        lines.append(said)
        for tool, (n, _, _) in sorted(backlog.pending.items()):
            lines.append(f"  {visible(tool, FIELD_CHARS):<18} {n}")
        undelivered = sum(n for n, _ in backlog.undelivered.values())
        if undelivered:
            lines.append(f"hooks undelivered    {undelivered}")
    parked = next((q for q in status.queues if q.name == topology.dead_letter_queue.name), None)
    if parked is not None:
        lines.append(f"dead letters         {parked.ready}")
    wrong = status.needs_a_person(topology)
    lines.append("")
    if wrong:
        lines.append("NEEDS A PERSON:")
        lines.extend(f"  - {w}" for w in wrong)
    else:
        lines.append("all well")
    return "\n".join(lines)


def _counts(counts: Counter[str]) -> str:
    return ", ".join(f"{visible(where, FIELD_CHARS)} ({n})" for where, n in sorted(counts.items()))


def render_placement(where: Placement) -> list[str]:
    """Each identity's RabbitMQ nodes and PostgreSQL servers, with its connections on each."""
    lines = [f"{'CONNECTED':<20} {'RABBITMQ NODE (CONNECTIONS)':<48} POSTGRESQL SERVER (SESSIONS)"]
    for identity in sorted(set(where.broker) | set(where.database)):
        broker = _counts(where.broker.get(identity, Counter())) or "-"
        database = _counts(where.database.get(identity, Counter())) or "-"
        lines.append(f"{visible(identity, FIELD_CHARS):<20} {broker:<48} {database}")
    if where.broker_error:
        lines.append(f"(cannot read the broker's connections: {visible(where.broker_error, TEXT_CHARS)})")
    if where.servers:
        servers = ", ".join(f"{visible(s, FIELD_CHARS)} {visible(v, FIELD_CHARS)}" for s, v in where.servers.items())
        lines.append(f"(database servers: {servers})")
    return lines


async def show_status(settings: Settings) -> int:
    status = await gather(settings)
    topology = Topology(settings.namespace, settings.delivery_limit)
    print(render(status, topology))
    return 1 if status.needs_a_person(topology) else 0
