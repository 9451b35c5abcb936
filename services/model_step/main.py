"""model-step entrypoint."""

from __future__ import annotations

from functools import partial

from pydantic import TypeAdapter

from shared.ledger.database import create_engine, migrate
from shared.ledger.tool_menus import LedgerToolMenus
from shared.ledger.transcripts import LedgerTranscripts
from shared.messages import RequestModelStep
from shared.runtime import prepare
from shared.settings import Settings

from .handlers import request_model_step
from .providers import PROVIDERS, build_providers, close_providers, provider_module, reload_providers
from .settings import ModelStepSettings

# Imported with the service, not at its start: a warm fork (services/operations/warm_start.py) has them already.
for _name in PROVIDERS:
    provider_module(_name)


async def run(settings: Settings) -> None:
    runtime = prepare(settings, "model-step")
    await runtime.expose()
    # The shared settings as given, plus the provider settings from the environment.
    config = ModelStepSettings(**settings.model_dump())
    providers = build_providers(config)
    runtime.on_reload(partial(reload_providers, providers, config))
    # Its own role, which may only read the transcript and the tool menus: steps name
    # them, the ledger holds them.
    engine = create_engine(settings, identity="model-step", pool_size=4)
    await migrate(engine, settings)
    report = runtime.publish
    handle = partial(
        request_model_step,
        providers,
        LedgerTranscripts(engine),
        report,
        max_bytes=settings.max_message_bytes,
        menus=LedgerToolMenus(engine),
    )
    runtime.consume("step.requested", TypeAdapter(RequestModelStep), handle)
    try:
        await runtime.serve()
    finally:
        await close_providers(providers)
        await engine.dispose()
