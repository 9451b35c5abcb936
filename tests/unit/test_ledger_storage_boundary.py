"""Every database detail of the ledger's transitions lives in its two database adapters
(store_sql.py, store_postgres.py, and store_database.py, which picks one), migrations and
shared/ledger/: the handlers, their records, the rules, the port, the memory adapter, the
group commit and the entrypoint hold no SQL, no connection and no dialect check.
And a handler hands its writes to the store only through records.py's typed writes
(the port's write side): load (the store's reads), decide (domain), record (records)."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

LEDGER = Path(__file__).resolve().parents[2] / "services" / "approval_ledger"
DATABASE_ADAPTERS = {"store_sql.py", "store_postgres.py", "store_database.py"}
# Every other module of the ledger: the transitions, and the sweeps beside them (the global
# audit chain, retention, the backlog), whose statements are shared/ledger/'s.
TRANSITION_MODULES = sorted(p.name for p in LEDGER.glob("*.py") if p.name not in DATABASE_ADAPTERS)
SQL = re.compile(r"\b(SELECT\s+[\w*(]|INSERT\s+INTO\b|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\b|ON\s+CONFLICT\b|FOR\s+UPDATE\b)")
DRIVERS = {"sqlalchemy", "asyncpg", "aiosqlite", "sqlite3"}
CONNECTIONS = {"db", "execute", "exec_driver_sql", "run_sync", "engine", "connect"}
DIALECTS = {"dialect", "is_postgres"}


def found_in(source: str) -> list[str]:
    """What of a database a module's code holds (its comments and docstrings may name one)."""
    names, strings = set(), []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME:
            names.add(token.string)
        elif token.type == tokenize.STRING:
            strings.append(token.string)
    found = []
    if names & DRIVERS:
        found.append("a driver or SQLAlchemy")
    if any(SQL.search(string) for string in strings):
        found.append("SQL")
    if names & CONNECTIONS:
        found.append("a connection")
    if names & DIALECTS or any(string.strip("\"'") in ("postgresql", "sqlite") for string in strings):
        found.append("a dialect check")
    return found


def test_the_transition_modules_are_the_ones_expected():
    # A new module lands on one side of the boundary on purpose.
    assert TRANSITION_MODULES == [
        "__init__.py", "audit.py", "authority.py", "backlog.py", "decision_rules.py", "domain.py", "grants.py",
        "group_commit.py", "handlers.py", "intake.py", "intake_rules.py", "main.py", "records.py", "retention.py", "store.py", "store_memory.py",
    ]


def test_the_check_finds_sql_a_connection_and_a_dialect_check():
    assert found_in('from sqlalchemy import select\nrows = await store.db.execute("SELECT id FROM t")') == [
        "a driver or SQLAlchemy", "SQL", "a connection",
    ]
    assert found_in('if engine.dialect.name == "postgresql":\n    pass') == ["a connection", "a dialect check"]
    assert found_in('# SELECT x FROM the PostgreSQL db\n"""the SQLite file"""') == []


@pytest.mark.parametrize("module", TRANSITION_MODULES)
def test_no_database_detail_outside_the_database_adapters(module):
    source = (LEDGER / module).read_text()
    found = found_in(source)
    if module == "main.py":
        # The entrypoint makes the engine and hands it to the adapters; it runs no statement.
        found.remove("a connection")
    assert found == [], f"{module} holds {', '.join(found)}: it belongs in a database adapter"


# What a transition hands to the store (store.py); records.py's typed writes make them.
COLLECTING = {"add", "update", "emit", "audit", "withdraw_request", "restart_count", "keep_tool_menu"}
# None left: edit before approve writes through `records.arguments_edited` too.
WRITES_LEFT_IN: set[str] = set()


def direct_writes(source: str) -> list[str]:
    """`function: store.write` for each collecting call a top-level function makes on the store itself."""
    found = []
    for function in ast.parse(source).body:
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "store"
                and node.func.attr in COLLECTING
            ):
                found.append(f"{function.name}: store.{node.func.attr}")
    return found


def test_the_check_finds_a_write_a_function_makes_on_the_store_itself():
    source = 'async def f(store):\n    await store.step(1)\n    records.closure(store)\n    store.update("steps", 1)\n'
    assert direct_writes(source) == ["f: store.update"]


def test_handlers_write_only_through_records_typed_writes():
    found = direct_writes((LEDGER / "handlers.py").read_text())
    assert [w for w in found if _unmutated(w.split(":")[0]) not in WRITES_LEFT_IN] == []


# --- the whole repository ---------------------------------------------------------------

ROOT = LEDGER.parents[1]
# Where a database detail may live: shared/ledger/ (schema, engine, migrations, driver, and
# one module per crossing or per sweep), the ledger's URL and logins beneath the settings
# (shared/ledger_urls.py: the settings import it, so it cannot sit in shared/ledger/, whose
# modules import the settings) and the ledger's two database adapters.
DATABASE_PLACES = ("shared/ledger/", "shared/ledger_urls.py") + tuple(
    f"services/approval_ledger/{name}" for name in DATABASE_ADAPTERS
)


def database_detail(source: str) -> list[str]:
    """SQL, SQLAlchemy or a driver, or a dialect check: what `found_in` finds, less the
    connection names (an AMQP connection, a subprocess's `execute`, are no database's)."""
    return [found for found in found_in(source) if found != "a connection"]


def repository_modules() -> dict[str, list[str]]:
    """Each Python module of services/, shared/ and signoff/ outside the database places, and what it holds."""
    held = {}
    for folder in ("services", "shared", "signoff"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if not name.startswith(DATABASE_PLACES):
                held[name] = database_detail(path.read_text())
    return held


def test_the_repository_check_sees_the_services_and_skips_the_database_places():
    held = repository_modules()
    assert "services/gateway/users.py" in held and "signoff/client.py" in held
    assert not any(name.startswith(DATABASE_PLACES) for name in held)
    assert database_detail('import asyncpg\nawait conn.connect()\nif dialect == "sqlite": pass') == [
        "a driver or SQLAlchemy", "a dialect check",
    ]


def test_no_sql_nor_dialect_check_outside_shared_ledger_and_the_ledgers_adapters():
    held = repository_modules()
    found = {name: what for name, what in held.items() if what}
    assert found == {}, "move these modules' queries into a named module under shared/ledger/"


def _unmutated(name: str) -> str:
    """A function's own name, also in mutmut's copy of the module (`x__edit__mutmut_3` is `_edit`)."""
    found = re.fullmatch(r"x_(.+)__mutmut_(?:orig|\d+)", name)
    return found.group(1) if found else name
