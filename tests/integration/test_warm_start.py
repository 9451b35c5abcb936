"""Warm starts (services/operations/warm_start.py): services forked from a preloaded
interpreter behave as processes: they start, report how they ended, and a bad
start request is answered without taking the others down."""

import signal

import pytest

from tests.harness import WarmStarts


def test_a_bad_start_request_is_answered_and_the_next_start_still_works(pg_deployment):
    starts = WarmStarts()
    try:
        with pytest.raises(AssertionError, match="no service 'no-such-service'"):
            starts.start("no-such-service", pg_deployment.env(), pg_deployment.data_dir / "nothing.log")
        pg_deployment.data_dir.joinpath("logs").mkdir(parents=True)
        pg_deployment.setup()
        pg_deployment.log_path("model-step").touch()
        child = starts.start("model-step", pg_deployment.env(), pg_deployment.log_path("model-step"))
        pg_deployment.processes["model-step"] = child
        pg_deployment.wait_ready("model-step")
        assert child.poll() is None
    finally:
        pg_deployment.processes.clear()  # closing its stdin makes that launcher kill what it started
        starts.process.stdin.close()
        starts.process.wait(10)


def test_a_sigkilled_warm_service_reports_the_signal_and_a_failing_one_its_exit_status(pg_deployment):
    pg_deployment.start("model-step")
    child = pg_deployment.processes["model-step"]
    child.send_signal(signal.SIGKILL)
    assert child.wait(10) == -signal.SIGKILL

    # Settings that cannot be read end the service with status 1 and say why in its log.
    pg_deployment.extra_env["SIGNOFF_PREFETCH"] = "not a number"
    try:
        with pytest.raises(AssertionError, match="exited with 1 during start-up"):
            pg_deployment.start("model-step")
    finally:
        del pg_deployment.extra_env["SIGNOFF_PREFETCH"]  # the clean-up reads the settings too
    assert "prefetch" in pg_deployment.log_path("model-step").read_text()
