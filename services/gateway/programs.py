"""API tokens for programs: `signoff token create|revoke|list`, and the gateway's check of
`Authorization: Bearer <token>`.

A token is 256 random bits, shown once. The tokens file (`tokens.yaml`, beside the users
file, mode 0600, shared by the replicas the same way) keeps only each token's SHA-256:
a token that random cannot be guessed from its hash, so a slow password hash (argon2)
would add cost to every request and no safety. A request's token is looked up by its
hash; revoking removes the entry, and every replica reads the file again when it changes.

A token speaks as `bot:<name>`: people's names cannot hold a `:` (users.NAME), and
`token:` is the ledger's for one-time response tokens. The gateway's channel is
registered for these principals as for its users (users.register_channel). A token does
only what its scopes allow (`SCOPE_OF`, checked per route; a route not listed is closed
to tokens), and it approves only when its scopes include `requests:decide` AND the
tool's approvers name it (the ledger: `judge_approver` refuses a `bot:` principal any
tool whose approvers are "anyone", and `not_an_approver` any tool that does not list it).
"""

from __future__ import annotations

import re
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path

from .tokenstore import PREFIX, Program, Tokens, lookup_hash, principal_of, principals, tokens_path
from .users import register_channel

__all__ = ["PREFIX", "Program", "Tokens", "lookup_hash", "principal_of", "principals", "tokens_path"]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# The token as handed out: recognisable in a leaked-secret scan, 256 random bits.
TOKEN_PREFIX = "signoff_"
TOKEN = re.compile(r"^signoff_[A-Za-z0-9_-]{43}$")

SCOPES = {
    "sessions:start": "start sessions and turns; read and cancel the sessions it started",
    "requests:read": "list and read the cards it may see, poll its decisions, follow the event stream",
    "requests:decide": "approve or deny (an approval still needs the tool's approvers to name it)",
    "calls:file": "file tool calls for sign-off (the origins the catalogue admits it for), follow, claim and "
    "report them",
}
# What each route needs of a token (method, route path). A route not listed (login, logout)
# is closed to tokens: deny by default.
SCOPE_OF: dict[tuple[str, str], str | None] = {
    ("GET", "/v1/me"): None,
    ("POST", "/v1/sessions"): "sessions:start",
    ("GET", "/v1/sessions/{session_id}"): "sessions:start",
    ("POST", "/v1/sessions/{session_id}/cancel"): "sessions:start",
    ("GET", "/v1/requests"): "requests:read",
    ("GET", "/v1/requests/{request_id}"): "requests:read",
    ("GET", "/v1/requests/{request_id}/decision/{message_id}"): "requests:read",
    ("GET", "/v1/events"): "requests:read",
    ("POST", "/v1/requests/{request_id}/decision"): "requests:decide",
    # A session's remembered approvals, read like the session; revoking one is a decision.
    ("GET", "/v1/sessions/{session_id}/grants"): "sessions:start",
    ("POST", "/v1/grants/{grant_id}/revoke"): "requests:decide",
    # The intake: a program files calls, follows them, claims and reports those it runs.
    ("POST", "/v1/calls"): "calls:file",
    ("GET", "/v1/calls/{call_id}"): "calls:file",
    ("POST", "/v1/calls/{call_id}/claim"): "calls:file",
    ("POST", "/v1/calls/{call_id}/result"): "calls:file",
    ("GET", "/v1/keys"): None,
}


def parse_scopes(text: str) -> frozenset[str]:
    scopes = frozenset(s.strip() for s in text.split(",") if s.strip())
    unknown = sorted(scopes - SCOPES.keys())
    if unknown or not scopes:
        raise SystemExit(
            f"signoff token: unknown scope {', '.join(unknown) or '(none given)'}; known: {', '.join(SCOPES)}"
        )
    return scopes


