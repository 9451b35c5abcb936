"""The gateway's own settings, read from SIGNOFF_* variables like the shared ones."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from shared.settings import Settings


class GatewaySettings(Settings):
    # The address the gateway listens on (loopback by default: put TLS in front of any other).
    gateway_host: str = "127.0.0.1"
    # uvicorn's HTTP parser: httptools (C, a dependency) or h11 (pure Python); auto: httptools where installed.
    gateway_http: Literal["auto", "httptools", "h11"] = "auto"
    # The port it listens on.
    gateway_port: int = 8080
    # The users file (`signoff user add`); empty: <keys dir>/gateway/users.yaml.
    gateway_users_file: Path | None = None
    # How long a login lasts.
    gateway_session_seconds: float = 8 * 3600.0
    # Failed logins allowed per user, and per client address, in one window, before
    # further attempts are refused (429) until the window ends. Counted in Redis: the
    # limit holds across replicas.
    gateway_login_attempts_per_user: int = 5
    gateway_login_attempts_per_address: int = 20
    gateway_login_window_seconds: float = 300.0
    # Requests with an unknown, revoked or expired API token allowed per client address in
    # that window, before every bearer request from it is refused (429) until the window
    # ends, a right token included (so guessing stops). Counted in Redis, across replicas.
    gateway_token_failures_per_address: int = 20
    # How long a decision waits for the ledger's verdict before answering 202 and a link to poll.
    gateway_decision_wait_seconds: float = 5.0
    # The largest request body accepted (413 beyond).
    gateway_max_body_bytes: int = 64 * 1024
    # The event stream and decisions waiting for their verdicts: on PostgreSQL the gateway
    # wakes on the ledger's NOTIFY of each commit, and besides looks every
    # `gateway_poll_seconds` while a row may be held back unannounced (its last read found
    # a writer open below the horizon) or a decision waits, otherwise every
    # `gateway_idle_poll_seconds` (SQLite has no NOTIFY: every `gateway_poll_seconds`).
    # And how often a stream sends a comment line when there is nothing (so proxies keep it open).
    gateway_poll_seconds: float = 0.2
    gateway_idle_poll_seconds: float = 2.0
    gateway_heartbeat_seconds: float = 15.0
    # Addresses of reverse proxies whose X-Forwarded-For is believed (comma-separated);
    # empty: none, the peer's address is the client's (the login limit counts per address).
    gateway_forwarded_allow_ips: str = ""
    # The base URL people reach it by, checked against a state-changing request's Origin;
    # empty: the request's own scheme and Host.
    gateway_public_url: str = ""
    # OpenID Connect (services/gateway/oidc.py); empty issuer: off. The redirect URL is
    # <public URL>/v1/login/oidc/callback as registered with the issuer. The principal claim
    # must name a user added with `signoff user add NAME --oidc`.
    gateway_oidc_issuer: str = ""
    gateway_oidc_client_id: str = ""
    gateway_oidc_client_secret: str = ""
    gateway_oidc_redirect_url: str = ""
    gateway_oidc_principal_claim: str = "preferred_username"
    gateway_oidc_groups_claim: str = "groups"
    gateway_oidc_scope: str = "openid profile email"

    @property
    def users_path(self) -> Path:
        return self.gateway_users_file or self.keys_path / "gateway" / "users.yaml"

    @property
    def session_key_path(self) -> Path:
        return self.keys_path / "gateway" / "session.key"
