"""The model-step's own settings: which providers it holds and how to reach them.

Read from SIGNOFF_* environment variables like the shared settings; API keys are
SecretStr so that no repr, log line or exception ever shows them.
"""

from __future__ import annotations

from pydantic import SecretStr

from shared.settings import Settings


class ModelStepSettings(Settings):
    # More providers to hold besides `provider` (the default for new sessions),
    # comma-separated: a session runs on whichever its `provider` names.
    providers: str = ""

    openai_base_url: str = "https://api.openai.com/v1"
    openai_model: str = ""
    # Optional: local OpenAI-compatible servers (vLLM, Ollama, llama.cpp) often need none.
    openai_api_key: SecretStr | None = None
    openai_timeout_seconds: float = 120.0
    openai_max_tokens: int | None = None

    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_model: str = ""
    anthropic_api_key: SecretStr | None = None
    anthropic_version: str = "2023-06-01"
    anthropic_timeout_seconds: float = 120.0
    # Required by the Messages API on every request.
    anthropic_max_tokens: int = 4096

    @property
    def provider_names(self) -> list[str]:
        names = [self.provider] + [n.strip() for n in self.providers.split(",")]
        return list(dict.fromkeys(n for n in names if n))
