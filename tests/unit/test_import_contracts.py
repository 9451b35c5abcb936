"""The code's shape, as a test: services may import `shared`, never each other,
`shared` imports no service, the SDK (`signoff`) imports no service, and no module
imports itself through others."""

import grimp
import pytest

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


@pytest.mark.parametrize("service", (*SERVICES, "services.cli", "services.console", "services.supervisor",
                                     "services.warm_start"))
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
