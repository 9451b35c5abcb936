"""A loopback fake of Slack: the Web API methods the Slack channel calls, answered as Slack
answers them and recorded, and signed interaction posts as Slack sends them."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
from typing import Any
from urllib.parse import urlencode

import httpx
from aiohttp import web

from tests.harness import free_port

TEAM = "T0SIGNOFF"


class FakeSlack:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self._ts = itertools.count(1)
        self.port = free_port()
        # Set: chat.postMessage records the message, then waits before it answers (a crash mid-post).
        self.hold_posts = False
        self._runner: web.AppRunner | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def called(self, method: str) -> list[dict[str, Any]]:
        return [params for name, params in self.calls if name == method]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            params.update(await request.json())
        elif request.can_read_body:
            params.update(dict(await request.post()))
        for name in ("blocks", "metadata", "view"):
            if isinstance(params.get(name), str):
                params[name] = json.loads(params[name])
        if not request.headers.get("Authorization", "").startswith("Bearer xoxb-"):
            return web.json_response({"ok": False, "error": "not_authed"})
        self.calls.append((method, params))
        return web.json_response(await self._answer(method, params))

    async def _answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "auth.test":
            return {
                "ok": True,
                "url": "https://fake.slack.com/",
                "team": "Fake",
                "user": "signoff",
                "team_id": TEAM,
                "user_id": "UBOT",
                "bot_id": "BBOT",
                "is_enterprise_install": False,
            }
        if method == "chat.postMessage":
            ts = f"{int(time.time())}.{next(self._ts):06d}"
            message = {
                "ts": ts,
                "text": params.get("text"),
                "blocks": params.get("blocks"),
                "metadata": params.get("metadata"),
            }
            self.messages[(params["channel"], ts)] = message
            while self.hold_posts:
                await asyncio.sleep(0.05)
            return {"ok": True, "channel": params["channel"], "ts": ts, "message": message}
        if method == "chat.update":
            key = (params["channel"], params["ts"])
            if key not in self.messages:
                return {"ok": False, "error": "message_not_found"}
            self.messages[key].update(text=params.get("text"), blocks=params.get("blocks"))
            return {"ok": True, "channel": params["channel"], "ts": params["ts"], "text": params.get("text")}
        if method == "conversations.history":
            oldest = float(params.get("oldest") or 0)
            found = [
                dict(m)
                for (channel, ts), m in self.messages.items()
                if channel == params["channel"] and float(ts) >= oldest
            ]
            return {"ok": True, "messages": sorted(found, key=lambda m: m["ts"], reverse=True), "has_more": False}
        if method == "conversations.open":  # the app's direct messages with a person
            return {"ok": True, "channel": {"id": "D" + params["users"]}}
        if method == "views.open":
            return {"ok": True, "view": {"id": "V" + params["trigger_id"], **params.get("view", {})}}
        if method == "chat.postEphemeral":
            return {"ok": True, "message_ts": f"{int(time.time())}.{next(self._ts):06d}"}
        return {"ok": False, "error": "unknown_method"}

    def messages_of(self, request_id: str) -> dict[str, dict[str, Any]]:
        """The card's messages, by conversation."""
        return {
            channel: m
            for (channel, _), m in self.messages.items()
            if (m.get("metadata") or {}).get("event_payload", {}).get("request_id") == request_id
        }

    def message_of(self, request_id: str) -> dict[str, Any]:
        [message] = self.messages_of(request_id).values()
        return message

    def ephemerals(self, user: str) -> list[str]:
        return [p["text"] for p in self.called("chat.postEphemeral") if p.get("user") == user]


def signed(secret: str, body: str, timestamp: int | None = None) -> dict[str, str]:
    """Slack's request signature: v0=HMAC-SHA256(secret, "v0:<timestamp>:<raw body>")."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    mac = hmac.new(secret.encode(), f"v0:{stamp}:{body}".encode(), hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": f"v0={mac}",
        "Content-Type": "application/x-www-form-urlencoded",
    }


def block_action(
    user: str, action_id: str, request_id: str, *, channel: str, ts: str, team: str = TEAM, action_ts: str | None = None
) -> str:
    payload = {
        "type": "block_actions",
        "team": {"id": team, "domain": "fake"},
        "user": {"id": user, "team_id": team, "username": user},
        "api_app_id": "A1",
        "token": "legacy",
        "trigger_id": f"trig-{user}-{time.monotonic_ns()}",
        "channel": {"id": channel},
        "container": {"type": "message", "channel_id": channel, "message_ts": ts},
        "message": {"ts": ts},
        "response_url": "https://hooks.invalid/r",
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": "signoff_decide",
                "value": request_id,
                "action_ts": action_ts or f"{time.time():.6f}",
            }
        ],
    }
    return urlencode({"payload": json.dumps(payload)})


def deny_submission(user: str, private_metadata: str, reason: str, team: str = TEAM) -> str:
    payload = {
        "type": "view_submission",
        "team": {"id": team, "domain": "fake"},
        "user": {"id": user, "team_id": team, "username": user},
        "api_app_id": "A1",
        "token": "legacy",
        "trigger_id": f"trig-{user}",
        "view": {
            "id": f"V-{user}-{time.monotonic_ns()}",
            "type": "modal",
            "callback_id": "signoff_deny_reason",
            "private_metadata": private_metadata,
            "state": {"values": {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}},
        },
    }
    return urlencode({"payload": json.dumps(payload)})


async def post(url: str, body: str, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(url, content=body, headers=headers)
