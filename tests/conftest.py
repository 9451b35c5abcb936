import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.harness import Deployment, require_services


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
