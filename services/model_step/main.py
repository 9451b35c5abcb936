"""model-step entrypoint."""

from __future__ import annotations

from functools import partial

from pydantic import TypeAdapter

from shared.consuming import publish
from shared.messages import RequestModelStep
from shared.runtime import prepare
from shared.settings import Settings

from .handlers import request_model_step
from .providers import build_provider


async def run(settings: Settings) -> None:
    runtime = prepare(settings, "model-step")
    providers = {settings.provider: build_provider(settings.provider, settings.script_file)}
    report = partial(publish, runtime.broker, runtime.topology)
    runtime.consume("step.requested", TypeAdapter(RequestModelStep), partial(request_model_step, providers, report))
    await runtime.serve()
