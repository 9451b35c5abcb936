"""A Redis that refuses a service, told apart from a Redis that is away.

Redis is a fast path (docs/design.md, invariant 8): while it is down or unreachable
the executor grants every lease and the ledger's claim decides alone, and it comes
back by itself. A Redis that answers but refuses the service's own user (a wrong
password, a database index or command its ACL does not allow: NOPERM) is no outage:
it never heals, and a degraded mode that only logs would hide it in every
deployment. So a refusal fails the service's readiness (`/readyz`, `signoff status`)
and is logged as an error naming the fix; an outage degrades as designed.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as Unreached

log = logging.getLogger("signoff.redis")

FIX = "run `signoff setup` again: it makes each service's Redis user for SIGNOFF_REDIS_URL, its database index included"


def refused(error: BaseException) -> bool:
    """Redis answered and said no: a configuration to fix, not an outage to wait out."""
    if isinstance(error, AuthenticationError | ResponseError):
        return True
    # redis-py's own words when a SELECT of the URL's database index is not answered OK.
    return isinstance(error, Unreached) and "Invalid Database" in str(error)


class RedisAccess:
    """A service's readiness on its Redis: it does what the service does there (a SET with
    an expiry on a key of its own), so a user that may not select the database, reach
    its keys or log in at all is not ready."""

    def __init__(self, redis: Any, probe_key: str, user: str, *, ready_while_away: bool) -> None:
        self.redis = redis
        self.probe_key = probe_key
        self.user = user
        # The executor works on while Redis is away (the ledger's claim decides); the
        # gateway counts logins there and is not ready without it.
        self.ready_while_away = ready_while_away
        self._said: str | None = None

    async def ready(self) -> bool:
        try:
            await self.redis.set(self.probe_key, "ready", px=5000)
        except RedisError as error:
            if refused(error):
                self.refusal(error)
                return False
            return self.ready_while_away
        self._said = None
        return True

    def refusal(self, error: BaseException) -> None:
        """Logged as an error once per distinct refusal (every probe asks again)."""
        said = f"{type(error).__name__}: {error}"
        if said != self._said:
            self._said = said
            log.error("Redis refuses %s (%s): not ready until it is fixed; %s", self.user, said, FIX)
