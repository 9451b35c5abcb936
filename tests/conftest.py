import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

# The slim SDK of this tree (sdk/, a package of its own): the tests read it from here, not
# from wherever it was installed, so a change to it (or a revert check's) is what they test.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk"))

from tests.harness import Deployment, require_services  # noqa: E402
from tests.slow_tests import pytest_collection_modifyitems, pytest_runtest_makereport  # noqa: E402, F401  (hooks)
from tests import store_twins  # noqa: E402

# The property tests draw a quarter of their examples under `make test` (--hypothesis-profile=quick);
# plain pytest, the revert checks and `make test-long` (its mutation smoke test runs every unit
# test) draw them all. A test that wants more than the default scales it (test_provider_replies.py).
hypothesis_settings.register_profile("quick", max_examples=25)


def pytest_configure(config):
    # A plugin of its own: its hook must run before `-m` deselects, and this module's
    # pytest_collection_modifyitems is the time limit's.
    config.pluginmanager.register(store_twins, "signoff_store_twins")


@pytest.fixture(params=["sqlite", "postgres"])
def store(request):
    return request.param


def _isolated(tmp_path, store):
    """An isolated deployment (not yet started), cleaned up after the test."""
    require_services(postgres=store == "postgres")
    deployment = Deployment(store=store, data_dir=tmp_path / "data")
    yield deployment
    asyncio.run(deployment.cleanup())


def _reachable_by_service_users(store):
    """A deployment whose data folder the services' own users can reach: `signoff up`
    run as root (as CI runs) runs each service as its own user, and pytest's own
    temporary folders are root's alone (0700)."""
    require_services(postgres=store == "postgres")
    base = Path(tempfile.mkdtemp(prefix="signoff-up-", dir="/tmp"))
    base.chmod(0o755)
    deployment = Deployment(store=store, data_dir=base / "data")
    yield deployment
    asyncio.run(deployment.cleanup())
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def up_pg_deployment():
    yield from _reachable_by_service_users("postgres")


@pytest.fixture
def up_sqlite_deployment():
    yield from _reachable_by_service_users("sqlite")


@pytest.fixture
def deployment(tmp_path, store):
    """On the parametrized store."""
    yield from _isolated(tmp_path, store)


@pytest.fixture
def pg_deployment(tmp_path):
    yield from _isolated(tmp_path, "postgres")


@pytest.fixture
def sqlite_deployment(tmp_path):
    yield from _isolated(tmp_path, "sqlite")


@pytest.fixture
def sink():
    from tests.sink import Sink

    with Sink() as sink:
        yield sink
