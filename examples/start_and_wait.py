"""An application that hands a task to an agent through the Signoff gateway and
waits for its answer: it starts a session, then follows the event stream until
the turn ends (a person approves or denies the agent's tool calls meanwhile).

    SIGNOFF_PASSWORD=… python examples/start_and_wait.py --url http://127.0.0.1:8080 \\
        --name alice "Post the release notes"

Prints the agent's final text; exits 1 if the turn failed or was cancelled.
"""

from __future__ import annotations

import argparse
import os
import sys

from signoff import Client


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("text", help="what the agent is asked")
    parser.add_argument("--url", default=os.environ.get("SIGNOFF_GATEWAY_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--name", default=os.environ.get("SIGNOFF_USER"), required="SIGNOFF_USER" not in os.environ)
    parser.add_argument("--session-id", help="a session id of your own (default: a new one)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the answer")
    args = parser.parse_args()
    # The password from the environment, never the command line (other users see argv).
    password = os.environ["SIGNOFF_PASSWORD"]

    with Client(args.url, args.name, password) as signoff:
        started = signoff.start_session(args.text, session_id=args.session_id)
        print(f"started {started.session_id}", flush=True)
        ended = signoff.wait_for_turn(started.session_id, timeout=args.timeout)
        if ended.type == "turn.completed":
            print(ended.data["text"])
            return 0
        reason = ended.data.get("reason_text") or ended.data.get("reason") or ""
        print(f"{ended.type}: {reason}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
