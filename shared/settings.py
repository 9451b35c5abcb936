"""Settings for every Signoff process, read from SIGNOFF_* environment variables.

Nothing here connects to anything: engines, pools and brokers are built from a
Settings object at start-up, never at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit, urlunsplit

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.ledger_urls import LedgerLogin

PROJECT_ROOT = Path(__file__).resolve().parent.parent
AMQP_HANDSHAKE_SECONDS = 10


class Settings(BaseSettings, LedgerLogin):
    # The ledger's URL, which database it is and each service's login to it: `LedgerLogin`
    # (shared/ledger_urls.py), where every database detail lives.
    model_config = SettingsConfigDict(env_prefix="SIGNOFF_", extra="ignore")

    # Where a deployment keeps its files: the SQLite ledger, keys, logs, tools' output.
    data_dir: Path = Path("data")
    # Empty means the embedded default: a SQLite file under data_dir.
    database_url: str = ""
    # PostgreSQL only: every table lives in this schema (tests use one each).
    database_schema: str | None = None
    # RabbitMQ: `signoff setup` connects with this URL's user (the administrator); each
    # service then connects as its own broker user (amqp_login), on its hosts.
    rabbitmq_url: str = "amqp://guest:guest@localhost:5672/"
    # Redis: `signoff setup` logs in with this URL's user (the administrator); each
    # service then logs in as its own Redis user, limited to its own keys and to this
    # URL's database index (redis_login).
    redis_url: str = "redis://localhost:6379/0"
    # Prefix of every exchange, queue and Redis key, so deployments and tests
    # can share one broker without seeing each other.
    namespace: str = "signoff"

    # The tool catalogue: each tool, its arguments, and who must approve it (deploy/tools.yaml).
    tools_file: Path = PROJECT_ROOT / "deploy" / "tools.yaml"
    # The model provider of new sessions: `scripted` (a script file, no model), `openai` or `anthropic`.
    provider: str = "scripted"
    # The scripted provider's replies (deploy/script.yaml).
    script_file: Path = PROJECT_ROOT / "deploy" / "script.yaml"

    # Lifecycle hooks (webhooks); none when unset. See deploy/hooks.example.yaml.
    hooks_file: Path | None = None

    # Log lines: `json` (one object a line), `text`, or `auto`: text on a terminal, JSON otherwise.
    log_format: Literal["auto", "json", "text"] = "auto"
    # The largest message a consumer accepts; a larger one is dead-lettered with a reason.
    max_message_bytes: int = 256 * 1024
    # How much of a tool's result the model reads: a longer one reaches it truncated, with
    # a marker saying so; the ledger keeps it whole (the call's closure).
    tool_output_model_chars: int = 16_000
    # Quorum queues on RabbitMQ 3.10 have no default delivery limit: a message
    # that keeps failing would loop forever without one. It counts redeliveries: a
    # message is tried once, then at most this many times more, then parked.
    delivery_limit: int = 20
    # The inbound queues' type: "quorum" (replicated; RabbitMQ counts deliveries and
    # parks at the limit) or "classic" (version 2; less broker CPU per message, one
    # copy, the consumer counts failed deliveries itself). docs/benchmarks.md, "Queue types".
    queue_type: Literal["quorum", "classic"] = "quorum"
    # How many unacknowledged messages each consumer holds at once.
    prefetch: int = 64
    # The most outbox rows the publisher relays in one batch, and how often it looks for
    # new ones when no notification wakes it (SQLite has none).
    publisher_batch: int = 500
    publisher_poll_seconds: float = 0.02
    # How long an executor's claim on a call stays live without a heartbeat.
    claim_lease_seconds: float = 5.0
    # Comma-separated fault points armed in this process (see shared/faults.py).
    faults: str = ""

    # Keys made by `signoff setup` (shared/keyring.py); empty: <data_dir>/keys.
    keys_dir: Path | None = None
    # The channel this process signs responses as (the CLI's own key by default).
    channel: str = "cli"
    # A response issued further than this from the ledger's clock is refused as stale.
    response_window_seconds: float = 300.0
    # How long a request waits for a decision before it closes as expired (a tool may
    # say otherwise), and how often the ledger looks for requests past due.
    approval_timeout_seconds: float = 24 * 3600.0
    expiry_sweep_seconds: float = 1.0
    # How long the ledger keeps sent outbox rows, inbox rows (the redelivery horizon:
    # see services/approval_ledger/retention.py) and delivered hook rows, and how often it looks.
    outbox_retention_seconds: float = 7 * 24 * 3600.0
    inbox_retention_seconds: float = 7 * 24 * 3600.0
    hook_retention_seconds: float = 7 * 24 * 3600.0
    retention_sweep_seconds: float = 60.0
    # How often the ledger links new audit entries into the global chain (services/approval_ledger/audit.py).
    audit_link_seconds: float = 0.5
    # The most model steps one turn may take, and the most provider tokens (input and
    # output, every attempt) it may spend; a turn that reaches either ends as failed
    # (`step_limit`) with an operator alert, instead of calling the provider forever
    # (a model that keeps asking for a tool that does not exist). 0: no bound.
    turn_max_steps: int = 100
    turn_max_tokens: int = 2_000_000
    # How long the ledger's authorization on a `tool.execute` holds.
    authorization_ttl_seconds: float = 24 * 3600.0
    # Each service and channel connects to RabbitMQ as its own user, with only the
    # permissions it needs (`signoff setup` makes them); off: everyone connects as
    # the user of SIGNOFF_RABBITMQ_URL and the ledger does not check senders.
    broker_identities: bool = True
    # Each service that uses Redis logs in as its own ACL user (`signoff setup` makes
    # them), allowed only its own keys and commands; off: it logs in as SIGNOFF_REDIS_URL's user.
    redis_identities: bool = True
    # RabbitMQ's management API, used by `signoff setup` alone, as an administrator.
    rabbitmq_admin_url: str = "http://guest:guest@localhost:15672/"
    # How long `signoff up` waits for that management API to answer (it may start after the
    # broker), retrying each second, before it gives up naming it.
    management_wait_seconds: float = 60.0
    # On PostgreSQL each service logs in as its own role, granted only what it needs
    # (`signoff setup` makes them, as SIGNOFF_DATABASE_URL's user); off: everyone
    # logs in as SIGNOFF_DATABASE_URL's user.
    database_identities: bool = True
    # `signoff up` run as root runs each service as its own system user, holding only its
    # own files (services/operations/service_users.py); true: every service as root, sharing every
    # key: a single-user development deployment, as it says at start. Never in production.
    single_user: bool = False
    # The tool launcher's socket (services/operations/tool_launcher.py): set, every python tool is
    # started through it, as `signoff-tools`, and a call fails if it cannot be reached;
    # unset, an executor that is root starts tools as `signoff-tools` itself, and one that
    # is not runs them as its own user. `signoff up` as root, compose and Kubernetes set it.
    tool_launcher: Path | None = None
    # Python tools forked, one child per call, from a fork server of the tools' user that
    # has imported the interpreter's start-up once (services/tool_executor/tool_process.py
    # `serve`; the executor's, or the tool launcher's, which reads this variable too);
    # off: a fresh interpreter per call, as before (docs/benchmarks.md).
    tool_fork_server: bool = True
    # Each process serves /metrics, /healthz and /readyz here (shared/observability.py);
    # port 0: none. `signoff up` gives its children this port plus their index.
    metrics_port: int = 9464
    metrics_host: str = "127.0.0.1"
    # `signoff status`: the services' metrics addresses to ask, `name=http://host:port`
    # comma-separated; empty: the four of `signoff up` on this machine.
    status_targets: str = ""

    @field_validator("namespace")
    @classmethod
    def _namespace_is_a_name(cls, value: str) -> str:
        if not value or not all(c.isalnum() or c in "-_" for c in value):
            raise ValueError("namespace must be letters, digits, '-' or '_'")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_database_is_an_index(cls, value: str) -> str:
        url = urlsplit(value)
        index = parse_qs(url.query).get("db", [url.path.strip("/") or "0"])[0]
        if not index.isdigit():
            raise ValueError(f"the database index of SIGNOFF_REDIS_URL must be a number, not {index!r}")
        return value

    @property
    def amqp_url(self) -> str:
        """The RabbitMQ URL with a handshake timeout: a reconnect attempt that
        meets a broker still starting gives up and retries, instead of waiting
        the client's default minute."""
        if "timeout=" in self.rabbitmq_url:
            return self.rabbitmq_url
        return self.rabbitmq_url + ("&" if "?" in self.rabbitmq_url else "?") + f"timeout={AMQP_HANDSHAKE_SECONDS}"

    @property
    def keys_path(self) -> Path:
        return self.keys_dir or self.data_dir / "keys"

    def database_role(self, name: str) -> str:
        """The PostgreSQL role of a service (`approval-ledger`, …) or of the `console`."""
        return f"{self.namespace}_{name}".replace("-", "_").lower()

    def database_password_file(self, name: str) -> Path:
        return self.keys_path / "postgres" / f"{name}.password"

    def broker_password_file(self, name: str) -> Path:
        return self.keys_path / "rabbitmq" / f"{name}.password"

    def amqp_login(self, name: str) -> tuple[str, str]:
        """(URL, user) a process connects as: the broker identity `name` (a service,
        or `channel.<name>`) with the password `signoff setup` made for it, or,
        without broker identities, SIGNOFF_RABBITMQ_URL's own user."""
        url = urlsplit(self.amqp_url)
        if not self.broker_identities:
            return self.amqp_url, unquote(url.username or "guest")
        user = f"{self.namespace}.{name}"
        try:
            password = self.broker_password_file(name).read_text().strip()
        except FileNotFoundError:
            raise SystemExit(
                f"signoff: no broker password for {user} at {self.broker_password_file(name)}; run `signoff setup` "
                "(or set SIGNOFF_BROKER_IDENTITIES=false to connect as the user of SIGNOFF_RABBITMQ_URL)"
            ) from None
        from shared.amqp_hosts import with_hosts

        # Every host of the URL kept: a cluster's nodes (shared/amqp_hosts.py).
        return with_hosts(self.amqp_url, f"{quote(user, safe='')}:{quote(password, safe='')}"), user

    def redis_user(self, name: str) -> str:
        return f"{self.namespace}.{name}"

    def redis_password_file(self, name: str) -> Path:
        return self.keys_path / "redis" / f"{name}.password"

    @property
    def redis_database(self) -> int:
        """SIGNOFF_REDIS_URL's database index, as redis-py reads it: `?db=`, else the path, else 0."""
        url = urlsplit(self.redis_url)
        return int(parse_qs(url.query).get("db", [url.path.strip("/") or "0"])[0])

    def redis_login(self, name: str) -> str:
        """The Redis URL `name` (a service) logs in with: its own ACL user and the
        password `signoff setup` made for it, on SIGNOFF_REDIS_URL's host, port and
        database; without Redis identities, SIGNOFF_REDIS_URL as set."""
        if not self.redis_identities:
            return self.redis_url
        try:
            password = self.redis_password_file(name).read_text().strip()
        except FileNotFoundError:
            raise SystemExit(
                f"signoff: no Redis password for {self.redis_user(name)} at {self.redis_password_file(name)}; "
                "run `signoff setup` (or set SIGNOFF_REDIS_IDENTITIES=false to log in as the user of SIGNOFF_REDIS_URL)"
            ) from None
        url = urlsplit(self.redis_url)
        host = url.hostname or "localhost"
        netloc = f"{quote(self.redis_user(name), safe='')}:{quote(password, safe='')}@{host}" + (
            f":{url.port}" if url.port else ""
        )
        return urlunsplit((url.scheme, netloc, url.path, url.query, url.fragment))


def without_password(url: str) -> str:
    """The URL with its user-info's password removed (the user, host and the rest kept)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.netloc.rsplit("@", 1)[0].split(":", 1)[0]
    return urlunsplit((parts.scheme, f"{user}@{netloc}", parts.path, parts.query, parts.fragment))
