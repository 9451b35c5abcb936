"""The probes: `/healthz` (the process answers), `/readyz` (its connections hold), `/metrics`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from .callers import gateway_of

router = APIRouter(include_in_schema=False)


@router.get("/healthz")
async def healthz() -> PlainTextResponse:
    return PlainTextResponse("ok\n")


@router.get("/readyz")
async def readyz(request: Request) -> PlainTextResponse:
    verdicts = await gateway_of(request).ready()
    body = "".join(f"{name}: {'ok' if ok else 'not ready'}\n" for name, ok in verdicts.items())
    return PlainTextResponse(body, status_code=200 if verdicts and all(verdicts.values()) else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    await gateway_of(request).ready()
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
