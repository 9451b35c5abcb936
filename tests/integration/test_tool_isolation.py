"""Python tools run in a process of their own that holds only the secrets their own
tool declares (docs/design.md, "Trust boundaries").

A hostile python tool, run by a real executor, reaches from inside its run for
everything the executor holds: its SIGNOFF_* settings, another tool's declared
secret (that tool runs in the same step), the environment of the executor's process
and of every other, the broker and database passwords and the ledger's and CLI's
keys in the keys folder, the SQLite ledger file, and the broker as the executor, to
publish a forged `tool.completed` for its own call. It gets none of it, and still
has the one secret it declares.
"""

import asyncio
import hashlib
import os
import pwd
import secrets
import signal
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import yaml

from shared.ledger.tables import Closure, ToolCall
from shared.messages import StartTurn
from shared.redaction import REDACTED
from shared.settings import PROJECT_ROOT
from shared.tool_launch import TOOLS_USER
from tests.harness import RABBITMQ_URL, SERVICES, next_event, rows
from tests.integration.test_service_users import readable_by
from tests.integration.test_supervisor import Output, ready_pids, wait_until

# What a tool's process has besides its declared variables (services/tool_executor/tools.py).
BASICS = {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME"}


def script(deployment, path, keys_dir=None) -> None:
    broker = urlsplit(RABBITMQ_URL)
    reach = {
        "keys_dir": str(keys_dir or deployment.settings.keys_path.resolve()),
        "ledger_file": str((deployment.data_dir / "ledger.db").resolve()),
        "namespace": deployment.namespace,
        "broker_host": broker.hostname,
        "broker_port": broker.port or 5672,
        "other_secret_name": "OTHER_TOOL_SECRET",
        "own_secret_name": "HOSTILE_OWN_SECRET",
    }
    path.write_text(yaml.safe_dump({"sessions": {"isolation-*": [
        {"text": "Two tools at once.", "tool_calls": [
            {"name": "holds_a_secret", "arguments": {"name": "OTHER_TOOL_SECRET"}},
            {"name": "reach_for_secrets", "arguments": reach},
        ]},
        {"text": "Done."},
    ]}, "default": [{"text": "Nothing to do."}]}))
    deployment.script_file = path


async def test_a_hostile_python_tool_reaches_none_of_the_executors_secrets_nor_another_tools_and_keeps_its_own(
        deployment, tmp_path):
    own, other = f"own-{secrets.token_hex(12)}", f"other-{secrets.token_hex(12)}"
    deployment.extra_env.update(HOSTILE_OWN_SECRET=own, OTHER_TOOL_SECRET=other)
    script(deployment, tmp_path / "script.yaml")
    deployment.start()
    session_id = f"isolation-{secrets.token_hex(6)}"
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="reach"))
        await next_event(events, "turn.completed", timeout=60)

    calls = {call.tool: call.id for call in await rows(deployment, ToolCall, session_id=session_id)}
    closures = {c.call_id: c for c in await rows(deployment, Closure, session_id=session_id)}
    hostile = closures[calls["reach_for_secrets"]]
    assert hostile.kind == "output", f"{hostile.kind}: {hostile.reason_text}"
    assert "forged" not in hostile.output, "a forged tool.completed closed the call"
    report = hostile.output["value"]
    assert report["published as the executor"] is False, "it spoke to the broker as the executor"
    assert report["settings"] == [], "it saw the executor's settings"
    assert set(report["environment"]) <= BASICS | {"HOSTILE_OWN_SECRET"}, report["environment"]
    assert report["other tool's variable seen"] is False, "it saw another tool's secret"
    assert report["files read"] == [], f"it read {report['files read']}"
    assert report["processes whose environment was read"]["with settings"] == 0, "it read the executor's environment"
    assert report["processes whose environment was read"]["with the other tool's variable"] == 0
    # Its own declared secret was there, whole.
    assert report["own variable (sha-256)"] == hashlib.sha256(own.encode()).hexdigest()

    # The other tool had its own secret (hidden in its output, as every value a tool reads).
    held = closures[calls["holds_a_secret"]]
    held_output = held.output["value"]
    assert held.kind == "output" and held_output["own"] == REDACTED
    assert set(held_output["names"]) <= BASICS | {"OTHER_TOOL_SECRET"} and "OTHER_TOOL_SECRET" in held_output["names"]


