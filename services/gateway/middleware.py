"""The gateway's ASGI middleware: request counting and the body size limit.

Pure ASGI (not starlette's `@app.middleware("http")`): nothing pipes the bodies, the
event stream's included, through a task and a memory stream.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter

from .problems import Problem, problem_response

HTTP_REQUESTS = Counter(
    "signoff_gateway_requests_total", "HTTP requests the gateway answered, by route and status", ["route", "status"]
)


# --- the body size limit (pure ASGI: it counts the bytes before anything parses them) -------


class CountRequests:
    """Counts each answer by route and status as it starts. Pure ASGI: starlette's
    `@app.middleware("http")` (BaseHTTPMiddleware) pipes every body chunk, the event
    stream's included, through a task and a memory stream (make bench, the gateway level)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        started = False

        async def counted(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                count(message["status"])
            await send(message)

        def count(status: int) -> None:
            HTTP_REQUESTS.labels(getattr(scope.get("route"), "path", "unmatched"), str(status)).inc()

        try:
            await self.app(scope, receive, counted)
        except Exception:
            if not started:
                count(500)  # starlette's outermost middleware answers it, after this one
            raise


class BodyLimit:
    def __init__(self, app, limit: Callable[[], int]) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit()
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_large = Problem(413, "too-large", "Body too large", f"At most {limit} bytes.")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await problem_response(too_large)(scope, receive, send)
        # The body is read here, whole and bounded, before anything parses it; then handed on.
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                return await problem_response(too_large)(scope, receive, send)
        handed = False

        async def replay():
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
