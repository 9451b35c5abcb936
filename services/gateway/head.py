"""HEAD answers as GET would, without the body (RFC 9110, 9.3.2): FastAPI answers a GET
route's HEAD with 405, so a link checker or `curl -I` on /inbox was told the page does
not exist. Pure ASGI, innermost: the route runs as its GET (its status, headers and
Content-Length), and nothing after the headers is sent; a stream (the event stream)
ends there."""

from __future__ import annotations

from typing import Any


class HeadAsGet:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)
        scope["method"] = "GET"
        answered = False

        async def headers_only(message) -> None:
            nonlocal answered
            if answered:
                return  # the body, and a stream's every later event: not for a HEAD
            if message["type"] == "http.response.start":
                await send(message)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                answered = True

        try:
            await self.app(scope, receive, headers_only)
        finally:
            scope["method"] = "HEAD"
