"""A provider's key never leaves the model-step, not even in part.

Some providers quote the key they were sent in an error. The model-step cuts such an
error to a few hundred characters for the turn's reason: cut first and redacted
after, a key that straddles the cut is no longer found, and its first characters go
out in `turn.failed`, to hooks and into the logs. Here the provider's error quotes
the configured key across the 500-character cut and again past it; no piece of the
key of 8 characters or more may appear anywhere a person or a hook can read."""

from __future__ import annotations

import json
import secrets

import pytest
from pydantic import SecretStr

from services.model_step.openai_compatible import OpenAICompatibleProvider
from services.model_step.providers import build_providers
from services.model_step.replies import ProviderError
from services.model_step.settings import ModelStepSettings
from shared.ledger.tables import ProviderAttemptRow
from shared.logs import mask_secrets
from shared.messages import StartTurn, mint
from tests.fake_providers import FakeOpenAI, FakeReply
from tests.harness import eventually, next_event, rows
from tests.sink import HOOK_SECRET

PIECE = 8


def a_key() -> str:
    # No credential shape (no `sk-` prefix): only knowing the key can hide it.
    return "k3y" + secrets.token_hex(20)


def quoting(key: str) -> str:
    """An error that quotes the key so that it straddles character 500, then again past it."""
    before = "Incorrect API key provided: "
    return before + "x" * (480 - len(before)) + key + ". You sent " + key + " again."


def pieces_of(key: str, text: str) -> list[str]:
    return sorted({key[n : n + PIECE] for n in range(len(key) - PIECE + 1) if key[n : n + PIECE] in text})


async def test_a_provider_error_quoting_the_key_across_the_cut_shows_no_piece_of_it_anywhere(
    deployment, sink, tmp_path
):
    key = a_key()
    assert quoting(key).index(key) < 500 < quoting(key).index(key) + len(key)
    with FakeOpenAI([FakeReply("never seen")], api_key=key) as fake:
        fake.fail_next(5, 401, quoting(key))
        hooks = tmp_path / "hooks.yaml"
        hooks.write_text(json.dumps({"hooks": [
            {"name": "ops", "url": f"{sink.url}/hook", "events": ["*"], "secret": HOOK_SECRET}]}))
        deployment.extra_env.update(
            SIGNOFF_PROVIDER="openai", SIGNOFF_OPENAI_BASE_URL=fake.base_url,
            SIGNOFF_OPENAI_MODEL="fake-gpt", SIGNOFF_OPENAI_API_KEY=key, SIGNOFF_HOOKS_FILE=str(hooks),
        )
        deployment.start()
        session_id = mint("ses")
        async with deployment.console() as console:
            events = await console.watch(session_id)
            await console.send(StartTurn(session_id=session_id, text="hello"))
            failed = await next_event(events, "turn.failed", "turn.completed", timeout=40)
        assert fake.statuses and set(fake.statuses) == {401}

    assert failed.type == "turn.failed" and "HTTP 401" in failed.reason_text, failed
    assert "Incorrect API key provided" in failed.reason_text
    assert pieces_of(key, failed.model_dump_json()) == []

    async def hooked():
        bodies = [r["body"] for r in sink.requests if r["path"] == "/hook"]
        return bodies if any('"turn.failed"' in b for b in bodies) else None

    delivered = await eventually(hooked, timeout=30)
    assert pieces_of(key, "\n".join(delivered)) == []
    attempts = await rows(deployment, ProviderAttemptRow, session_id=session_id)
    assert [a.status for a in attempts] == ["failed"], "a rejected key is not retried"
    logs = "\n".join(path.read_text(errors="replace") for path in (deployment.data_dir / "logs").glob("*.log"))
    assert "Incorrect API key provided" in logs, "the model-step logs the provider's error (redacted)"
    assert pieces_of(key, logs) == []


async def test_a_provider_that_quotes_part_of_the_key_has_that_part_hidden_too():
    key = a_key()
    with FakeOpenAI([FakeReply("never seen")], api_key=key) as fake:
        fake.fail_next(1, 401, f"Incorrect API key provided: {key[:20]}...{key[-6:]}")
        provider = OpenAICompatibleProvider(base_url=fake.base_url, model="m", api_key=SecretStr(key))
        try:
            with pytest.raises(ProviderError) as failure:
                await provider.complete("ses_1", [], [])
        finally:
            await provider.aclose()
    said = str(failure.value)
    assert "Incorrect API key provided: ***redacted***..." in said
    assert pieces_of(key, said) == []


def test_the_model_step_knows_its_provider_keys_from_start_up_and_its_log_lines_hide_them():
    key = a_key()
    providers = build_providers(ModelStepSettings(provider="openai", openai_model="m", openai_api_key=key))
    assert set(providers) == {"openai"}
    line = f"somewhere a library logged the header: Authorization={key}"
    # What every service's log formatter does to each line (shared/logs.py).
    assert key not in mask_secrets(line) and pieces_of(key, mask_secrets(line)) == []
