"""The publisher's own settings, read from SIGNOFF_* environment variables like the
shared ones (shared/settings.py)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import Settings

from .hooks import DEFAULT_CONCURRENCY, DEFAULT_MAX_ATTEMPTS


class PublisherSettings(Settings):
    # A hook delivery is given up (`attempts_exhausted`, logged as an error) after this many
    # failed attempts; a hook may set its own `max_attempts`. The backoff doubles from 0.2 s
    # up to a minute, so the default retries for about an hour and a half.
    hook_max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1)
    # Deliveries in flight at once per hook: a slow or failing receiver holds at most this
    # many of the publisher's connections, never another hook's turn.
    hook_concurrency: int = Field(default=DEFAULT_CONCURRENCY, ge=1)
