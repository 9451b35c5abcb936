import asyncio

import pytest

from tests.harness import Deployment, require_services


@pytest.fixture(params=["sqlite", "postgres"])
def store(request):
    return request.param


@pytest.fixture
def deployment(tmp_path, store):
    """An isolated deployment (not yet started) on the parametrized store."""
    require_services(postgres=store == "postgres")
    deployment = Deployment(store=store, data_dir=tmp_path / "data")
    yield deployment
    asyncio.run(deployment.cleanup())


@pytest.fixture
def pg_deployment(tmp_path):
    require_services(postgres=True)
    deployment = Deployment(store="postgres", data_dir=tmp_path / "data")
    yield deployment
    asyncio.run(deployment.cleanup())


@pytest.fixture
def sink():
    from tests.sink import Sink

    with Sink() as sink:
        yield sink
