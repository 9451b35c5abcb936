"""A short chaos run on each store: random SIGKILLs of random services under
concurrent sessions, then the full check (`make chaos` runs the long one)."""

import pytest

from tests.chaos import run

pytestmark = pytest.mark.crash


@pytest.mark.slow(reason="a chaos run: services killed at random for its whole length, on each store; `make test-long` runs it, `make chaos` runs the long one")
async def test_a_short_chaos_run_loses_nothing_repeats_nothing_and_renames_nothing(tmp_path, store):
    assert await run(seconds=20, sessions=6, seed=20261129, data_dir=tmp_path, store=store) == 0
