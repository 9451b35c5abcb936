"""The cluster of deploy/local/cluster_up.sh as the cluster tests drive it: three
RabbitMQ nodes and a PostgreSQL primary with its standby, and the faults done to
them (SIGKILL of a node's Erlang VM or of the primary's postmaster, a promotion, a
node cut off from its peers)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
from sqlalchemy import select

from shared.ledger.tables import ApprovalRequest, Session
from shared.messages import StartTurn, mint
from shared.settings import PROJECT_ROOT
from tests.chaos import Observed, listen, settle
from tests.harness import Deployment
from tests.invariants import Verdict, check_run
from tests.sink import Sink

BASE = Path(os.environ.get("SIGNOFF_CLUSTER_DIR", "/var/tmp/signoff-cluster"))
PG_VERSION = os.environ.get("SIGNOFF_CLUSTER_PG_VERSION") or sorted(os.listdir("/etc/postgresql"))[-1]
AMQP = "amqp://guest:guest@127.0.0.1:5681,127.0.0.1:5682,127.0.0.1:5683/"
ADMIN = "http://guest:guest@127.0.0.1:{port}/"
POSTGRES = "postgresql://postgres@127.0.0.1:5442,127.0.0.1:5443/test?target_session_attrs=read-write"
NODES = (1, 2, 3)


def up(port: int) -> bool:
    """Whether something listens on loopback `port`."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def node_name(n: int) -> str:
    return f"signoff{n}@localhost"


def cluster_up(sync: bool = True) -> None:
    """deploy/local/cluster_up.sh: starts what is down (a killed node), rebuilds a promoted standby."""
    env = dict(os.environ, SIGNOFF_CLUSTER_SYNC="1" if sync else "0")
    subprocess.run(["bash", str(PROJECT_ROOT / "deploy/local/cluster_up.sh")], check=True, env=env, timeout=600,
                   stdout=subprocess.DEVNULL)


def rabbitmqctl(n: int, *args: str, timeout: float = 60) -> str:
    return subprocess.run(["rabbitmqctl", "-q", "-n", node_name(n), *args], check=True, capture_output=True,
                          text=True, timeout=timeout).stdout


def management(n: int) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{15680 + n}/api", auth=("guest", "guest"), timeout=10)


def leaders(namespace: str, via: int) -> Counter[str]:
    """How many of the deployment's quorum queues each node leads."""
    with management(via) as api:
        queues = api.get("/queues", params={"columns": "name,leader,type"}).json()
    return Counter(q["leader"] for q in queues if q["name"].startswith(namespace) and q.get("type") == "quorum")


def connections_by_node(via: int) -> Counter[str]:
    with management(via) as api:
        return Counter(c["node"] for c in api.get("/connections", params={"columns": "node"}).json())


def kill_node(n: int) -> None:
    """SIGKILL of the node's Erlang VM: no goodbye to its peers or its clients."""
    os.kill(int((BASE / f"rabbit{n}" / "pid").read_text().strip()), signal.SIGKILL)


def deployment_connections_by_node(namespace: str, via: int) -> Counter[str]:
    """Where the deployment's own clients (its services' broker users `<namespace>.<service>`) are connected."""
    with management(via) as api:
        connections = api.get("/connections", params={"columns": "node,user"}).json()
    return Counter(c["node"] for c in connections if c.get("user", "").startswith(namespace + "."))


def _peers(n: int) -> str:
    return "[" + ", ".join(f"'{node_name(m)}'" for m in NODES if m != n) + "]"


def cut_off(n: int) -> None:
    """Node `n` cut off from the other two, its clients' TCP connections to it untouched:
    its Erlang distribution links dropped and kept from coming back (a cookie the peers do
    not have, for them alone: both sides refuse the handshake), as a network split would.
    The CLI still reaches it: rabbitmqctl is not one of the peers."""
    rabbitmqctl(n, "eval", f"[begin erlang:set_cookie(N, signoff_partitioned), erlang:disconnect_node(N) end"
                           f" || N <- {_peers(n)}], nodes().")


def heal(n: int) -> None:
    """The split healed: node `n` takes its peers' cookie again and reconnects."""
    rabbitmqctl(n, "eval", f"[begin erlang:set_cookie(N, erlang:get_cookie()), net_kernel:connect_node(N) end"
                           f" || N <- {_peers(n)}].")


def peers_seen(n: int) -> list[str]:
    """The nodes node `n` has distribution links to."""
    return [p.strip(" '") for p in rabbitmqctl(n, "eval", "nodes().").strip().strip("[]").split(",") if p.strip()]


