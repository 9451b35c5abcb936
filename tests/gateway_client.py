"""The tests' HTTP client of the gateway: logs in as a person and keeps their cookie and
CSRF token. The cookie is `Secure`, which httpx's cookie jar sends only over https;
the tests reach the gateway over loopback http, so the client sends it itself."""

from __future__ import annotations

import secrets
from typing import Any

import httpx

PASSWORD = "correct horse battery staple"
# The gateway's users in the tests: (name, groups, operator).
PEOPLE = (("alice", (), False), ("bob", (), False), ("mallory", (), False), ("sam", (), False),
          ("ann", (), True))


class GatewayClient:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.AsyncClient(base_url=url, timeout=30)
        self.cookie: str | None = None
        self.csrf: str | None = None

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.http.aclose()

    def headers(self, csrf: bool = True, **extra: str) -> dict[str, str]:
        headers = dict(extra)
        if self.cookie:
            headers["Cookie"] = f"signoff_session={self.cookie}"
        if csrf and self.csrf:
            headers["X-CSRF-Token"] = self.csrf
        return headers

    async def login(self, name: str, password: str = PASSWORD) -> httpx.Response:
        answer = await self.http.post("/v1/login", json={"name": name, "password": password})
        if answer.status_code == 200:
            self.cookie = answer.cookies.get("signoff_session") or _cookie(answer)
            self.csrf = answer.json()["csrf_token"]
        return answer

    async def get(self, path: str, *, headers: dict | None = None, **kwargs: Any) -> httpx.Response:
        return await self.http.get(path, headers={**self.headers(csrf=False), **(headers or {})}, **kwargs)

    async def post(self, path: str, json: Any = None, *, csrf: bool = True, headers: dict | None = None,
                   **kwargs: Any) -> httpx.Response:
        return await self.http.post(path, json=json, headers={**self.headers(csrf), **(headers or {})}, **kwargs)

    async def decide(self, request_id: str, decision: str = "approve", key: str | None = None,
                     **body: Any) -> httpx.Response:
        return await self.post(f"/v1/requests/{request_id}/decision", {"decision": decision, **body},
                               headers={"Idempotency-Key": key or secrets.token_hex(8)})


def _cookie(answer: httpx.Response) -> str | None:
    for header in answer.headers.get_list("set-cookie"):
        name, _, rest = header.partition("=")
        if name.strip() == "signoff_session":
            return rest.split(";", 1)[0]
    return None
