"""A bot that signs off on what a rule allows, through the Signoff gateway, as its own
login: a card whose tool is `--tool` and whose arguments are each at most their
`--max` is approved; anything else is left for a person.

    SIGNOFF_PASSWORD=… python examples/approval_bot.py --url http://127.0.0.1:8080 \\
        --name refund-bot --tool refund --max amount=100

It follows the event stream (reconnecting by itself) and reads each new card from the
API. The approval names the digest of the card it checked: if the request's arguments
were not those, the ledger refuses it. A limited argument the card hides (a credential)
is never approved by rule. `--count N` stops after N approvals; `--since ID` skips the
events up to that id.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from signoff import Card, Client, ProblemError


def allowed(card: Card, tool: str, limits: dict[str, float]) -> bool:
    """The rule: this tool, and every limited argument present, a number, not hidden, and within its limit."""
    if card.tool != tool or card.status != "pending":
        return False
    for name, limit in limits.items():
        value: Any = card.arguments.get(name)
        if name in card.hidden or isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if value > limit:
            return False
    return True


def limit(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    return name, float(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("SIGNOFF_GATEWAY_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--name", default=os.environ.get("SIGNOFF_USER"), required="SIGNOFF_USER" not in os.environ)
    parser.add_argument("--tool", required=True)
    parser.add_argument("--max", type=limit, action="append", default=[], metavar="ARGUMENT=LIMIT")
    parser.add_argument("--count", type=int, default=0, help="stop after this many approvals (0: never)")
    parser.add_argument("--since", help="the event id to start after (default: the stream's start)")
    args = parser.parse_args()
    limits = dict(args.max)
    approved = 0

    with Client(args.url, args.name, os.environ["SIGNOFF_PASSWORD"]) as signoff:
        print(f"watching for {args.tool} with {limits}", flush=True)
        for event in signoff.events(since=args.since):
            if event.type != "approval.requested" or event.request_id is None:
                continue
            card = signoff.request(event.request_id)
            if not allowed(card, args.tool, limits):
                continue
            try:
                verdict = signoff.approve(card, message=f"within {limits} ({args.name})")
            except ProblemError as refused:  # decided by someone else meanwhile, or not ours to approve
                print(f"{card.id}: refused: {refused.reason_code or refused.kind}", flush=True)
                continue
            print(f"{card.id}: approved {card.tool} {card.arguments} (event {event.id})", flush=True)
            approved += 1 if verdict.outcome == "accepted" else 0
            if args.count and approved >= args.count:
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
