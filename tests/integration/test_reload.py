"""`signoff reload` (and SIGHUP to `signoff up`): every service that reads the tools file
reads it again; a file that cannot be used is refused whole, naming the tool, and the
catalogue in use stays."""

import asyncio
import json
import os
import signal
import subprocess
import sys

from shared.messages import StartTurn, mint
from shared.settings import PROJECT_ROOT
from tests.harness import SERVICES, next_event
from tests.integration.test_supervisor import Output, ready_pids, wait_until

READING = ("approval-ledger", "tool-executor", "gateway")


def reload(env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "services.operations.cli", "reload"],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def said(logs, service, start: str) -> list[str]:
    lines = (logs / f"{service}.log").read_text().splitlines()
    return [m for m in (json.loads(line).get("message", "") for line in lines) if m.startswith(start)]


async def test_signoff_reload_takes_a_new_tools_file_and_refuses_a_bad_one_whole_keeping_the_old(
    up_sqlite_deployment, sink
):
    deployment = up_sqlite_deployment
    original = (PROJECT_ROOT / "tests" / "fixtures" / "tools.yaml").read_text()
    assert "    approval: always\n    effect: outward\n" in original
    tools = deployment.data_dir.parent / "tools.yaml"
    tools.write_text(original)
    tools.chmod(0o644)
    deployment.tools_file = tools
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="tok", SIGNOFF_METRICS_PORT="0")
    logs = deployment.data_dir / "up-logs"
    deployment.setup()
    env = deployment.env()
    up = subprocess.Popen(
        [sys.executable, "-m", "services.operations.cli", "up", "--log-dir", str(logs)],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = Output(up)
    try:
        await asyncio.to_thread(
            wait_until,
            lambda: all(ready_pids(logs, s) for s in (*SERVICES, "gateway")) or up.poll() is not None,
            150,
            "every service ready",
        )
        assert up.poll() is None, output.text

        # A bad file: the CLI refuses it, naming the tool, and asks no service anything.
        tools.write_text(
            original.replace(
                "    approval: always\n    effect: outward\n", "    approval: sometimes\n    effect: outward\n", 1
            )
        )
        refused = reload(env)
        assert refused.returncode == 1 and "tool 'post_to_sink': approval" in refused.stderr, refused
        assert "nothing was reloaded" in refused.stderr
        # Sent anyway (`kill -HUP`): each service refuses it whole, naming the tool, and keeps its catalogue.
        os.kill(up.pid, signal.SIGHUP)
        for service in READING:
            await asyncio.to_thread(
                wait_until,
                lambda s=service: said(logs, s, "tools file not reloaded"),
                10,
                f"{service} refusing the file",
            )
            [line] = said(logs, service, "tools file not reloaded")
            assert "tool 'post_to_sink': approval" in line and "the catalogue in use is kept" in line
        async with deployment.console() as console:
            kept = mint("ses")
            events = await console.watch(kept)
            await console.send(StartTurn(session_id=kept, text="go"))
            asked = await next_event(events, "approval.requested", "turn.completed", timeout=30)
            assert asked.type == "approval.requested", "the old catalogue (approval: always) still holds"

            # A good file: every service takes it; the tool now runs without asking.
            tools.write_text(
                original.replace(
                    "    approval: always\n    effect: outward\n", "    approval: never\n    effect: outward\n", 1
                )
            )
            taken = reload(env)
            assert taken.returncode == 0, taken
            for service in READING:
                assert f"  {service}: tools file reloaded:" in taken.stdout, taken.stdout
            assert "  model-step: providers reloaded: scripted" in taken.stdout, taken.stdout
            fresh = mint("ses")
            events = await console.watch(fresh)
            await console.send(StartTurn(session_id=fresh, text="go"))
            ended = await next_event(events, "approval.requested", "turn.completed", timeout=30)
            assert ended.type == "turn.completed", "the new catalogue (approval: never) holds"
        assert sink.counts["/sink"] == 1
        restarts = [line for line in output.lines if "restarting" in line]
        assert restarts == [], "a reload restarts nothing"
    finally:
        up.send_signal(signal.SIGINT)
        assert output.exit_code() == 0, output.text
