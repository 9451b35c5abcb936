"""Where the ledger's database is and how a service logs in to it: SIGNOFF_DATABASE_URL
made into the SQLAlchemy async URL, which database that is, each service's own login,
and the SQLite file. The only place (with shared/ledger/'s modules) that reads a
database URL's dialect; `Settings` takes these properties from `LedgerLogin`. It lies
beside shared/ledger/, not in it, because the settings import it and shared/ledger/'s
modules import the settings: it imports nothing of Signoff's.

Nothing here connects, and nothing heavy is imported at start: every process reads its
settings, most never open the ledger (SQLAlchemy is imported only to log in with a role).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit


class LedgerLogin:
    """The ledger's URL and logins, as properties of `Settings` (shared/settings.py)."""

    if TYPE_CHECKING:  # Settings' fields and names these read; none at run time (pydantic sees no field here)
        data_dir: Path
        database_url: str
        database_identities: bool

        def database_role(self, name: str) -> str: ...

        def database_password_file(self, name: str) -> Path: ...

    @property
    def ledger_url(self) -> str:
        """The SQLAlchemy async URL of the ledger."""
        return ledger_url(self.database_url, self.data_dir)

    @property
    def is_postgres(self) -> bool:
        return is_postgres_url(self.ledger_url)

    def database_login(self, name: str) -> str:
        """The ledger's URL as `name` logs in: its own role and the password `signoff
        setup` made for it; SQLite, or without database identities, the URL as set."""
        if not (self.is_postgres and self.database_identities):
            return self.ledger_url
        path = self.database_password_file(name)
        try:
            password = path.read_text().strip()
        except FileNotFoundError:
            raise SystemExit(
                f"signoff: no database password for role {self.database_role(name)} at {path}; run `signoff setup` "
                "(or set SIGNOFF_DATABASE_IDENTITIES=false to log in as the user of SIGNOFF_DATABASE_URL)"
            ) from None
        from sqlalchemy.engine import make_url

        url = make_url(self.ledger_url).set(username=self.database_role(name), password=password)
        return url.render_as_string(hide_password=False)

    @property
    def database_server(self) -> str | None:
        """The URL of the database server a service needs reachable (every host of it);
        None on SQLite, a file."""
        return (self.database_url or self.ledger_url) if self.is_postgres else None

    @property
    def sqlite_file(self) -> Path | None:
        """The ledger's SQLite file; None on PostgreSQL."""
        url = self.ledger_url
        if not url.startswith("sqlite"):
            return None
        return Path(url.split(":///", 1)[1])


def ledger_url(database_url: str, data_dir: Path) -> str:
    """SIGNOFF_DATABASE_URL with SQLAlchemy's async driver named (asyncpg, aiosqlite); empty,
    the embedded default: a SQLite file under the data folder."""
    url = database_url or f"sqlite+aiosqlite:///{(data_dir / 'ledger.db').resolve()}"
    for plain, driver in (
        ("postgresql://", "postgresql+asyncpg://"),
        ("postgres://", "postgresql+asyncpg://"),
        ("sqlite:///", "sqlite+aiosqlite:///"),
    ):
        if url.startswith(plain):
            return several_hosts(driver + url[len(plain) :])
    return several_hosts(url)


def is_postgres_url(url: str) -> bool:
    """Whether a ledger URL (`ledger_url`'s) is PostgreSQL's; otherwise it is SQLite's."""
    return url.startswith("postgresql")


def several_hosts(url: str) -> str:
    """A PostgreSQL URL with several hosts as libpq writes it (`postgresql://u@h1:5442,h2:5443/db?
    target_session_attrs=read-write`: a primary and its standby) in the form SQLAlchemy's asyncpg
    dialect reads (`…@/db?host=h1:5442&host=h2:5443&…`); asyncpg tries them in turn and, with
    target_session_attrs=read-write, keeps only the primary, so after a promotion a new
    connection finds the new one. One host: the URL unchanged."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return url
    query = "&".join([f"host={host}" for host in hosts.split(",") if host] + ([parts.query] if parts.query else []))
    return urlunsplit((parts.scheme, f"{userinfo}{at}", parts.path, query, parts.fragment))
