"""Secrets never leave the executor (docs/design.md, "Trust boundaries", "Secrets").

A canary planted in a tool's arguments (a field the schema declares secret), in a
header and in the URL path (both `${env:…}` values only the executor has), and
echoed back by a failing target, is followed through a whole run: approval, the
target's failure, the model's retry, a second approval, success, and a forged
command dead-lettered. It must reach the loopback target, and nothing else: no
service log, no event, no hook body, no closure, no transcript entry, no
`signoff session show`, no dead letter.
"""

import asyncio
import json
import secrets
import subprocess
import sys

import yaml
from sqlalchemy import select

from shared.ledger.tables import Closure, HookDelivery, TranscriptRow
from shared.messages import ExecuteTool, StartTurn, mint
from shared.redaction import REDACTED
from shared.settings import PROJECT_ROOT
from tests.harness import drain_events, next_event, rows
from tests.sink import HOOK_SECRET, Sink

TOOL = {
    "name": "post_secret",
    "label": "Post to the bot with a chat key",
    "approval": "always",
    "effect": "outward",
    "parameters": {
        "type": "object",
        "properties": {"message": {"type": "string"}, "chat_key": {"type": "string", "x-signoff-secret": True}},
        "required": ["message", "chat_key"],
    },
    "implementation": {
        "kind": "http",
        "method": "POST",
        "url": "${env:SINK_URL}/bot${env:CANARY_PATH}/send",
        # An ordinary header name: its value is hidden because it is a header value, not by its name.
        "headers": {"X-Relay": "${env:CANARY_HEADER}"},
    },
}


def configure(deployment, tmp_path, sink, receiver, canary: str) -> None:
    """A catalogue with the canary tool, a script whose model uses it twice (the first
    time fails, then it retries), and a hook subscribed to everything."""
    tools = tmp_path / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": [TOOL]}))
    call = {"name": "post_secret", "arguments": {"message": "hello", "chat_key": f"{canary}-arg"}}
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"sessions": {"canary-*": [
        {"text": "Posting.", "tool_calls": [call]},
        {"text": "That failed; trying again.", "tool_calls": [call]},
        {"text": "Done."},
    ]}, "default": [{"text": "Nothing to do."}]}))
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(json.dumps({"hooks": [
        {"name": "everything", "url": f"{receiver.url}/hook", "events": ["*"], "secret": HOOK_SECRET}]}))
    deployment.tools_file = tools
    deployment.script_file = script
    deployment.extra_env.update(SINK_URL=sink.url, CANARY_PATH=f"{canary}-url", CANARY_HEADER=f"{canary}-hdr",
                                SIGNOFF_HOOKS_FILE=str(hooks))


def signoff(deployment, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "services.operations.cli", *args], env=deployment.env(), cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def echo_everything(sink) -> None:
    """The target fails, and its error repeats all it was sent: path, headers and body."""

    sink.status = 500
    sink.answer_with = lambda request: json.dumps({"error": "refused", "you sent": request}).encode()


async def test_a_canary_secret_reaches_the_target_and_nothing_else_through_approval_failure_retry_and_dead_letters(
        deployment, sink, tmp_path):
    canary = "cnry" + secrets.token_hex(8)
    receiver = Sink().__enter__()
    try:
        await run_and_look_everywhere(deployment, sink, receiver, tmp_path, canary)
    finally:
        receiver.__exit__(None, None, None)


