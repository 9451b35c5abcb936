"""A test slower than a minute fails unless a `slow(reason=...)` marker says why
(tests/slow_tests.py), judged with a limit of 0.3 s here."""

import os
import re
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]

TESTS = """
import time
import pytest

def test_quick():
    pass

def test_slow_unmarked():
    time.sleep(0.5)

@pytest.mark.slow(reason="it waits for a broker to restart")
def test_slow_marked():
    time.sleep(0.5)

def test_slow_in_its_setup(a_slow_fixture):
    pass

@pytest.fixture
def a_slow_fixture():
    time.sleep(0.5)
"""


def run(tmp_path: Path, tests: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_timed.py").write_text(tests)
    # No other plugin: pytest alone starts in a fraction of the time it takes with all of them.
    env = {
        **os.environ,
        "SIGNOFF_TEST_SLOW_SECONDS": "0.3",
        "PYTHONPATH": str(PROJECT_ROOT),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.slow_tests",
            "-q",
            "-rf",
            "-c",
            str(PROJECT_ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            *args,
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )


def test_a_test_slower_than_the_limit_fails_unless_marked_slow_with_a_reason(tmp_path):
    result = run(tmp_path, TESTS)
    assert result.returncode != 0
    assert "ERROR at teardown of test_slow_unmarked" in result.stdout
    assert "ERROR at teardown of test_slow_in_its_setup" in result.stdout
    assert re.search(
        r"test_timed.py::test_slow_unmarked took \d+\.\d s, more than 0.3 s: make it faster", result.stdout
    )
    assert re.search(r"4 passed, (\d+ warnings, )?2 errors", result.stdout)


def test_a_slow_marker_without_a_reason_is_refused(tmp_path):
    result = run(tmp_path, "import pytest\n\n@pytest.mark.slow\ndef test_x():\n    pass\n")
    assert result.returncode != 0
    assert "a `slow` marker says why" in result.stdout + result.stderr
