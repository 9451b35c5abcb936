"""`signoff up` when RabbitMQ's management API is briefly away (it may start after the
broker): it says so once, retries each second and goes on when the API answers; one
that never answers within SIGNOFF_MANAGEMENT_WAIT_SECONDS ends `up` with a short error
naming it and its URL without the password, never a traceback."""

import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

from shared.settings import PROJECT_ROOT
from tests.harness import RABBITMQ_ADMIN_URL, free_port
from tests.integration.test_supervisor import Output, wait_until

SECRET = "s3cret-admin-pw"


class LateForwarder:
    """A port that refuses connections until `open`, then forwards each to `target`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.port = free_port()
        self.target = target
        self.server: socket.socket | None = None

    def open(self) -> None:
        self.server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def up(deployment) -> tuple[subprocess.Popen, Output]:
    process = subprocess.Popen(
        [sys.executable, "-m", "services.operations.cli", "up", "--log-dir", str(deployment.data_dir / "up-logs")],
        env=deployment.env(), cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, Output(process)


def test_signoff_up_waits_for_a_management_api_that_answers_late_and_then_runs_the_services(up_sqlite_deployment):
    deployment = up_sqlite_deployment
    deployment.extra_env.update(SIGNOFF_METRICS_PORT="0", SIGNOFF_SINGLE_USER="true")
    deployment.setup()  # as the harness's administrator; `up`'s own setup then goes through the late port
    admin = urlsplit(RABBITMQ_ADMIN_URL)
    late = LateForwarder((admin.hostname, admin.port))
    url = f"http://{admin.username}:{admin.password}@127.0.0.1:{late.port}/"
    deployment.extra_env["SIGNOFF_RABBITMQ_ADMIN_URL"] = url
    process, output = up(deployment)
    try:
        wait_until(lambda: "does not answer" in output.text or process.poll() is not None, 60, "the wait")
        time.sleep(2.5)  # a few of its retries refused too
        assert process.poll() is None, output.text
        late.open()
        wait_until(lambda: "services running" in output.text or process.poll() is not None, 120, "the services")
        assert process.poll() is None, output.text
        shown = f"http://{admin.username}@127.0.0.1:{late.port}/"
        waiting = [line for line in output.lines if "does not answer" in line]
        assert waiting == [f"signoff up: RabbitMQ's management API at {shown} does not answer "
                           "(ConnectError: [Errno 111] Connection refused); retrying each second for up to 60 s\n"], (
            output.text)
        assert f"signoff up: RabbitMQ's management API at {shown} answers\n" in output.lines
        assert "Traceback" not in output.text
    finally:
        process.send_signal(signal.SIGINT)
        code = output.exit_code()
        late.close()
        del deployment.extra_env["SIGNOFF_RABBITMQ_ADMIN_URL"]  # the clean-up removes the users through the real one
    assert code == 0, output.text


def test_signoff_up_gives_up_on_a_management_api_that_never_answers_naming_it_without_its_password(
        up_sqlite_deployment):
    deployment = up_sqlite_deployment
    port = free_port()
    deployment.extra_env.update(SIGNOFF_METRICS_PORT="0", SIGNOFF_SINGLE_USER="true",
                                SIGNOFF_RABBITMQ_ADMIN_URL=f"http://admin:{SECRET}@127.0.0.1:{port}/",
                                SIGNOFF_MANAGEMENT_WAIT_SECONDS="2")
    started = time.monotonic()
    process, output = up(deployment)
    code = process.wait(60)
    time.sleep(0.1)  # the last lines read
    said = output.text
    assert code == 1 and time.monotonic() - started >= 2.0, said
    assert said.rstrip().endswith(
        f"signoff up: RabbitMQ's management API at http://admin@127.0.0.1:{port}/ did not answer within 2 s "
        "(ConnectError: [Errno 111] Connection refused); enable it (`rabbitmq-plugins enable rabbitmq_management`) "
        "or set SIGNOFF_RABBITMQ_ADMIN_URL"), said
    assert SECRET not in said and "Traceback" not in said, said
    assert not (deployment.data_dir / "up-logs" / "approval-ledger.log").exists(), "no service was started"


def test_signoff_up_whose_setup_fails_says_so_without_a_traceback(up_sqlite_deployment):
    deployment = up_sqlite_deployment
    admin = urlsplit(RABBITMQ_ADMIN_URL)
    # It answers, and refuses this login: no wait, setup names it, `up` stops there.
    deployment.extra_env.update(
        SIGNOFF_METRICS_PORT="0", SIGNOFF_SINGLE_USER="true",
        SIGNOFF_RABBITMQ_ADMIN_URL=f"http://{admin.username}:{SECRET}@{admin.hostname}:{admin.port}/")
    process, output = up(deployment)
    code = process.wait(60)
    time.sleep(0.1)
    said = output.text
    assert code == 1 and "does not answer" not in said, said
    assert f"signoff setup: cannot use RabbitMQ's management API at http://{admin.username}@{admin.hostname}:" in said
    assert "401" in said and SECRET not in said and "Traceback" not in said, said
    assert said.rstrip().endswith("signoff up: `signoff setup` failed (its error is above); no service was started")
