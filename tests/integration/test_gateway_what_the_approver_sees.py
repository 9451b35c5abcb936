"""What a person sees through the gateway, on both stores: a card's target shows where
the call goes (the tools file's `shown_env` values resolved, user-info and query values
still hidden, a variable not named there left as written); HEAD answers as GET does,
without a body."""

from __future__ import annotations

import asyncio

import yaml

from tests.gateway_client import GatewayClient
from tests.integration.test_gateway import add_people, pending_card, url

SHOWN_BASE = "http://deploy:s3cret-pass@sink.example:8443/api"
TOOL = {
    "name": "post_shown",
    "label": "Post to a shown base URL",
    "approval": "always",
    "effect": "outward",
    "parameters": {"type": "object", "properties": {"message": {"type": "string"}}},
    "implementation": {"kind": "http", "method": "POST", "url": "${env:SHOWN_BASE}/reviewed?key=${env:HIDDEN_KEY}"},
}


async def test_a_cards_target_shows_the_resolved_url_with_its_credentials_hidden(deployment, sink, tmp_path):
    tools = yaml.safe_load(deployment.tools_file.read_text())
    tools["tools"].append(TOOL)
    tools["shown_env"] = ["SHOWN_BASE"]
    deployment.tools_file = tmp_path / "tools.yaml"
    deployment.tools_file.write_text(yaml.safe_dump(tools))
    script = {"default": [{"text": "posting", "tool_calls": [{"name": "post_shown", "arguments": {"message": "hi"}}]}]}
    deployment.script_file = tmp_path / "script.yaml"
    deployment.script_file.write_text(yaml.safe_dump(script))
    deployment.extra_env.update(SINK_URL=sink.url, SHOWN_BASE=SHOWN_BASE, HIDDEN_KEY="hidden-key-value")
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    async with GatewayClient(url(deployment)) as alice:
        await alice.login("alice")
        started = await alice.post("/v1/sessions", {"text": "post hi"})
        assert started.status_code == 202, started.text
        card = await pending_card(alice, started.json()["session_id"])
        page = (await alice.get(f"/inbox/requests/{card['id']}")).text
    assert card["target"] == "POST http://***redacted***@sink.example:8443/api/reviewed?key=***redacted***"
    assert "sink.example:8443/api/reviewed" in page
    for secret in ("s3cret-pass", "hidden-key-value", "${env:SHOWN_BASE}"):
        assert secret not in card["target"] and secret not in page


async def test_head_answers_as_get_does_without_a_body_pages_and_event_stream_alike(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    async with GatewayClient(url(deployment)) as alice:
        for path in ("/inbox", "/inbox/login", "/healthz"):
            got, head = await alice.get(path), await alice.http.head(path, headers=alice.headers(csrf=False))
            assert (head.status_code, head.content) == (got.status_code, b""), path
            assert head.headers.get("content-type") == got.headers.get("content-type"), path
        await alice.login("alice")
        got = await alice.get("/inbox")
        head = await alice.http.head("/inbox", headers=alice.headers(csrf=False))
        assert (got.status_code, head.status_code, head.content) == (200, 200, b"")
        # The event stream never ends for a GET; its HEAD ends after the headers.
        async with asyncio.timeout(10):
            head = await alice.http.head("/v1/events", headers=alice.headers(csrf=False))
        assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")
