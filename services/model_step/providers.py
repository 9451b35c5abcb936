"""The model providers, registered in one table: a provider is a module of this
package with two functions, and one line in `PROVIDERS`.

- `configured(settings) -> bool`: whether its own settings are present, so that it
  is held without being named (an API model set, for instance);
- `build(settings) -> Provider`: the provider, or SystemExit saying which setting it lacks.

The CLI's help and the error for an unknown name read the table; nothing else
lists the providers.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

from .replies import Provider
from .settings import ModelStepSettings

log = logging.getLogger("signoff.model_step")
# Providers a reload replaced, closed when the process stops.
retired: list[Provider] = []

# name -> its module in this package.
PROVIDERS = {
    # Replays SIGNOFF_SCRIPT_FILE: the demo, the tests and the benchmark.
    "scripted": "scripted",
    # Any OpenAI-compatible chat-completions server: SIGNOFF_OPENAI_MODEL (required),
    # SIGNOFF_OPENAI_BASE_URL, SIGNOFF_OPENAI_API_KEY (optional).
    "openai": "openai_compatible",
    # The Messages API: SIGNOFF_ANTHROPIC_MODEL and SIGNOFF_ANTHROPIC_API_KEY (both required).
    "anthropic": "anthropic_messages",
}


def provider_module(name: str) -> ModuleType:
    if name not in PROVIDERS:
        raise SystemExit(f"unknown model provider {name!r}; known: {', '.join(PROVIDERS)}")
    return importlib.import_module(f"{__package__}.{PROVIDERS[name]}")


def held_names(settings: ModelStepSettings) -> list[str]:
    """The providers a model-step holds: those named (SIGNOFF_PROVIDER, SIGNOFF_PROVIDERS)
    and every other whose own settings are present, so that a session may name any
    provider the deployment has configured."""
    named = settings.provider_names
    present = [name for name in PROVIDERS if name not in named and provider_module(name).configured(settings)]
    return named + present


def build_provider(name: str, settings: ModelStepSettings | None = None) -> Provider:
    """The provider called `name`, built from settings (the environment by default);
    exits with a clear message if it is unknown or not configured. One provider object
    per name, shared by every session that names it; it holds one HTTP connection pool
    and no session state."""
    module = provider_module(name)
    return module.build(settings or ModelStepSettings())


def build_providers(settings: ModelStepSettings) -> dict[str, Provider]:
    """Every provider held (`held_names`), keyed by name: a step request runs on the one its session names."""
    return {name: build_provider(name, settings) for name in held_names(settings)}


def reload_providers(providers: dict[str, Provider], settings: ModelStepSettings) -> None:
    """SIGHUP (`signoff reload`): build every provider again from its settings (the scripted
    provider reads its script file again) and put them in place of the old, all or none:
    one that cannot be built keeps the old ones. Settings from the environment are the
    process's own and change only with a restart. The old providers are not closed here:
    a step may still be using one; they end with the process."""
    try:
        fresh = build_providers(settings)
    except (SystemExit, Exception) as refused:
        log.error("providers not reloaded, the ones in use are kept: %s", getattr(refused, "code", None) or refused)
        return
    retired.extend(providers.values())
    providers.clear()
    providers.update(fresh)
    log.info("providers reloaded: %s", ", ".join(fresh))


async def close_providers(providers: dict[str, Provider]) -> None:
    for provider in [*providers.values(), *retired]:
        close = getattr(provider, "aclose", None)
        if close is not None:
            await close()
