"""The suite's two tiers of stores, as a pytest hook (tests/conftest.py uses it).

Most integration tests take the `store` fixture and so run twice, on SQLite and on
PostgreSQL. What differs between the two stores is proved in full by `make test`: the
crash tests (every fault point on each store) and the ledger store contract. Everywhere
else the SQLite run repeats the PostgreSQL one through the same storage port, so
`make test` runs it on PostgreSQL (the production store) and marks its SQLite twin
`store_twin`, which `make test-long` (and so CI) runs. Nothing is dropped: the two
tiers together run every test on both stores."""

from pathlib import Path

import pytest

_BOTH_STORES_IN_THE_SHORT_TIER = (
    Path("tests") / "crash",
    Path("tests") / "integration" / "test_ledger_store_contract.py",
)


def _runs_on_both_stores_in_the_short_tier(item: pytest.Item) -> bool:
    path = Path(item.nodeid.split("::", 1)[0])
    return any(path == kept or kept in path.parents for kept in _BOTH_STORES_IN_THE_SHORT_TIER)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("store") != "sqlite":
            continue
        if not _runs_on_both_stores_in_the_short_tier(item):
            item.add_marker(pytest.mark.store_twin)
