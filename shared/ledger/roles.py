"""`signoff setup`'s database part: one PostgreSQL role per service, each granted only
what it needs, the schema the administrator's, the ledger's tables migrated as the
ledger's role, and the audit log sealed (append-only for every service). The SQL of
it lives here; shared/provisioning.py makes the passwords and turns a failure into
setup's short error. Run as SIGNOFF_DATABASE_URL's user (an administrator); idempotent.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.settings import Settings

# Any constant: it keeps two setups from making roles at once.
ROLES_LOCK = 0x51600F
DATABASE_IDENTITIES = ("approval-ledger", "publisher", "model-step", "tool-executor", "console", "gateway")
# What each role may do beyond reading the schema's version; the ledger owns every table but the audit log's.
GRANTS = {
    "publisher": (
        "SELECT, UPDATE (sent_at) ON outbox",
        "SELECT, INSERT, UPDATE ON hook_deliveries",
        # Its leadership epoch: taken when it leads, read (FOR SHARE) by every write it makes.
        "SELECT, UPDATE ON publisher_leader",
        "SELECT ON alembic_version",
    ),
    # The operator's console reads everything and records what it did with parked messages.
    "console": ("INSERT ON dead_letter_actions",),
    # A step names its transcript and its tool menu (claim-check); the model-step reads them, nothing else.
    "model-step": ("SELECT ON transcript, tool_menus, alembic_version",),
    "tool-executor": (
        # The grants: a call authorized by a remembered approval runs only if its grant is live.
        "SELECT ON tool_calls, approval_requests, decisions, grants, alembic_version",
        "SELECT, INSERT, UPDATE ON execution_claims",
    ),
    # The HTTP gateway reads what the ledger committed and writes none of it (services/gateway):
    # cards, sessions and their transcripts, the events it streams (the outbox), the
    # verdicts on the responses it sent (the audit log, granted with the audit tables).
    # It writes one table of its own: the logins it ended (logouts), pruned once expired.
    "gateway": (
        "SELECT ON sessions, turns, steps, transcript, tool_calls, approval_requests, approvals, decisions, "
        "closures, provider_attempts, outbox, grants, filed_calls, alembic_version",
        "SELECT, INSERT, DELETE ON ended_logins",
    ),
}


# Append-only for every service: the administrator who runs setup owns these tables,
# the ledger may only add and read entries, the console only read; nobody but that
# owner may UPDATE, DELETE or TRUNCATE them (docs/design.md, "The audit log").
AUDIT_TABLES = ("audit_log", "audit_chain")


def makes_roles(settings: Settings) -> bool:
    """Whether setup makes database roles: on PostgreSQL with database identities (SQLite has no roles)."""
    return settings.is_postgres and settings.database_identities


def refusal(error: BaseException) -> str:
    """What the database said, for setup's short error: the driver's own error, without the
    statement SQLAlchemy adds to it (which may hold a role's password)."""
    error = getattr(error, "orig", None) or error
    # SQLAlchemy's adapter wraps the driver's error in a plain `Error`: name the driver's.
    error = error.__cause__ if type(error).__name__ == "Error" and error.__cause__ else error
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text.split("[SQL:")[0].strip()


async def make_roles(settings: Settings, password: Callable[[str], str]) -> list[str]:
    """One PostgreSQL role per service (and one, read-only, for the console): the
    ledger's owns its tables (not the schema, nor the audit log's) and migrates them; the publisher may only
    mark outbox rows sent and keep its hook deliveries; the executor may only read the
    calls and their decisions and keep its claims. Nothing but the ledger can write a
    decision. Run as SIGNOFF_DATABASE_URL's user (an administrator); idempotent.
    `password(name)`: the role's password, made (and kept in the keys folder) if missing."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    from shared.ledger.database import create_engine, migrate

    roles = {name: settings.database_role(name) for name in DATABASE_IDENTITIES}
    schema = settings.database_schema or "public"
    done = []
    admin = create_async_engine(settings.ledger_url)
    try:
        async with admin.begin() as conn:
            # Roles are the cluster's: one setup at a time.
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ROLES_LOCK})
            for name, role in roles.items():
                secret = password(name)
                exists = await conn.scalar(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role})
                verb = "ALTER" if exists else "CREATE"
                await conn.execute(text(f"{verb} ROLE \"{role}\" LOGIN PASSWORD '{secret}'"))
                done.append(f"database role {role} " + ("kept" if exists else "made"))
            ledger = roles["approval-ledger"]
            # The schema is the administrator's, not the ledger's: a schema's owner may drop
            # any table in it, the audit log included. The ledger creates (and owns) the rest.
            await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            owner = await conn.scalar(
                text("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = :s"), {"s": schema}
            )
            if owner == ledger:  # made by an earlier setup
                await conn.execute(text(f'ALTER SCHEMA "{schema}" OWNER TO CURRENT_USER'))
            await conn.execute(text(f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO "{ledger}"'))
            # Tables migrated before roles existed become the ledger's.
            owned = await conn.scalars(text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": schema})
            for table in [t for t in owned if t not in AUDIT_TABLES]:
                await conn.execute(text(f'ALTER TABLE "{schema}"."{table}" OWNER TO "{ledger}"'))
            for name in ("publisher", "model-step", "tool-executor", "console", "gateway"):
                await conn.execute(text(f'GRANT USAGE ON SCHEMA "{schema}" TO "{roles[name]}"'))
    finally:
        await admin.dispose()
    engine = create_engine(settings, identity="approval-ledger", pool_size=1)
    try:
        await migrate(engine, settings)
        async with engine.begin() as conn:
            for name, grants in GRANTS.items():
                for grant in grants:
                    await conn.execute(text(f'GRANT {grant} TO "{roles[name]}"'))
            console = roles["console"]
            await conn.execute(text(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{console}"'))
            await conn.execute(
                text(f'ALTER DEFAULT PRIVILEGES IN SCHEMA "{schema}" GRANT SELECT ON TABLES TO "{console}"')
            )
    finally:
        await engine.dispose()
    done.append(f"migrated schema {schema} as {roles['approval-ledger']} and granted each role its tables")
    done.append(await _seal_audit_tables(settings, schema, roles))
    return done


async def _seal_audit_tables(settings: Settings, schema: str, roles: dict[str, str]) -> str:
    """The audit tables become the administrator's (the ledger's migration made them),
    and the ledger keeps INSERT and SELECT alone: an owner may always grant itself
    more, so the ledger must not own them."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    ledger, console, gateway = roles["approval-ledger"], roles["console"], roles["gateway"]
    admin = create_async_engine(settings.ledger_url)
    try:
        async with admin.begin() as conn:
            for table in AUDIT_TABLES:
                qualified = f'"{schema}"."{table}"'
                await conn.execute(text(f"ALTER TABLE {qualified} OWNER TO CURRENT_USER"))
                await conn.execute(text(f'REVOKE ALL ON {qualified} FROM "{ledger}"'))
                await conn.execute(text(f'GRANT SELECT, INSERT ON {qualified} TO "{ledger}"'))
                await conn.execute(text(f'GRANT SELECT ON {qualified} TO "{console}"'))
                await conn.execute(text(f'GRANT SELECT ON {qualified} TO "{gateway}"'))
            # The entries' ids come from the table's sequence, which moved with it.
            await conn.execute(text(f'GRANT USAGE ON SEQUENCE "{schema}"."audit_log_id_seq" TO "{ledger}"'))
    finally:
        await admin.dispose()
    return f"the audit log ({', '.join(AUDIT_TABLES)}): {ledger} may only INSERT and SELECT, no service may change it"


async def remove_roles(settings: Settings) -> None:
    """Drop a namespace's roles (tests clean up after themselves; the schema goes first)."""
    if not makes_roles(settings):
        return
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    admin = create_async_engine(settings.ledger_url)
    try:
        async with admin.begin() as conn:
            for name in DATABASE_IDENTITIES:
                role = settings.database_role(name)
                if await conn.scalar(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}):
                    await conn.execute(text(f'DROP OWNED BY "{role}" CASCADE'))
                    await conn.execute(text(f'DROP ROLE "{role}"'))
    finally:
        await admin.dispose()
