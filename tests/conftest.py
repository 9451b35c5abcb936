import asyncio

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
