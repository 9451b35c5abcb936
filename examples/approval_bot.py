"""A bot that approves from a rule: every card of the named tools whose arguments it
accepts, as the gateway user it logs in as (who must be among the tool's approvers).

    python examples/approval_bot.py URL NAME PASSWORD TOOL[,TOOL…] [HOW_MANY]

It follows the event stream (resuming by itself if the gateway restarts) and stops after
HOW_MANY decisions (default: never)."""

import sys

import signoff


def acceptable(card: dict) -> bool:
    """The rule: nothing that carries a hidden (secret) argument, nothing over 1000 characters."""
    return not card.get("hidden") and len(str(card.get("arguments"))) <= 1000


def main(url: str, name: str, password: str, tools: str, how_many: str = "0") -> int:
    allowed, limit, done = set(tools.split(",")), int(how_many), 0
    with signoff.Client(url, name, password) as client:
        for event in client.events():
            if event.type != "approval.requested" or event.data["card"]["tool"] not in allowed:
                continue
            request_id, card = event.data["request_id"], event.data["card"]
            try:
                if acceptable(card):
                    verdict = client.approve(request_id, idempotency_key=f"bot-{request_id}")
                else:
                    verdict = client.deny(request_id, "the bot's rule refuses it", idempotency_key=f"bot-{request_id}")
                print(
                    f"{request_id}: {verdict.decision if isinstance(verdict, signoff.Verdict) else 'pending'}",
                    flush=True,
                )
            except signoff.Problem as refused:
                print(f"{request_id}: refused, {refused.reason_code or refused.kind}", flush=True)
            done += 1
            if limit and done >= limit:
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
