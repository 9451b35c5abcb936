"""`signoff up` when a port it needs is held (a second deployment on one machine): the
service says so once, naming the setting that moves it, and `signoff up` stops with a
non-zero code instead of restarting it forever."""

import json
import socket
import subprocess
import sys
import time

import pytest

from shared.observability import CANNOT_START
from shared.settings import PROJECT_ROOT
from tests.harness import free_port
from tests.integration.test_supervisor import Output, port_free


def held_port(port: int) -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


@pytest.mark.parametrize("what", ["gateway", "metrics"])
def test_signoff_up_stops_saying_once_which_port_is_held_and_every_line_it_logged_is_one_json_object(
    up_sqlite_deployment, what
):
    deployment = up_sqlite_deployment
    base = next(p for p in iter(free_port, None) if p < 65000 and all(port_free(p + i) for i in range(5)))
    deployment.extra_env["SIGNOFF_METRICS_PORT"] = str(base)
    if what == "gateway":
        port, setting = deployment.gateway_port, "SIGNOFF_GATEWAY_PORT"
    else:
        port, setting = base + 2, "SIGNOFF_METRICS_PORT"  # the model-step's metrics port
    logs = deployment.data_dir / "up-logs"
    deployment.setup()
    with held_port(port):
        up = subprocess.Popen(
            [sys.executable, "-m", "services.operations.cli", "up", "--log-dir", str(logs)],
            env=deployment.env(),
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output = Output(up)
        try:
            # Setup, migrate and the services' first start (each a new interpreter as root) come first.
            code = up.wait(120)
        except subprocess.TimeoutExpired:
            up.kill()
            raise AssertionError(f"signoff up did not stop:\n{output.text}") from None
        time.sleep(0.2)  # the reader's last lines
    assert code == CANNOT_START, output.text
    said = [line for line in output.lines if f"cannot listen on 127.0.0.1:{port}" in line]
    assert len(said) == 1, output.text
    assert setting in said[0] and "another process holds it" in said[0] and said[0].startswith("signoff up:")
    assert not [line for line in output.lines if "restarting" in line], output.text
    # The tool launcher (started first, as root) included: one JSON object a line, as the README says.
    assert (logs / "tool-launcher.log").read_text().strip()
    for log in logs.glob("*.log"):
        for line in log.read_text().splitlines():
            assert isinstance(json.loads(line), dict), f"{log.name}: {line}"