DURATION = re.compile(r"^([1-9][0-9]{0,5})([smhd])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_expiry(text: str | None, now: float | None = None) -> float | None:
    """`--expires`: a lifetime (`90m`, `12h`, `30d`) or an ISO 8601 time with its zone; None: never."""
    if not text:
        return None
    now = time.time() if now is None else now
    if found := DURATION.fullmatch(text.strip()):
        return now + int(found[1]) * UNIT_SECONDS[found[2]]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        when = None
    if when is None or when.tzinfo is None or when.timestamp() <= now:
        raise SystemExit(
            f"signoff token: --expires {text!r} is neither a lifetime (90m, 12h, 30d) "
            "nor a future time with its zone (2027-01-31T18:00:00+00:00)"
        )
    return when.timestamp()


def create(
    keys_dir: Path, users_path: Path, name: str, scopes: frozenset[str], expires_at: float | None = None
) -> tuple[str, list[str]]:
    """A new token for `name` (replacing its old one, which stops working): the token, shown
    once, and what was done. `expires_at`: when it stops working (None: until revoked)."""
    if not NAME.fullmatch(name):
        raise SystemExit(f"signoff token: {name!r} is no valid name (letters, digits, . _ -; at most 64)")
    path = tokens_path(users_path)
    tokens = Tokens.load(path)
    replaced = name in tokens.programs
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    tokens.programs[name] = Program(name, lookup_hash(token), scopes, time.time(), expires_at)
    tokens.save()
    done = [
        f"token {name} "
        + ("replaced (the old one stops working)" if replaced else "created")
        + f", speaks as {principal_of(name)}, scopes {', '.join(sorted(scopes))}"
        + ("" if expires_at is None else f", expires {_shown_time(expires_at)}")
    ]
    return token, done + register_channel(keys_dir, users_path)


def revoke(keys_dir: Path, users_path: Path, name: str) -> list[str]:
    path = tokens_path(users_path)
    tokens = Tokens.load(path)
    if tokens.programs.pop(name, None) is None:
        raise SystemExit(f"signoff token revoke: no token {name!r}")
    tokens.save()
    return [f"token {name} revoked", *register_channel(keys_dir, users_path)]


def listing(users_path: Path) -> list[str]:
    return [
        f"{p.name}  ({p.principal})  scopes: {', '.join(sorted(p.scopes))}"
        + ("" if p.expires_at is None else f"  expires {_shown_time(p.expires_at)}")
        for p in Tokens.load(tokens_path(users_path)).programs.values()
    ]


def _shown_time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


class LiveTokens:
    """The tokens file as it is now (read again when it changes): a revoked token stops
    working at its next request, on every replica."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._by_hash: dict[str, Program] = {}

    def find(self, token: str, now: float | None = None) -> Program | None:
        """The program a token is, while it is known, not revoked and not expired."""
        if not TOKEN.fullmatch(token):
            self._current()
            return None
        # A dict lookup by the token's hash: what a timing difference could reveal is about
        # the hash, which tells nothing of any token.
        return self.holding(lookup_hash(token), now)

    def holding(self, token_hash: str, now: float | None = None) -> Program | None:
        """The program whose token has this hash, while it is not revoked and not expired
        (an open event stream's login is checked again by it: auth.OpenStreams)."""
        program = self._current().get(token_hash)
        if program is not None and program.expires_at is not None and program.expires_at <= (now or time.time()):
            return None
        return program

    def _current(self) -> dict[str, Program]:
        try:
            stat = self.path.stat()
            stamp: tuple[int, int, int] | None = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        except OSError:
            stamp = None
        if stamp != self._stamp:
            self._by_hash = Tokens.load(self.path).by_hash() if stamp else {}
            self._stamp = stamp
        return self._by_hash


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer …` header ('' for a malformed one); None: no header."""
    if header is None:
        return None
    scheme, _, value = header.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def scope_needed(method: str, route_path: str) -> tuple[bool, str | None]:
    """(open to tokens at all, the scope it needs)."""
    key = (method.upper(), route_path)
    return key in SCOPE_OF, SCOPE_OF.get(key)
