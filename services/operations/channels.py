"""`signoff channel add|run`: a channel adapter registered, and run, without restarting anything.

`add` makes the channel's key, registers it in `channels.yaml` for the principals it may
assert (the ledger reads the file again when it changes: `keyring.LiveChannels`) and gives
it a broker user of its own (`<ns>.channel.<name>`, as `signoff setup` does), so its
responses count from the next message on. Until then a response is refused, and an
adapter that waits for the verdict (`ChannelAdapter.respond(verdict_within=...)`) is told."""

from __future__ import annotations

import asyncio
import re

from shared import keyring, provisioning
from shared.settings import Settings

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
# Channels whose principals another command keeps: the gateway's (its users) and the CLI's (setup).
KEPT_ELSEWHERE = {"gateway": "signoff user add", "cli": "signoff setup --cli-principal"}
BUILT_IN = ("slack", "email")


def default_principals(name: str) -> list[str]:
    """Whom a built-in channel may assert: the people its operator's file maps."""
    if name == "slack":
        from signoff.adapters.slack import SlackMapping, SlackSettings

        path = SlackSettings().users_file
        return SlackMapping.load(path).principals if path.exists() else []
    if name == "email":
        from signoff.adapters.email import EmailSettings, Recipients

        path = EmailSettings().users_file
        return Recipients.load(path).principals if path.exists() else []
    return []


def add(settings: Settings, name: str, principals: list[str]) -> list[str]:
    if not NAME.fullmatch(name):
        raise SystemExit(f"signoff channel add: {name!r} is not a channel name (a-z, 0-9, - and _, 32 at most)")
    if name in KEPT_ELSEWHERE:
        raise SystemExit(f"signoff channel add: channel {name}'s principals are kept by `{KEPT_ELSEWHERE[name]}`")
    principals = list(dict.fromkeys(principals or default_principals(name)))
    for principal in principals:
        if not principal or any(c in principal for c in "*?[]") or principal.startswith(("token:", "bot:")):
            raise SystemExit(f"signoff channel add: --principal {principal!r}: name one person (no patterns)")
    if not principals:
        raise SystemExit(
            f"signoff channel add {name}: no principals: name them (--principal NAME) or map them in its users file"
        )
    done = keyring.create(settings.keys_path, {name: principals})
    if settings.broker_identities:
        done += asyncio.run(provisioning.provision_broker(settings, sorted(keyring.channels(settings.keys_path))))
    return done or [f"channel {name} was registered already, for {', '.join(principals)}"]


def run(settings: Settings, name: str) -> int:
    from shared import logs

    logs.configure(f"channel-{name}", settings.log_format)
    if name == "slack":
        from signoff.adapters import slack

        asyncio.run(slack.run(settings, slack.SlackSettings()))
        return 0
    if name == "email":
        from services.gateway import admin
        from signoff.adapters import email

        # The email channel's login, for tools that need separation of duties or several approvers.
        asyncio.run(
            email.run(settings, email.EmailSettings(), lambda name, password: admin.signed_in(settings, name, password))
        )
        return 0
    raise SystemExit(f"signoff channel run: no built-in adapter {name!r} (built in: {', '.join(BUILT_IN)})")