def partitions(n: int) -> list[str]:
    """The nodes node `n` remembers a split from (pause_minority leaves none once healed)."""
    return [p.strip(" '") for p in rabbitmqctl(n, "eval", "rabbit_node_monitor:partitions().").strip().strip("[]")
            .split(",") if p.strip()]


def running(n: int) -> bool:
    """Whether the RabbitMQ application runs on node `n` (a node paused by pause_minority: no)."""
    return rabbitmqctl(n, "eval", "rabbit:is_running().").strip() == "true"


def postmaster(cluster: str) -> int:
    return int(Path(f"/var/lib/postgresql/{PG_VERSION}/{cluster}/postmaster.pid").read_text().split()[0])


def psql(port: int, sql: str, database: str = "postgres") -> str:
    return subprocess.run(["psql", "-X", "-q", "-t", "-A", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                           "-d", database, "-c", sql], check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()


def kill_primary(cluster: str = "signoff_primary") -> None:
    """SIGKILL of the primary's postmaster and every process of it (its backends too: a
    machine lost, not a postmaster alone), by their ids."""
    pm = postmaster(cluster)
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pm)], capture_output=True, text=True).stdout.split()
    for pid in [pm, *map(int, children)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wal_sender() -> int:
    """The primary's WAL sender process (to its one standby)."""
    return int(psql(5442, "select pid from pg_stat_replication"))


def promote_standby(cluster: str = "signoff_standby") -> None:
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, cluster, "promote"],
                   check=True, timeout=60)


def start_nodes() -> None:
    """Every RabbitMQ node that is down started again (cluster_up.sh's RabbitMQ part alone)."""
    subprocess.run(["bash", str(PROJECT_ROOT / "deploy/local/cluster_up.sh"), "--rabbitmq-only"], check=True,
                   timeout=600, stdout=subprocess.DEVNULL)


# The two PostgreSQL servers by port. cluster_up.sh makes 5442 the primary; a failover
# (fail_over_database) swaps them, and another swaps them back.
PG_CLUSTERS = {5442: "signoff_primary", 5443: "signoff_standby"}


def in_recovery(port: int) -> bool | None:
    """Whether the server on `port` is a standby (None: it does not answer)."""
    try:
        return psql(port, "select pg_is_in_recovery()") == "t"
    except (subprocess.SubprocessError, OSError):
        return None


def primary_port() -> int:
    return next(port for port in PG_CLUSTERS if in_recovery(port) is False)


def rebuild_standby(port: int, primary: int, sync: bool = True) -> None:
    """The server on `port` (lost, or stopped) made again as a streaming standby of the
    primary on `primary`, from a base backup; with `sync`, the primary's synchronous one."""
    cluster = PG_CLUSTERS[port]
    data = Path(f"/var/lib/postgresql/{PG_VERSION}/{cluster}")
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, cluster, "stop", "-m", "immediate"],
                   capture_output=True, timeout=60)
    subprocess.run(["rm", "-rf", str(data)], check=True)
    subprocess.run(["install", "-d", "-o", "postgres", "-g", "postgres", "-m", "700", str(data)], check=True)
    bin_dir = f"/usr/lib/postgresql/{PG_VERSION}/bin"
    conninfo = f"host=127.0.0.1 port={primary} user=postgres application_name={cluster}"
    subprocess.run(["su", "postgres", "-c",
                    f"{bin_dir}/pg_basebackup -h 127.0.0.1 -p {primary} -U postgres -D '{data}' -X stream -c fast"
                    f" && touch '{data}/standby.signal'"
                    f" && sed -i '/synchronous_standby_names/d;/primary_conninfo/d' '{data}/postgresql.auto.conf'"
                    f" && echo \"primary_conninfo = '{conninfo}'\" >> '{data}/postgresql.auto.conf'"],
                   check=True, timeout=300, capture_output=True)
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, cluster, "start"], check=True,
                   timeout=120)
    deadline = time.monotonic() + 60
    while psql(primary, f"select count(*) from pg_stat_replication where application_name = '{cluster}'") != "1":
        if time.monotonic() > deadline:
            raise AssertionError(f"{cluster} does not stream from the primary on {primary}")
        time.sleep(0.5)
    psql(primary, f"alter system set synchronous_standby_names = '{cluster if sync else ''}'")
    psql(primary, "select pg_reload_conf()")


