"""The suite's time limit per test, as pytest hooks (tests/conftest.py uses them): light,
so a test of them can load them alone."""

import os

import pytest

# The longest a test may take (setup, call and teardown together) without a `slow`
# marker saying why: the suite is run by people waiting for it. Raised on a machine
# known to be slower (SIGNOFF_TEST_SLOW_SECONDS), never per test.
SLOW_SECONDS = float(os.environ.get("SIGNOFF_TEST_SLOW_SECONDS", "60"))


def limit() -> float:
    """The limit on this machine now: SLOW_SECONDS on an idle one, stretched by how many
    runnable processes share each core (the 1-minute load average), since a test's wall
    time grows with what else runs, not with what it costs. A limit set in the
    environment is taken as it is."""
    if "SIGNOFF_TEST_SLOW_SECONDS" in os.environ:
        return SLOW_SECONDS
    try:
        crowding = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        crowding = 1.0
    return SLOW_SECONDS * max(1.0, crowding)


_TAKEN = pytest.StashKey[float]()


def _slow_reason(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("slow")
    return None if marker is None else str(marker.kwargs.get("reason") or "") or None


def pytest_collection_modifyitems(items):
    unexplained = [item.nodeid for item in items if item.get_closest_marker("slow") and not _slow_reason(item)]
    if unexplained:
        raise pytest.UsageError("a `slow` marker says why: slow(reason=...): " + ", ".join(unexplained))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test slower than SLOW_SECONDS fails unless it is marked `slow(reason=...)`;
    the time counted is its setup's, call's and teardown's, judged after its teardown."""
    report = yield
    if call.when == "setup":
        item.stash[_TAKEN] = 0.0
    item.stash[_TAKEN] = item.stash.get(_TAKEN, 0.0) + report.duration
    taken = item.stash[_TAKEN]
    allowed = limit()
    if call.when == "teardown" and report.passed and taken > allowed and _slow_reason(item) is None:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {taken:.1f} s, more than {allowed:.3g} s: make it faster, or mark it "
            "`@pytest.mark.slow(reason=...)` saying why it needs the time"
        )
    return report
