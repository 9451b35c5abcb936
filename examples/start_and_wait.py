"""An app that starts an agent session through the gateway and waits for its answer.

    python examples/start_and_wait.py URL NAME PASSWORD "Publish the notes for 1.3" [SESSION_ID]

It prints each card the session waits on (someone approves it elsewhere: a person in the
inbox, or examples/approval_bot.py) and the final answer; exit 0 when the turn completed."""

import sys

import signoff


def main(url: str, name: str, password: str, text: str, session_id: str | None = None) -> int:
    with signoff.Client(url, name, password) as client:
        started = client.start_session(text, session_id=session_id)
        print(f"session {started.session_id} started", flush=True)
        for event in client.events():
            if event.data.get("session_id") != started.session_id:
                continue
            if event.type == "approval.requested":
                card = event.data["card"]
                print(f"waiting on {event.data['request_id']}: {card['label']} ({card['tool']})", flush=True)
            elif event.type == "turn.completed":
                print(f"answer: {event.data['text']}", flush=True)
                return 0
            elif event.type in ("turn.failed", "turn.cancelled"):
                print(f"{event.type}: {event.data.get('reason_text') or event.data.get('reason', '')}", flush=True)
                return 1
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