def fail_over_database(sync: bool = True) -> tuple[float, float]:
    """The primary lost (every process SIGKILLed), its standby promoted, and the lost one
    rebuilt as the new primary's standby, so another failover can follow. (Seconds to
    promote, seconds to rebuild.)"""
    old = primary_port()
    new = next(port for port in PG_CLUSTERS if port != old)
    started = time.monotonic()
    kill_primary(PG_CLUSTERS[old])
    promote_standby(PG_CLUSTERS[new])
    while in_recovery(new) is not False:
        time.sleep(0.1)
    promoted = time.monotonic() - started
    rebuild_standby(old, new, sync)
    return promoted, time.monotonic() - started - promoted


def restore_database_roles() -> None:
    """After failovers: the primary back on 5442 and its standby on 5443, as cluster_up.sh
    expects (nothing should be running on them: the old primary is stopped, not lost)."""
    if primary_port() == 5442:
        return
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, PG_CLUSTERS[5443], "stop", "-m",
                    "fast"], check=True, timeout=120)
    promote_standby(PG_CLUSTERS[5442])
    while in_recovery(5442) is not False:
        time.sleep(0.1)
    rebuild_standby(5443, 5442)


def cluster_deployment(tmp_path: Path, sink: Sink) -> Deployment:
    deployment = Deployment(store="postgres", data_dir=tmp_path, rabbitmq_url=AMQP,
                            rabbitmq_admin_url=ADMIN.format(port=15681), postgres_url=POSTGRES)
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="cluster")
    return deployment


class Flow:
    """`sessions` session loops, each running turns with one approval after another
    until told to stop, with the time of every turn completed (the pause a fault
    makes is the longest gap between completions)."""

    def __init__(self, console, sessions: int, patience: float = 180) -> None:
        self.patience = patience
        self.console = console
        self.observed = Observed()
        self.stop = asyncio.Event()
        self.completions: list[float] = []
        self.unfinished = 0
        self.rng = random.Random(24)
        self.listener = asyncio.create_task(listen(console, self.observed))
        self.loops = [asyncio.create_task(self._loop()) for _ in range(sessions)]

    async def _loop(self) -> None:
        # The ledger, not the event stream, says what is pending and what finished: a
        # console's watch queue lives on one node and its events die with that node
        # (what a person would see again by `signoff status`), the ledger's rows do not.
        while not self.stop.is_set():
            session_id = mint("ses")
            await self._send(lambda: self.console.send(StartTurn(session_id=session_id, text="cluster")))
            answered: set[str] = set()
            deadline = time.monotonic() + self.patience
            while True:
                if time.monotonic() > deadline:
                    self.unfinished += 1
                    return
                await asyncio.sleep(0.5)
                try:
                    async with self.console.ledger.sessions() as db:
                        pending = (await db.execute(select(ApprovalRequest.id, ApprovalRequest.call_id).where(
                            ApprovalRequest.session_id == session_id, ApprovalRequest.status == "pending"))).all()
                        status = await db.scalar(select(Session.status).where(Session.id == session_id))
                except Exception:
                    continue  # the primary is being replaced: ask again
                for request_id, call_id in pending:
                    self.observed.requests_by_call[call_id].add(request_id)
                    if request_id not in answered:
                        answered.add(request_id)
                        await asyncio.sleep(self.rng.uniform(0, 0.3))
                        await self._send(lambda r=request_id: self._approve(r))
                if status == "idle" and answered:
                    self.observed.completed_turns += 1
                    self.completions.append(time.monotonic())
                    break

    async def _approve(self, request_id: str) -> None:
        try:
            await self.console.respond(request_id, "approve", "", "", "chaos")
        except SystemExit:
            # The console's "no approval request": a failover forgot a request this loop saw
            # pending (asynchronous replication). The end-of-run check names it; go on.
            pass

    async def _send(self, send) -> None:
        # The client's own publish may meet the dropped node: it retries as a person would.
        for _ in range(120):
            try:
                await send()
                return
            except Exception:
                await asyncio.sleep(0.5)
        raise AssertionError("the console could not send for a minute")

    def longest_pause(self, after: float) -> float:
        times = sorted(t for t in self.completions if t >= after - 5)
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    async def finish(self, deployment: Deployment, sink: Sink) -> Verdict:
        self.stop.set()
        done, pending = await asyncio.wait(self.loops, timeout=240)
        await settle(deployment, 90)
        self.listener.cancel()
        unfinished = self.unfinished + len(pending)
        return await check_run(self.console, queue_timeout=30, shown=self.observed.requests_by_call,
                               sink_requests=sink.requests,
                               seen=[f"{unfinished} session(s) never finished their turn"] if unfinished else [])
