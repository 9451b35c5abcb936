"""`signoff demo` (`make run`): the services started, one session driven through an
approval to its final answer, and the inbox's login printed."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import time

from services.gateway import admin as gateway
from services.operations.cards import print_card
from services.operations.console import Console
from services.operations.supervisor import Supervisor
from shared import keyring
from shared.messages import EVENT, StartTurn, mint
from shared.on_screen import FIELD_CHARS, TEXT_CHARS, json_inline, visible
from shared.settings import Settings


def demo_login(settings: Settings) -> tuple[str, str]:
    """A login that works on the gateway: the user `demo` (an operator) with a password made
    once and kept beside the gateway's keys (0600), so each `make run` prints the same one.
    Made before the services start: under `signoff up` as root the ledger holds a copy of
    the channel registry that lists the gateway's users."""
    saved = settings.keys_path / "gateway" / "demo.password"
    if "demo" in gateway.user_names(settings) and saved.exists():
        return "demo", saved.read_text().strip()
    password = secrets.token_urlsafe(15)
    gateway.add_user(settings, "demo", password, [], True)
    saved.unlink(missing_ok=True)
    saved.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(password + "\n")
    return "demo", password


def gateway_lines(settings: Settings, name: str, password: str) -> list[str]:
    url = gateway.url(settings)
    jar = settings.data_dir.resolve() / "gateway.cookies"
    login = json.dumps({"name": name, "password": password})
    return [
        f"The inbox: {url}/inbox  (log in as {name} / {password}; ask the agent, approve its card, watch it run)",
        f"The HTTP gateway: {url}  (login: {name} / {password}; API: {url}/v1/openapi.json)",
        f"  curl -s -c {jar} -H 'Content-Type: application/json' -d '{login}' {url}/v1/login"
        "   # answers the csrf_token",
        f"  curl -s -b {jar} '{url}/v1/requests?status=pending'",
        f"  curl -s -b {jar} -H 'X-CSRF-Token: <csrf_token>' -H 'Idempotency-Key: 1' -H 'Content-Type: "
        f'application/json\' -d \'{{"decision": "approve"}}\' {url}/v1/requests/apr_…/decision',
        f"  curl -sN -b {jar} {url}/v1/events   # the event stream",
    ]


def wait_for_gateway(settings: Settings, timeout: float = 120.0) -> bool:
    """Until the gateway answers (it imports more than the others, so it may start last)."""
    import httpx

    url = gateway.url(settings)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    print(f"signoff: the gateway did not answer within {timeout:.0f}s; see {settings.data_dir / 'logs'}")
    return False


def demo(settings: Settings) -> int:
    supervisor = Supervisor(settings)
    name, password = demo_login(settings)
    print(f"signoff: starting the four services and the gateway (logs in {supervisor.log_dir})…", flush=True)
    supervisor.start()
    try:
        code = asyncio.run(_drive_demo(settings))
        if code != 0:
            return code
        print()
        wait_for_gateway(settings)
        for line in gateway_lines(settings, name, password):
            print(line)
        print("\nThe services keep running. In another terminal, with the same environment:")
        print("  .venv/bin/signoff session start 'Publish the notes for 1.3' --wait   # prints the session id")
        print("  .venv/bin/signoff pending                                           # shows the approval card")
        print("  .venv/bin/signoff approve apr_…   (shows the card, asks y/N; or: signoff deny apr_… --reason '…')")
        print("  .venv/bin/signoff session show ses_…")
        print("Ctrl-C stops the services.", flush=True)
        while True:
            time.sleep(supervisor.WATCH_SECONDS)
            supervisor.watch()
    except KeyboardInterrupt:
        print("\nsignoff: stopping", flush=True)
        return 0
    finally:
        supervisor.stop()


async def _drive_demo(settings: Settings, timeout: float = 60.0) -> int:
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.2f}s] {text}", flush=True)

    session_id = mint("ses")
    async with Console(settings) as console:
        queue = await console.watch(session_id)
        say(f"session {session_id}: asking the agent to publish the release notes")
        person = keyring.os_user()  # whom `signoff setup` registered the CLI's channel for
        text = "Please publish the release notes for version 1.2."
        await console.send(StartTurn(session_id=session_id, text=text, started_by=person))
        try:
            async with asyncio.timeout(timeout):
                async with queue.iterator() as messages:
                    async for raw in messages:
                        async with raw.process():
                            event = EVENT.validate_json(raw.body)
                        if event.type == "approval.requested":
                            say("the model asked for a tool that needs approval; the card a person sees:")
                            print_card(event.request_id, event.card.model_dump(), event.args_digest)
                            say(f"session is waiting on {', '.join(event.pending_request_ids)}")
                            # What `signoff approve` does once a person has read this card and said yes.
                            say(f"approving {event.request_id}")
                            await console.respond(event.request_id, "approve", "", "", person)
                        elif event.type == "approval.decided":
                            say(f"decision committed: {event.decision} by {visible(event.responder, FIELD_CHARS)}")
                        elif event.type == "tool.closed":
                            closure = await console.ledger.closure(event.call_id)
                            # Published from the same transaction that wrote the closure: it is there.
                            assert closure is not None
                            if event.kind == "output":
                                said = json_inline((closure.output or {}).get("value"))
                                say(f"tool ran once and closed as output: {said}")
                            else:  # what went wrong, not a bare null
                                said = visible(closure.reason_text or closure.reason_code or "", TEXT_CHARS)
                                say(f"tool closed as {event.kind}: {said}")
                        elif event.type == "turn.completed":
                            say(f"final answer: {visible(event.text, TEXT_CHARS)}")
                            return 0
                        elif event.type in ("turn.failed", "message.rejected"):
                            say(f"{event.type}: {visible(event.reason_text, TEXT_CHARS)}")
                            return 1
        except TimeoutError:
            print(
                f"signoff: no answer within {timeout:.0f}s; see the logs in {settings.data_dir / 'logs'}",
                file=sys.stderr,
            )
            return 1
    return 1
