"""`signoff setup` when a service it needs is down or refuses it: a short error naming the
service and its URL (never a password), no traceback, a non-zero exit, and none of the
broker or Redis users that run made left behind (those that were there before are kept)."""

import subprocess
import sys
from urllib.parse import quote, urlsplit

import httpx
import pytest
from redis import Redis as _Redis

from shared.settings import PROJECT_ROOT
from tests.harness import RABBITMQ_ADMIN_URL, RABBITMQ_URL, REDIS_URL, free_port

SECRET = "s3cret-in-the-url"


def setup(deployment) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.operations.cli", "setup"], env=deployment.env(), cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)


def management() -> httpx.Client:
    """The management API as the broker's administrator (what the test checks with, not Signoff)."""
    url = urlsplit(RABBITMQ_ADMIN_URL)
    return httpx.Client(base_url=f"{url.scheme}://{url.hostname}:{url.port}/api", auth=(url.username, url.password))


def broker_users(namespace: str) -> dict[str, dict | None]:
    """The namespace's broker users, each with its permissions on the vhost (None: none)."""
    with management() as api:
        users = [u["name"] for u in api.get("/users").json() if u["name"].startswith(namespace + ".")]
        permissions = {p["user"]: p for p in api.get("/vhosts/%2F/permissions").json()}
    return {user: permissions.get(user) for user in users}


def redis_users(namespace: str) -> list[str]:
    with _Redis.from_url(REDIS_URL, decode_responses=True) as redis:
        return [u for u in map(str, redis.acl_users()) if u.startswith(namespace + ".")]


def remove_users(namespace: str) -> None:
    with management() as api:
        for user in broker_users(namespace):
            api.delete(f"/users/{quote(user, safe='')}")
    with _Redis.from_url(REDIS_URL, decode_responses=True) as redis:
        for user in redis_users(namespace):
            redis.acl_deluser(user)


def assert_named_briefly(run: subprocess.CompletedProcess, named: str) -> str:
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    assert said.startswith(f"signoff setup: cannot use {named} ("), said
    assert "Traceback" not in said and SECRET not in said, said
    assert len(said.splitlines()) <= 10, said  # the error, and one line per user removed
    return said



@pytest.mark.parametrize("refuses", [False, True], ids=["down", "refusing-its-login"])
def test_setup_with_rabbitmq_down_or_refusing_names_it_and_leaves_no_users_behind(deployment, refuses):
    ns = deployment.namespace
    host = urlsplit(RABBITMQ_URL)
    port = host.port if refuses else free_port()
    url = f"amqp://{host.username}:{SECRET}@{host.hostname}:{port}/"
    deployment.extra_env["SIGNOFF_RABBITMQ_URL"] = url
    try:
        run = setup(deployment)
        assert broker_users(ns) == {} and redis_users(ns) == []
        said = assert_named_briefly(run, f"RabbitMQ at amqp://{host.username}@{host.hostname}:{port}/")
        if refuses:  # it answered, after the users were made through the management API
            assert "check SIGNOFF_RABBITMQ_URL" in said and f"removed broker user {ns}.console, made by this run" in said
        else:
            assert "start it" in said and "SIGNOFF_RABBITMQ_URL" in said
    finally:
        remove_users(ns)


def test_setup_with_postgresql_down_names_it_and_leaves_no_users_behind(pg_deployment):
    ns = pg_deployment.namespace
    port = free_port()
    pg_deployment.extra_env["SIGNOFF_DATABASE_URL"] = f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/test"
    try:
        said = assert_named_briefly(setup(pg_deployment), f"PostgreSQL at postgresql://postgres@127.0.0.1:{port}/test")
        assert "ConnectionRefusedError" in said and "start it" in said
        assert broker_users(ns) == {} and redis_users(ns) == []
    finally:
        remove_users(ns)


def test_setup_that_fails_after_making_users_removes_those_it_made_and_keeps_those_that_were_there(pg_deployment):
    """PostgreSQL answers but refuses (no such database): by then setup has made the
    broker and Redis users. Two users were there before it: one with its permissions
    (given back the permissions it had), one without (kept, the permissions this run gave it taken back)."""
    ns = pg_deployment.namespace
    database = f"no_such_database_{ns}"
    pg_deployment.extra_env["SIGNOFF_DATABASE_URL"] = f"postgresql://postgres:{SECRET}@localhost:5432/{database}"
    with management() as api:
        for name in ("publisher", "console"):
            api.put(f"/users/{ns}.{name}", json={"password": "before", "tags": ""}).raise_for_status()
        before = {"configure": "^$", "write": f"^{ns}\\.commands$", "read": "^$"}
        api.put(f"/permissions/%2F/{ns}.publisher", json=before).raise_for_status()
    try:
        said = assert_named_briefly(
            setup(pg_deployment), f"PostgreSQL at postgresql://postgres@localhost:5432/{database}")
        left = broker_users(ns)
        assert set(left) == {f"{ns}.publisher", f"{ns}.console"}, left
        assert {k: left[f"{ns}.publisher"][k] for k in before} == before
        assert left[f"{ns}.console"] is None
        assert redis_users(ns) == []
        assert f'database "{database}" does not exist' in said and "check SIGNOFF_DATABASE_URL" in said
        assert f"removed broker user {ns}.approval-ledger, made by this run" in said
        assert f"removed Redis user {ns}.tool-executor, made by this run" in said
    finally:
        remove_users(ns)
