from types import SimpleNamespace

from tests.store_twins import pytest_collection_modifyitems


class _Item:
    def __init__(self, nodeid: str, store: str | None) -> None:
        self.nodeid = nodeid
        self.callspec = None if store is None else SimpleNamespace(params={"store": store})
        self.markers: list[str] = []

    def add_marker(self, marker) -> None:
        self.markers.append(marker.name)


def test_only_the_sqlite_run_of_a_test_where_the_stores_do_not_differ_is_left_to_the_long_tier():
    items = {
        "gateway on sqlite": _Item("tests/integration/test_gateway.py::test_x[sqlite]", "sqlite"),
        "gateway on postgres": _Item("tests/integration/test_gateway.py::test_x[postgres]", "postgres"),
        "crash on sqlite": _Item("tests/crash/test_crash_windows.py::test_y[sqlite]", "sqlite"),
        "contract on sqlite": _Item("tests/integration/test_ledger_store_contract.py::test_z[sqlite]", "sqlite"),
        "one store": _Item("tests/integration/test_gateway.py::test_w", None),
    }
    pytest_collection_modifyitems(list(items.values()))
    assert {name for name, item in items.items() if "store_twin" in item.markers} == {"gateway on sqlite"}