async def run_and_look_everywhere(deployment, sink, receiver, tmp_path, canary: str) -> None:
    configure(deployment, tmp_path, sink, receiver, canary)
    echo_everything(sink)
    deployment.start()
    session_id = f"canary-{secrets.token_hex(8)}"
    path = f"/bot{canary}-url/send"
    async with deployment.console() as console, deployment.observer() as observer:
        everything = await console.watch("*")
        copies = await observer.declare_queue(exclusive=True)
        await copies.bind(f"{deployment.namespace}.commands", routing_key="tool.execute")
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="post it"))

        first = await next_event(events, "approval.requested")
        assert first.card.arguments == {"message": "hello", "chat_key": REDACTED}
        assert first.card.hidden == ["chat_key"]
        assert first.card.target == "POST ${env:SINK_URL}/bot${env:CANARY_PATH}/send"
        await console.respond(first.request_id, "approve", "", "", "tester")
        failed = await next_event(events, "tool.closed")
        assert (failed.kind, failed.reason_code) == ("error", "tool_failed")
        assert failed.reason_text.startswith("HTTP 500 from POST ${env:SINK_URL}/bot${env:CANARY_PATH}/send: ")

        # The model retries; this time the target answers.
        sink.status, sink.answer_with = 200, None
        second = await next_event(events, "approval.requested")
        await console.respond(second.request_id, "approve", "", "", "tester")
        done = await next_event(events, "tool.closed")
        assert done.kind == "output"
        await next_event(events, "turn.completed", timeout=30)

        # A stolen copy of the command, resent without the ledger's seal: refused and dead-lettered.
        real = ExecuteTool.model_validate_json((await copies.get(no_ack=True)).body)
        forged = ExecuteTool(session_id=session_id, call_id=mint("call"), tool=real.tool, arguments=real.arguments,
                             idempotency_key=mint("idk"))
        async with deployment.console(identity="publisher") as thief:
            await thief.send(forged)
        alert = await next_event(events, "operator.alerted")
        assert (alert.call_id, alert.reason_code) == (forged.call_id, "unauthorized")
        await copies.delete(if_unused=False, if_empty=False)

        seen = {"events": [event.model_dump_json() async for event in drain_events(everything, settle=1.0)]}
        assert len(seen["events"]) >= 8
        listing = await asyncio.to_thread(signoff, deployment, "dead-letters")
        assert forged.message_id in listing and "unauthorized" in listing
        seen["dead-letters listing"] = [listing]
        async with deployment.console(identity="console") as operator:
            dead = await operator.channel.get_queue(f"{deployment.namespace}.dead-letters", ensure=False)
            parked = []
            while (message := await dead.get(no_ack=True, fail=False)) is not None:
                parked.append(message.body.decode(errors="replace") + json.dumps(message.headers, default=str))
        assert any(forged.message_id in p for p in parked), "the forged command was parked"
        seen["dead letters"] = parked

    # It reached the target, each time, by every route: the call works.
    sent = [r for r in sink.requests if r["path"] == path]
    assert len(sent) == 2
    assert all(r["headers"]["X-Relay"] == f"{canary}-hdr" and json.loads(r["body"])["chat_key"] == f"{canary}-arg"
               for r in sent)

    hooks = [r for r in receiver.requests if r["path"] == "/hook"]
    assert hooks and all(r["verified"] for r in hooks), "every hook delivery verifies (signoff.hooks.verify)"
    assert {r["headers"]["Signoff-Event"] for r in hooks} >= {"approval.requested", "tool.closed", "turn.completed"}
    seen["hook bodies"] = [r["body"] for r in hooks]
    seen["hook rows"] = [d.body for d in await rows(deployment, HookDelivery)]
    seen["closures"] = [json.dumps([c.kind, c.reason_text, c.output]) for c in
                        await rows(deployment, Closure, session_id=session_id)]
    async with deployment.ledger() as sessions, sessions() as db:
        seen["transcript"] = [json.dumps(r.entry) for r in (await db.scalars(
            select(TranscriptRow).where(TranscriptRow.session_id == session_id))).all()]
    assert any("chat_key" in entry for entry in seen["transcript"])
    seen["session show"] = [await asyncio.to_thread(signoff, deployment, "session", "show", session_id)]
    seen["service logs"] = [path.read_text(errors="replace") for path in (deployment.data_dir / "logs").glob("*.log")]
    assert len(seen["service logs"]) == 4

    leaks = {where: [text[max(0, text.find(canary) - 200):text.find(canary) + 100] for text in texts
                     if canary in text] for where, texts in seen.items()}
    assert {where: found for where, found in leaks.items() if found} == {}


async def test_an_argument_the_model_added_beyond_the_schema_is_refused_before_anyone_is_asked(deployment, sink,
                                                                                                tmp_path):
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"sessions": {"extra-*": [
        {"text": "Posting, with a copy to someone.",
         "tool_calls": [{"name": "post_to_sink", "arguments": {"message": "hi", "bcc": "mallory@example.com"}}]},
        {"text": "It was refused."},
    ]}, "default": [{"text": "Nothing to do."}]}))
    deployment.script_file = script
    deployment.extra_env.update(SINK_URL=sink.url)
    deployment.start()
    session_id = f"extra-{secrets.token_hex(8)}"
    async with deployment.console() as console:
        events = await console.watch(session_id)
        await console.send(StartTurn(session_id=session_id, text="post it"))
        closed = await next_event(events, "tool.closed", "approval.requested")
        assert closed.type == "tool.closed", "nobody is asked about a call with an argument the card cannot explain"
        assert (closed.kind, closed.reason_code) == ("error", "unexpected_arguments")
        assert "'bcc'" in closed.reason_text and "mallory" not in closed.reason_text
        completed = await next_event(events, "turn.completed", timeout=30)
        assert completed.text == "It was refused."
        rest = [event.type async for event in drain_events(events)]
        assert "approval.requested" not in rest
    assert sink.counts["/sink"] == 0
    transcript = await rows(deployment, TranscriptRow, session_id=session_id)
    [closure] = [r.entry for r in transcript if r.entry.get("closure")]
    assert "takes no argument named 'bcc'" in closure["text"], "the model is told why, in its transcript"
