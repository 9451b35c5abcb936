"""A plain Python agent that brings its own tools to Signoff (docs/bring-your-own-agent.md).

It makes two tool calls, each waiting for a person's sign-off:
- `send_refund` lives here (`runs: caller` in the catalogue): once approved, this
  process runs it exactly once, with the arguments the person approved (they may have
  edited the amount), and Signoff records the result;
- `publish_post` is Signoff's (`runs: signoff`): its executor runs it once, and this
  process gets the output.

    signoff token create --name example-agent --scope calls:file    # prints signoff_…
    SIGNOFF_TOKEN=signoff_… python examples/own_agent.py --url http://127.0.0.1:8080

Approve the two cards in the inbox (or `signoff pending`, `signoff approve apr_…`).
Run it again: the same call ids come back with their recorded results, nothing runs twice.
"""

from __future__ import annotations

import argparse
import os
import sys

from signoff_sdk import CallClosed, Client


def send_refund(customer: str, amount: float) -> dict:
    """The agent's own tool: here it would call the payment provider."""
    print(f"refunding {amount} to {customer}", flush=True)
    return {"customer": customer, "refunded": amount}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("SIGNOFF_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--run", default="order-42", help="this run's id: the calls' ids derive from it")
    args = parser.parse_args()
    # The token from the environment, never the command line (other users see argv).
    signoff = Client(args.url, token=os.environ["SIGNOFF_TOKEN"], origin="http:example-agent")
    try:
        refund = signoff.call(
            "send_refund",
            {"customer": "c-42", "amount": 12.5},
            call_id=f"{args.run}-refund",
            thread=args.run,
            summary="Refund the late delivery of order 42",
            run=send_refund,
        )
        print(f"refund: {refund}", flush=True)
        post = signoff.call(
            "publish_post",
            {"title": f"Refunded {args.run}", "body": "A late delivery, refunded."},
            call_id=f"{args.run}-post",
            thread=args.run,
        )
        print(f"post: {post}", flush=True)
    except CallClosed as closed:
        # Denied, Expired, Cancelled, OutcomeUnknown, ToolFailed: the person's reason, or why.
        print(f"{type(closed).__name__}: {closed.reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
