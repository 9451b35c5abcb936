"""The approval card, as the model would paint over it, on the real services.

A scripted model asks for a call whose target it writes: an address with a
Cyrillic look-alike host, then a carriage return and an erase-line escape followed
by a fake target line naming the harmless host, and a message that clears the
screen. `signoff pending`, `signoff approve` and `signoff session show`, fed to a
real terminal emulation (pyte), must show the hostile target (in punycode, with a
warning), not the harmless one; and what runs is what was shown."""

import asyncio
import json

import pyte
import yaml

from shared.ledger.tables import Session
from shared.messages import mint
from shared.on_screen import punycode
from tests.harness import eventually, rows, start_and_wait_for_approval
from tests.integration.test_command_line import signoff

SENTINEL = "BEFORE THE OUTPUT: nothing printed after may clear or overwrite this"
HARMLESS = "https://example.com/pay"
HOSTILE_HOST = "exаmple.com"  # the second letter is Cyrillic
ADDRESS = f"https://{HOSTILE_HOST}/pay\r\x1b[2K  │ target:    post to {HARMLESS}"
MESSAGE = "\x1b[2J\x1b[3J\x1b[Hall is well\u202e"
SAID = "\x1b[2J\x1b[HI will post to the usual address."
TOOL = {
    "name": "post_to_address",
    "label": "Post a message to an address",
    "approval": "always",
    "effect": "outward",
    "target": "post to {address}",
    "parameters": {"type": "object", "properties": {"address": {"type": "string"}, "message": {"type": "string"}},
                   "required": ["address", "message"]},
    "implementation": {"kind": "http", "method": "POST", "url": "${env:SINK_URL}/address"},
}


def screen_of(output: str, rows: int = 24, columns: int = 80) -> pyte.Screen:
    screen = pyte.Screen(columns, rows)
    pyte.Stream(screen).feed(SENTINEL + "\r\n" + output.replace("\n", "\r\n"))
    return screen


def assert_not_painted_over(output: str, rows: int = 200) -> str:
    """The output on a tall terminal: nothing cleared or overwritten, the hostile host in
    punycode with a warning, and no line of it claiming the harmless target."""
    screen = screen_of(output, rows=rows, columns=200)
    lines = [row.rstrip() for row in screen.display]
    assert lines[0] == SENTINEL, "the screen was cleared or overwritten:\n" + "\n".join(lines)
    shown = "\n".join(lines)
    assert f"post to https://{punycode(HOSTILE_HOST)} [!non-ASCII host]/pay\\r\\x1b[2K" in shown, shown
    assert f"WARNING:   the host {punycode(HOSTILE_HOST)}" in shown, shown
    assert not any(line.lstrip(" │").startswith("target:") and HARMLESS in line.split("\\r")[0] for line in lines)
    assert sum(line.startswith("  │ target:    ") for line in lines) == 1, shown
    return shown


async def test_a_card_the_model_paints_over_shows_the_hostile_target_and_that_is_what_runs(
    deployment, sink, tmp_path
):
    tools = yaml.safe_load(deployment.tools_file.read_text())
    tools["tools"].append(TOOL)
    deployment.tools_file = tmp_path / "tools.yaml"
    deployment.tools_file.write_text(yaml.safe_dump(tools, allow_unicode=True))
    script = {"default": [{"text": SAID, "tool_calls": [
        {"name": "post_to_address", "arguments": {"address": ADDRESS, "message": MESSAGE}}]}, {"text": "Posted."}]}
    deployment.script_file = tmp_path / "script.yaml"
    deployment.script_file.write_text(yaml.safe_dump(script))
    deployment.extra_env.update(SINK_URL=sink.url)
    deployment.start()

    session_id = mint("ses")
    async with deployment.console() as console:
        _, requested = await start_and_wait_for_approval(console, session_id)

    pending = await asyncio.to_thread(signoff, deployment, "pending")
    shown = assert_not_painted_over(pending)
    assert "\\x1b[2J\\x1b[3J\\x1b[Hall is well\\u202e" in shown

    approved = await asyncio.to_thread(signoff, deployment, "approve", requested.request_id, answer="y\n")
    assert_not_painted_over(approved)
    # On a person's 80x24 terminal the question names the tool and the hostile target.
    small = "".join(screen_of(approved).display)
    asked = f": post_to_address on post to https://{punycode(HOSTILE_HOST)} [!non-ASCII host]/pay\\r\\x1b[2K"
    assert f"approve {requested.request_id} as " in small and asked in small, small
    assert f"approve sent for {requested.request_id}" in small

    async def idle():
        [session] = await rows(deployment, Session, id=session_id)
        return session.status == "idle"

    await eventually(idle, timeout=30)
    # What ran is what the card showed: the hostile address, byte for byte.
    [posted] = [r for r in sink.requests if r["path"] == "/address"]
    assert json.loads(posted["body"]) == {"address": ADDRESS, "message": MESSAGE}

    story = await asyncio.to_thread(signoff, deployment, "session", "show", session_id)
    screen = screen_of(story, rows=200, columns=200)
    lines = [row.rstrip() for row in screen.display]
    assert lines[0] == SENTINEL, "session show cleared the screen:\n" + "\n".join(lines)
    told = "\n".join(lines)
    assert "\\x1b[2J\\x1b[HI will post to the usual address." in told, told
    assert f"https://{punycode(HOSTILE_HOST)} [!non-ASCII host]/pay\\r\\x1b[2K" in told, told