# The interpreter `signoff up` hands a process that may not enter Python's own folders
# (services/operations/service_users.py `Interpreter`): paths to its own descriptors, never a secret.
HANDED = {"PYTHONHOME", "PYTHONPATH", "LD_LIBRARY_PATH"}


@pytest.mark.skipif(os.geteuid() != 0, reason="`signoff up` gives each service its own user only as root (CI is root)")
async def test_under_signoff_up_as_root_a_hostile_python_tool_runs_as_signoff_tools_and_reads_none_of_the_executors_keys(
        up_sqlite_deployment):
    """Under `signoff up` as root the executor is `signoff-tool-executor`, not root: its
    tools are started by the root tool launcher as `signoff-tools`, never as the
    executor's user, which holds its own copies of its broker, database and Redis
    passwords (docs/design.md, "Trust boundaries")."""
    deployment = up_sqlite_deployment
    own, other = f"own-{secrets.token_hex(12)}", f"other-{secrets.token_hex(12)}"
    deployment.extra_env.update(HOSTILE_OWN_SECRET=own, OTHER_TOOL_SECRET=other)
    executors_keys = deployment.data_dir / "service-keys" / "tool-executor"
    # The services' users must read the script: beside the data folder, not in pytest's (root's alone).
    script(deployment, deployment.data_dir.parent / "script.yaml", keys_dir=executors_keys)
    (deployment.data_dir.parent / "script.yaml").chmod(0o644)
    logs = deployment.data_dir / "up-logs"
    deployment.setup()
    up = subprocess.Popen([sys.executable, "-m", "services.operations.cli", "up", "--log-dir", str(logs)], env=deployment.env(),
                          cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(up)
    try:
        await asyncio.to_thread(wait_until, lambda: all(ready_pids(logs, s) for s in SERVICES), 150, "all four ready")
        # What the tool reaches for is there, and the executor's own user reads it.
        held = [str(executors_keys / name) for name in ("rabbitmq/tool-executor.password",
                                                         "postgres/tool-executor.password")]
        held = [path for path in held if os.path.exists(path)]
        assert held and readable_by("signoff-tool-executor", held) == held
        session_id = f"isolation-{secrets.token_hex(6)}"
        async with deployment.console() as console:
            events = await console.watch(session_id)
            await console.send(StartTurn(session_id=session_id, text="reach"))
            await next_event(events, "turn.completed", timeout=60)
    finally:
        up.send_signal(signal.SIGINT)
        assert output.exit_code() == 0, output.text

    calls = {call.tool: call.id for call in await rows(deployment, ToolCall, session_id=session_id)}
    closures = {c.call_id: c for c in await rows(deployment, Closure, session_id=session_id)}
    hostile = closures[calls["reach_for_secrets"]]
    assert hostile.kind == "output", f"{hostile.kind}: {hostile.reason_text}"
    report = hostile.output["value"]
    assert report["uid"] == pwd.getpwnam(TOOLS_USER).pw_uid, "the tool ran as another user than signoff-tools"
    assert report["uid"] != pwd.getpwnam("signoff-tool-executor").pw_uid
    assert report["files read"] == [], f"it read {report['files read']}"
    assert report["published as the executor"] is False, "it spoke to the broker as the executor"
    assert report["settings"] == [], "it saw the executor's settings"
    assert set(report["environment"]) <= BASICS | HANDED | {"HOSTILE_OWN_SECRET"}, report["environment"]
    assert report["other tool's variable seen"] is False
    assert report["processes whose environment was read"]["with settings"] == 0, "it read the executor's environment"
    assert report["own variable (sha-256)"] == hashlib.sha256(own.encode()).hexdigest()
    held_output = closures[calls["holds_a_secret"]].output["value"]
    assert held_output["own"] == REDACTED and held_output["uid"] == report["uid"]
