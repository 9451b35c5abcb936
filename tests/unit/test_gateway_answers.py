"""What every answer of the gateway carries, a failure's included, over HTTP to the app
itself (in process: a route that fails needs no services, only a gateway never started)."""

from __future__ import annotations

import httpx

from services.gateway.app import HTTP_REQUESTS, create_app


def counted(route: str, status: str) -> float:
    return HTTP_REQUESTS.labels(route, status)._value.get()


async def test_a_request_the_gateway_fails_is_a_counted_500_problem_that_says_nosniff_and_names_no_error():
    # Never started: every route that reads the gateway's connections fails, as a bug would.
    transport = httpx.ASGITransport(app=create_app(), raise_app_exceptions=False)
    before = counted("/v1/me", "500")
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        answer = await client.get("/v1/me")
    assert answer.status_code == 500
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.json()["type"] == "urn:signoff:problem:internal"
    assert answer.json()["detail"] == "Try again; it has been logged." and "AttributeError" not in answer.text
    assert counted("/v1/me", "500") == before + 1
