"""A service forked by a warm start has the signal dispositions of a new interpreter:
SIGPIPE ignored. Killed by it instead, a service died when it wrote to a socket whose
peer was gone (`make chaos CHAOS_ARGS=--cluster`: a ledger exited with -13 after the
PostgreSQL primary was lost)."""

from pathlib import Path

import pytest

SIGPIPE_BIT = 1 << (13 - 1)


def ignored(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)


@pytest.mark.parametrize("cold", [False, True], ids=["warm", "cold"])
def test_a_started_service_ignores_sigpipe_as_a_new_interpreter_does(sqlite_deployment, cold):
    sqlite_deployment.cold = cold
    sqlite_deployment.start("model-step")
    assert ignored(sqlite_deployment.processes["model-step"].pid) & SIGPIPE_BIT
