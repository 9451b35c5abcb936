"""The code's shape, as a test: services may import `shared`, never each other,
`shared` imports no service, the SDK (`signoff`) imports no service, the operator's tools
(services/operations/) use only the services' public entry points and no service imports
them, and no module imports itself through others."""

from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]

SERVICES = ("services.approval_ledger", "services.publisher", "services.model_step", "services.tool_executor",
            "services.gateway")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("services", "shared", "signoff", cache_dir=None)


def chains(graph, importer: str, imported: str) -> list[str]:
    return [" -> ".join(chain) for chain in graph.find_shortest_chains(importer=importer, imported=imported,
                                                                         as_packages=True)]


@pytest.mark.parametrize("importer", SERVICES)
def test_a_service_never_imports_another_service(graph, importer):
    found = [chain for imported in SERVICES if imported != importer for chain in chains(graph, importer, imported)]
    assert found == [], "a service imports another; move what they share into shared/:\n" + "\n".join(found)


@pytest.mark.parametrize("service", (*SERVICES, "services.operations"))
def test_shared_never_imports_a_service(graph, service):
    assert chains(graph, "shared", service) == []


def test_the_sdk_never_imports_a_service(graph):
    # What a user installs to talk to Signoff runs beside their code, not the services':
    # it may use the contract (shared/messages.py, shared/signatures.py), never a service.
    assert chains(graph, "signoff", "services") == []


def test_no_module_imports_itself_through_others(graph):
    loops = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                loops.add(" -> ".join((module, *back)))
    assert sorted(loops) == []


# The operator's tools (services/operations/: the CLI, its console, `signoff up`'s supervisor,
# the tool launcher, service users, warm start and `signoff status`) are one layer above the
# services: no service imports them, and they use of a service only its public entry points,
# each narrow and without I/O of the service's own; nothing else of it. (Warm start and the
# launcher name the services' `main` and the executor's tool process to run, never import them.)
OPERATIONS = "services.operations"
OPERATOR_TOOLS = sorted(f"{OPERATIONS}.{module.stem}" for module in (ROOT / "services" / "operations").glob("*.py")
                        if module.stem != "__init__")
PUBLIC_ENTRY_POINTS = {
    # The gateway's users, programs' tokens and address: `signoff setup|user|token` and the demo.
    "services.gateway.admin",
    # The providers' table, for the CLI's help: it imports a provider only when one is built.
    "services.model_step.providers",
    # Which settings are a service's own secrets, that `signoff up` as root gives it alone.
    "services.model_step.settings",
    "services.publisher.settings",
}


@pytest.mark.parametrize("service", SERVICES)
def test_no_service_imports_the_operators_tools(graph, service):
    assert chains(graph, service, OPERATIONS) == []


@pytest.mark.parametrize("tool", OPERATOR_TOOLS)
def test_the_operator_tools_use_only_the_services_public_entry_points(graph, tool):
    used = {
        imported
        for imported in graph.find_modules_directly_imported_by(tool)
        if any(imported == service or imported.startswith(service + ".") for service in SERVICES)
    }
    assert used <= PUBLIC_ENTRY_POINTS, f"{tool} uses {sorted(used - PUBLIC_ENTRY_POINTS)} of a service"


@pytest.mark.parametrize("tool", OPERATOR_TOOLS)
@pytest.mark.parametrize(
    "internal",
    ("services.approval_ledger.handlers", "services.approval_ledger.store", "services.approval_ledger.records",
     "services.approval_ledger.domain", "services.tool_executor.claims", "services.tool_executor.handlers",
     "services.publisher.relay", "services.gateway.app"),
)
def test_the_operator_tools_never_reach_a_services_rules_transitions_or_storage(graph, tool, internal):
    assert chains(graph, tool, internal) == []


