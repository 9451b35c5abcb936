"""`signoff up` and `signoff demo` (what `make run` runs), started as a user starts
them: a killed service is back at once and the response that waited for it is
applied once (invariant 9); Ctrl-C stops every service."""

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

from services.tool_executor.tools import tool_data_dir
from shared.messages import mint
from shared.settings import PROJECT_ROOT
from tests.harness import SERVICES, free_port, log_records, next_event, start_and_wait_for_approval


def ready_pids(log_dir, service):
    """The pids that logged `<service> ready`, in order."""
    return [line["pid"] for line in log_records(log_dir / f"{service}.log")
            if line["service"] == service and line["message"].startswith(f"{service} ready")]


def wait_until(check, timeout=60.0, what="it"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Output:
    """A child's merged stdout and stderr, read as it comes."""

    def __init__(self, process):
        self.process = process
        self.lines = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process):
        for line in process.stdout:
            self.lines.append(line)

    @property
    def text(self):
        return "".join(self.lines)

    def exit_code(self, timeout: float = 30) -> int:
        """The child's exit code once it ends; if it has not within `timeout`, it is killed
        and the test fails with what it printed (which service did not stop, say)."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"still running {timeout:.0f} s after it was told to stop:\n{self.text}") from None


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def readyz(url: str) -> int:
    try:
        return httpx.get(f"{url}/readyz", timeout=3).status_code
    except httpx.HTTPError:
        return 0


async def test_signoff_up_restarts_a_killed_ledger_at_once_and_the_waiting_response_is_applied_once(
        up_pg_deployment, sink):
    deployment = up_pg_deployment
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="tok")
    # Four metrics ports in a row, one per child: the first of four free ones.
    base = next(p for p in iter(free_port, None) if p < 65000 and all(port_free(p + i) for i in range(4)))
    deployment.extra_env["SIGNOFF_METRICS_PORT"] = str(base)
    logs = deployment.data_dir / "up-logs"
    deployment.setup()  # the tests' people registered for the CLI's channel before the ledger reads channels.yaml
    up = subprocess.Popen([sys.executable, "-m", "services.operations.cli", "up", "--log-dir", str(logs)], env=deployment.env(),
                          cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(up)
    try:
        # As root (CI), four new interpreters under their own users after setup and migrate: a cold start each.
        await asyncio.to_thread(wait_until, lambda: all(ready_pids(logs, s) for s in SERVICES), 120, "all four ready")
        for index, service in enumerate(SERVICES):  # each child on its own port, printed
            url = f"http://127.0.0.1:{base + index}"
            assert f"signoff: {service} metrics {url}/metrics, health {url}/readyz\n" in output.lines
            await asyncio.to_thread(wait_until, lambda url=url: readyz(url) == 200, 10, f"{service} /readyz")
        async with deployment.console() as console:
            events, requested = await start_and_wait_for_approval(console, mint("ses"))
            [ledger] = ready_pids(logs, "approval-ledger")
            os.kill(ledger, signal.SIGKILL)
            await console.respond(requested.request_id, "approve", "", "", "tester")
            completed = await next_event(events, "turn.completed", timeout=30)
            assert completed.text == "Posted."
        await asyncio.to_thread(wait_until, lambda: len(ready_pids(logs, "approval-ledger")) == 2, 30, "a new ledger")
        # Killed again at once: it had been ready and working, so it is no crash loop and gets no backoff.
        os.kill(ready_pids(logs, "approval-ledger")[-1], signal.SIGKILL)
        await asyncio.to_thread(wait_until, lambda: len(ready_pids(logs, "approval-ledger")) == 3, 30, "a third ledger")
        restarts = [line for line in output.lines if line.startswith("signoff: approval-ledger exited")]
        assert restarts == [f"signoff: approval-ledger exited with -9; restarting (log: {logs}/approval-ledger.log)\n"] * 2
        assert sink.counts["/sink"] == 1, "the approved call ran once"
        # The restarted ledger serves on its port again.
        await asyncio.to_thread(wait_until, lambda: readyz(f"http://127.0.0.1:{base}") == 200, 30, "the new ledger's /readyz")
    finally:
        up.send_signal(signal.SIGINT)
        assert output.exit_code() == 0, output.text
    assert all(gone(pid) for s in SERVICES for pid in ready_pids(logs, s)), "Ctrl-C left a service running"


def test_make_run_drives_one_session_through_an_approval_and_sigterm_stops_every_service(up_sqlite_deployment):
    # SIGTERM, what `docker stop` and a plain `kill` (of a run under nohup) send; Ctrl-C
    # (SIGINT) stops it the same way (tests/integration/test_inbox_browser.py).
    # What `make run` runs, with its own tools and script (deploy/), on SQLite, the default.
    env = {k: v for k, v in up_sqlite_deployment.env().items() if k not in ("SIGNOFF_TOOLS_FILE", "SIGNOFF_SCRIPT_FILE")}
    demo = subprocess.Popen([sys.executable, "-m", "services.operations.cli", "demo"], env=env, cwd=PROJECT_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(demo)
    try:
        wait_until(lambda: "Ctrl-C stops the services." in output.text or demo.poll() is not None, 180,
                   "the demo's end")
        assert demo.poll() is None, output.text
        text = output.text
        assert "approval needed: Publish a blog post" in text and "request:   apr_" in text
        # The scripted model's post is titled after what the demo asked for.
        assert "target:    blog post 'Release notes for version 1.2'" in text
        assert "tool ran once and closed as output" in text and "final answer: Done" in text
        published = tool_data_dir(up_sqlite_deployment.data_dir) / "published"
        assert list(published.glob("*.md")), "the approved post was written"
        # The gateway's URL and a login that works: curl lists a pending card and approves it.
        url, name, password = re.search(r"The HTTP gateway: (http://\S+)\s+\(login: (\S+) / (\S+);", text).groups()
        jar = up_sqlite_deployment.data_dir / "test.cookies"

        def curl(*arguments: str) -> dict:
            done = subprocess.run(["curl", "-sS", "-b", str(jar), "-c", str(jar), *arguments], capture_output=True,
                                  text=True, timeout=30, check=True)
            return json.loads(done.stdout) if done.stdout.strip() else {}

        csrf = curl("-H", "Content-Type: application/json", "-d", json.dumps({"name": name, "password": password}),
                    f"{url}/v1/login")["csrf_token"]
        changing = ("-H", f"X-CSRF-Token: {csrf}", "-H", "Content-Type: application/json")
        session_id = curl(*changing, "-d", '{"text": "Publish the notes for 1.3"}', f"{url}/v1/sessions")["session_id"]
        wait_until(lambda: curl(f"{url}/v1/requests?status=pending&session_id={session_id}")["requests"], 30,
                   "the card on the gateway")
        [card] = curl(f"{url}/v1/requests?status=pending&session_id={session_id}")["requests"]
        assert (card["tool"], card["arguments"]["title"]) == ("publish_post", "Notes for 1.3")
        verdict = curl(*changing, "-H", "Idempotency-Key: make-run", "-d", '{"decision": "approve"}',
                       f"{url}/v1/requests/{card['id']}/decision")
        assert (verdict["outcome"], verdict["responder"], verdict["decided"]) == ("accepted", name, True)
        wait_until(lambda: curl(f"{url}/v1/sessions/{session_id}")["status"] == "idle", 30, "the session's answer")
    finally:
        demo.send_signal(signal.SIGTERM)
        assert output.exit_code() == 0, output.text
    logs = up_sqlite_deployment.data_dir / "logs"
    pids = [pid for s in SERVICES for pid in ready_pids(logs, s)]
    assert len(pids) == 4 and all(gone(pid) for pid in pids), "SIGTERM left a service running"


@__import__("pytest").mark.parametrize("single_user", [False, True], ids=["own-users", "single-user"])
def test_a_supervisor_killed_with_sigkill_leaves_no_service_running(up_sqlite_deployment, single_user):
    deployment = up_sqlite_deployment
    deployment.extra_env["SIGNOFF_METRICS_PORT"] = "0"
    if single_user:
        deployment.extra_env["SIGNOFF_SINGLE_USER"] = "true"
    logs = deployment.data_dir / "up-logs"
    deployment.setup()
    up = subprocess.Popen([sys.executable, "-m", "services.operations.cli", "up", "--log-dir", str(logs)], env=deployment.env(),
                          cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(up)
    try:
        wait_until(lambda: all(ready_pids(logs, s) for s in SERVICES) or up.poll() is not None, 120, "all four ready")
        assert up.poll() is None, output.text
    finally:
        up.kill()  # SIGKILL: no handler runs, nothing is stopped in order
        output.exit_code()
    pids = [pid for s in SERVICES for pid in ready_pids(logs, s)]
    assert len(pids) == 4, output.text
    if not single_user:  # and the tool launcher it started as root, which starts python tools
        [launcher] = re.findall(r"tool-launcher ready .*\(pid (\d+)\)", (logs / "tool-launcher.log").read_text())
        pids.append(int(launcher))
    wait_until(lambda: all(gone(pid) for pid in pids), 30, "every service ending with its supervisor")


def test_signoff_up_started_with_sigint_ignored_still_stops_its_services_on_sigint(up_sqlite_deployment):
    """A shell without job control (a script's `signoff up &`, a CI runner) starts a background
    command with SIGINT ignored, and Python keeps it ignored: `kill -INT` then did nothing, and
    the supervisor and its services ran on after the tests that stopped them."""
    deployment = up_sqlite_deployment
    deployment.extra_env.update(SIGNOFF_METRICS_PORT="0", SIGNOFF_SINGLE_USER="true")
    logs = deployment.data_dir / "up-logs"
    deployment.setup()
    up = subprocess.Popen([sys.executable, "-m", "services.operations.cli", "up", "--log-dir", str(logs)], env=deployment.env(),
                          cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    output = Output(up)
    try:
        wait_until(lambda: all(ready_pids(logs, s) for s in SERVICES) or up.poll() is not None, 120, "all four ready")
        assert up.poll() is None, output.text
    finally:
        up.send_signal(signal.SIGINT)
        code = output.exit_code()
    assert code == 0, output.text
    pids = [pid for s in SERVICES for pid in ready_pids(logs, s)]
    assert len(pids) == 4 and all(gone(pid) for pid in pids), "SIGINT left a service running"
