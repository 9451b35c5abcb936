"""The model-step's own settings: which providers it holds and how to reach them.

Read from SIGNOFF_* environment variables like the shared settings; API keys are
SecretStr so that no repr, log line or exception ever shows them.
"""

from __future__ import annotations

from pydantic import SecretStr

from shared.settings import Settings


class ModelStepSettings(Settings):
    # More providers to hold besides `provider` (the default for new sessions),
    # comma-separated: a session runs on whichever its `provider` names. Any provider
    # whose own settings are present is held too, named or not (providers.py `held_names`).
    providers: str = ""

    # The `openai` provider (any OpenAI-compatible API): its base URL, the model, the key
    # (optional: local servers such as vLLM, Ollama or llama.cpp often need none), how long
    # one call may take, and the most tokens a reply may have (unset: the server's own limit).
    openai_base_url: str = "https://api.openai.com/v1"
    openai_model: str = ""
    openai_api_key: SecretStr | None = None
    openai_timeout_seconds: float = 120.0
    openai_max_tokens: int | None = None

    # The `anthropic` provider: its API's base URL, the model, the key, the API version
    # sent with each request, and how long one call may take.
    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_model: str = ""
    anthropic_api_key: SecretStr | None = None
    anthropic_version: str = "2023-06-01"
    anthropic_timeout_seconds: float = 120.0
    # The most tokens a reply may have; the Messages API requires it on every request.
    anthropic_max_tokens: int = 4096

    @property
    def provider_names(self) -> list[str]:
        names = [self.provider] + [n.strip() for n in self.providers.split(",")]
        return list(dict.fromkeys(n for n in names if n))
