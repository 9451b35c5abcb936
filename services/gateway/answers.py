"""What every answer of the gateway carries, whichever route (or none) made it.

`X-Content-Type-Options: nosniff` on all of them: a browser must never read a JSON
answer, a problem document, the inbox's script or the OpenAPI document as something
else (HTML, a script) than its declared type. `Cache-Control: no-store` on the API's
answers that name none: a card, a session, a verdict are one person's and change, so
no browser or proxy may keep them. Pure ASGI, like the request counter in middleware.py.
"""

from __future__ import annotations

from typing import Any

NOSNIFF = (b"x-content-type-options", b"nosniff")
NO_STORE = (b"cache-control", b"no-store")
# The API's answers; the OpenAPI document is the same for everyone and may be kept.
API = "/v1/"
PUBLIC = {"/v1/openapi.json"}


class EveryAnswer:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        private = path.startswith(API) and path not in PUBLIC

        async def marked(message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                if NOSNIFF[0] not in names:
                    headers.append(NOSNIFF)
                if private and NO_STORE[0] not in names:
                    headers.append(NO_STORE)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, marked)
