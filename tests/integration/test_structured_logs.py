"""Structured logs on the real services (shared/logs.py): every line a service
writes to its log is a JSON object naming the service, and every line about a
message names the message and its session, so one filter follows a session."""

import json
import socket
import subprocess
import sys

import aio_pika

from shared.messages import RespondToApproval, mint
from shared.settings import PROJECT_ROOT
from tests.harness import SERVICES, eventually, log_records, next_event, start_and_wait_for_approval


async def test_every_log_line_is_json_naming_its_service_and_every_message_line_names_the_message(
    sqlite_deployment, sink
):
    deployment = sqlite_deployment
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.extra_env["SINK_TOKEN"] = "tok-never-logged"
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        bogus = console.sign(RespondToApproval(session_id=session_id, request_id=mint("apr"), decision="approve",
                                               args_digest=requested.args_digest))
        await console.send(bogus)
        assert (await next_event(events, "message.rejected")).rejected_message_id == bogus.message_id
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "turn.completed")
        exchange = await console.channel.get_exchange(f"{deployment.namespace}.channels")
        await exchange.publish(
            aio_pika.Message(b'{"type": "approval.respond", "session_id": "%s", "request_id": 5}' % session_id.encode(),
                             message_id="msg_unreadable"),
            routing_key="approval.respond")

        async def dead_lettering_logged():
            return any("dead-lettering msg_unreadable" in line["message"]
                       for line in log_records(deployment.log_path("approval-ledger")))
        await eventually(dead_lettering_logged)
    deployment.stop_all()

    about_messages = []
    for service in SERVICES:
        records = log_records(deployment.log_path(service))  # raises on any line that is not JSON
        assert records, f"{service} logged nothing"
        for record in records:
            assert record["service"] == service and record["level"] and record["time"] and record["message"]
            if "message_id" in record:
                assert record.get("session_id"), f"a line about a message names no session: {record}"
                about_messages.append(record)
        assert any(r["message"].startswith(f"{service} ready") for r in records)

    rejected = [r for r in about_messages if r["message"].startswith("rejected ")]
    assert [(r["service"], r["message_type"], r["message_id"], r["session_id"]) for r in rejected] == [
        ("approval-ledger", "approval.respond", bogus.message_id, session_id)]
    dead = [r for r in about_messages if "dead-lettering msg_unreadable" in r["message"]]
    assert [(r["level"], r["message_id"], r["session_id"]) for r in dead] == [("WARNING", "msg_unreadable", session_id)]
    ran = [r for r in about_messages if r["service"] == "tool-executor" and r["message"].startswith("call ")]
    assert [(r["message"].split(": ", 1)[1], r["message_type"], r["session_id"], bool(r["causation_id"]))
            for r in ran] == [("post_to_sink ran: output", "tool.execute", session_id, True)]
    secret = deployment.env()["SINK_TOKEN"]
    for service in SERVICES:
        assert secret not in deployment.log_path(service).read_text(), f"{service} logged the tool's secret"


def test_a_service_that_cannot_start_says_why_in_a_json_line(sqlite_deployment):
    env = sqlite_deployment.env()
    env["SIGNOFF_RABBITMQ_URL"] = f"amqp://127.0.0.1:{closed_port()}/"
    run = subprocess.run([sys.executable, "-m", "services.operations.cli", "run", "model-step"], env=env, cwd=PROJECT_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    records = [json.loads(line) for line in run.stderr.splitlines()]  # raises on any line that is not JSON
    assert records[-1]["level"] == "CRITICAL" and records[-1]["service"] == "model-step"
    assert records[-1]["message"].startswith("signoff: cannot reach RabbitMQ at 127.0.0.1:")


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_following_one_session_by_its_id_at_info_shows_each_ledger_transition_and_each_model_step(
    sqlite_deployment, sink
):
    deployment = sqlite_deployment
    deployment.extra_env.update(SINK_URL=sink.url, SINK_TOKEN="t")
    deployment.start()
    session_id = mint("ses")
    async with deployment.console() as console:
        events, requested = await start_and_wait_for_approval(console, session_id)
        refused = console.sign(RespondToApproval(session_id=session_id, request_id=requested.request_id,
                                                 decision="approve", args_digest="hmac-sha256:" + "0" * 64))
        await console.send(refused)
        assert (await next_event(events, "message.rejected")).rejected_message_id == refused.message_id
        await console.respond(requested.request_id, "approve", "", "", "tester")
        await next_event(events, "turn.completed")

    def about_the_session(service: str) -> list[str]:
        return [r["message"] for r in log_records(deployment.log_path(service))
                if r["level"] == "INFO" and session_id in r["message"]]

    async def all_logged():
        applied = [m.split()[1] for m in about_the_session("approval-ledger") if m.startswith("applied ")]
        return applied == ["turn.start", "step.completed", "approval.respond", "tool.completed", "step.completed"]
    await eventually(all_logged)
    ledger = about_the_session("approval-ledger")
    assert any(m.startswith("applied approval.respond") and m.endswith(f"session {session_id} is running")
               for m in ledger), ledger
    steps = [m for m in about_the_session("model-step") if m.startswith(f"session {session_id} step ")]
    assert len(steps) == 2 and all(" answered after 1 attempt(s) of scripted; " in m for m in steps), steps
    assert steps[0].endswith("; 1 tool call(s)") and steps[1].endswith("; 0 tool call(s)")