# What the operator's tools use of shared/ledger/: their own named modules of the
# ledger's rows, and nothing that holds a query of a service or sweep. The console's reads
# (shared/ledger/console_reads.py, for its sessions, decisions and audit commands) and its
# one write (dead_letter_actions.py, for the parked messages' replay and drop); `signoff
# migrate` migrates through database.py, as every service starts; `signoff status` reads
# through status_reads.py, which measures the backlog. Any other operator module: nothing
# of shared/ledger/.
CONSOLE_READS = "shared.ledger.console_reads"
TABLES = "shared.ledger.tables"
OPERATOR_LEDGER_MODULES = {
    f"{OPERATIONS}.console": {CONSOLE_READS, TABLES},
    f"{OPERATIONS}.cards": {TABLES},
    f"{OPERATIONS}.sessions": {CONSOLE_READS},
    f"{OPERATIONS}.decisions": {CONSOLE_READS, TABLES},
    f"{OPERATIONS}.audit_log": {CONSOLE_READS, TABLES},
    f"{OPERATIONS}.parked": {"shared.ledger.dead_letter_actions"},
    f"{OPERATIONS}.deployment": {"shared.ledger.database"},
    f"{OPERATIONS}.status": {"shared.ledger.status_reads", "shared.ledger.backlog"},
}


@pytest.mark.parametrize("tool", OPERATOR_TOOLS)
def test_the_operator_tools_reach_the_ledgers_rows_only_through_their_named_modules(graph, tool):
    allowed = OPERATOR_LEDGER_MODULES.get(tool, set())
    used = {imported for imported in graph.find_modules_directly_imported_by(tool)
            if imported == "shared.ledger" or imported.startswith("shared.ledger.")}
    assert used <= allowed, f"{tool} uses {sorted(used - allowed)}"


def test_the_operator_tools_are_the_modules_the_contracts_name(graph):
    # A module that leaves, or a name misspelt, shows here: each contract above names real
    # modules (a misspelt one would pass by importing nothing).
    assert {"services.operations.cli", "services.operations.console"} <= set(OPERATOR_TOOLS) <= graph.modules
    assert set(OPERATOR_LEDGER_MODULES) <= set(OPERATOR_TOOLS)
    assert set().union(*OPERATOR_LEDGER_MODULES.values(), PUBLIC_ENTRY_POINTS) <= graph.modules


# Where one service's tables meet another's (docs/design.md, "Services and who owns what"):
# each crossing has one named module, and only the service that crosses uses it.
@pytest.mark.parametrize(
    "crossing, users",
    (
        # The executor's one read of the ledger's tool_calls, approval_requests and decisions,
        # beside its own claims' statements (shared/ledger/claims.py, which reads through
        # shared/ledger/call_on_record.py).
        ("shared.ledger.claims", {"services.tool_executor.claims", "services.tool_executor.main"}),
        # The publisher's reads and marks of the ledger's outbox, its hook deliveries and its leadership.
        ("shared.ledger.outbox_relay", {"services.publisher.relay"}),
        ("shared.ledger.hook_deliveries", {"services.publisher.hooks"}),
        ("shared.ledger.leadership", {"services.publisher.leadership", "services.publisher.main"}),
        # The ledger's one write in the executor's execution_claims (a call held back).
        ("shared.ledger.held_back", {"services.approval_ledger.store", "services.approval_ledger.domain"}),
        # The console's reads of the ledger's rows, and its one write there (an operator's
        # replay or drop of a parked message), and what `signoff status` reads.
        ("shared.ledger.console_reads", {f"{OPERATIONS}.{m}" for m in ("console", "sessions", "decisions", "audit_log")}),
        ("shared.ledger.dead_letter_actions", {"services.operations.parked"}),
        ("shared.ledger.status_reads", {"services.operations.status"}),
    ),
)
def test_each_crossing_between_two_services_tables_is_one_named_module_used_by_the_crossing_service(
    graph, crossing, users
):
    importers = {m for m in graph.find_modules_that_directly_import(crossing) if m.startswith("services")}
    assert importers == users


def test_the_executor_names_none_of_the_ledgers_tables_but_through_its_crossing():
    executor = ROOT / "services" / "tool_executor"
    for module in executor.glob("*.py"):
        source = module.read_text()
        for table in ("tool_calls", "approval_requests", "decisions", "sessions", "turns", "steps"):
            assert f'TABLES["{table}"]' not in source, f"{module.name} reads the ledger's {table} itself"
