"""The `signoff` command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.warm_start import SERVICES, Child, fork_service, preload, run_service
from shared.settings import Settings

ALIASES = {"ledger": "approval-ledger", "executor": "tool-executor", "model": "model-step"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="signoff", description="Durable human sign-off for AI agents' tool calls.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run one service in the foreground (as a container does)")
    run.add_argument("service", choices=sorted(SERVICES) + sorted(ALIASES))

    up = commands.add_parser("up", help="run all four services as child processes until Ctrl-C")
    up.add_argument("--log-dir", type=Path, help="where each service's log goes (default: <data dir>/logs)")

    commands.add_parser("migrate", help="bring the ledger's schema up to date")
    commands.add_parser("demo", help="run the services and drive one session through an approval")

    session = commands.add_parser("session", help="start or show a session")
    session_commands = session.add_subparsers(dest="session_command", required=True)
    start = session_commands.add_parser("start", help="start a turn (a new session unless --session is given)")
    start.add_argument("text", nargs="?", default="Please publish the release notes for version 1.2.")
    start.add_argument("--session", help="an existing session id, or the id for a new one")
    start.add_argument("--wait", action="store_true", help="follow the session's events until it waits or idles")
    start.add_argument("--provider", help="model provider for a new session (scripted, openai, anthropic)")
    show = session_commands.add_parser("show", help="a session's status, transcript and pending requests")
    show.add_argument("session_id")

    pending = commands.add_parser("pending", help="approval requests waiting for a person")
    pending.add_argument("--session")
    approve = commands.add_parser("approve", help="approve a request")
    approve.add_argument("request_id")
    approve.add_argument("--message", default="", help="a note for the model, sent with the decision")
    approve.add_argument("--as", dest="responder", default=os.environ.get("USER", "cli"))
    deny = commands.add_parser("deny", help="deny a request")
    deny.add_argument("request_id")
    deny.add_argument("--reason", required=True)
    deny.add_argument("--as", dest="responder", default=os.environ.get("USER", "cli"))

    dead = commands.add_parser("dead-letters", help="list parked (dead-lettered) messages with their reasons; "
                                                    "they stay parked")
    dead.add_argument("--limit", type=int, default=100, help="show at most this many (default 100)")

    args = parser.parse_args(argv)
    settings = Settings()
    try:
        if args.command == "run":
            return run_service(ALIASES.get(args.service, args.service))
        if args.command == "up":
            return Supervisor(settings, args.log_dir).run_until_interrupted()
        from services import console
        from shared.runtime import check_reachable

        if args.command in ("migrate", "session", "pending"):
            check_reachable(settings, only=("PostgreSQL",))

        if args.command == "migrate":
            return asyncio.run(console.migrate_only(settings))
        if args.command == "demo":
            return console.demo(settings)
        if args.command == "session" and args.session_command == "start":
            return asyncio.run(console.start_session(settings, args.text, args.session, args.wait, args.provider))
        if args.command == "session":
            return asyncio.run(console.show_session(settings, args.session_id))
        if args.command == "pending":
            return asyncio.run(console.list_pending(settings, args.session))
        if args.command == "approve":
            return asyncio.run(console.respond(settings, args.request_id, "approve", "", args.message, args.responder))
        if args.command == "deny":
            return asyncio.run(console.respond(settings, args.request_id, "deny", args.reason, "", args.responder))
        if args.command == "dead-letters":
            return asyncio.run(console.dead_letters(settings, args.limit))
    except KeyboardInterrupt:
        return 130
    parser.error("unknown command")
    return 2


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


class Supervisor:
    """Runs the four services as child processes and restarts any that dies.

    Each child is a fork of this process after it has imported every service
    (`services.warm_start`): a restart after a crash is a fork and a connect,
    not a new interpreter."""

    # How often a dead child is looked for: a crash costs at most this before the restart.
    WATCH_SECONDS = 0.05
    # A child that dies before it became ready is crash-looping (bad settings, a
    # dependency away): each further restart waits twice as long as the last, up
    # to BACKOFF_LIMIT, instead of spinning. One that was ready and working is
    # restarted at once, however soon after its last start it died.
    BACKOFF_LIMIT = 30.0

    def __init__(self, settings: Settings, log_dir: Path | None = None) -> None:
        self.settings = settings
        self.log_dir = log_dir or settings.data_dir / "logs"
        self.children: dict[str, Child] = {}
        # Where each child's log stood when it was started: what it logged since says whether it became ready.
        self.log_offset: dict[str, int] = {}
        self.backoff: dict[str, float] = {}
        self.restart_at: dict[str, float] = {}
        self.stopping = False

    def start(self) -> None:
        from shared.runtime import check_reachable

        # SIGTERM (docker stop, timeout) must stop the children too, as Ctrl-C does.
        signal.signal(signal.SIGTERM, _interrupt)
        check_reachable(self.settings)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Migrate once here so four services do not race to create the schema.
        subprocess.run([sys.executable, "-m", "services.cli", "migrate"], check=True)
        preload()
        for service in SERVICES:
            self._spawn(service)

    def _spawn(self, service: str) -> None:
        # Its own session, as before: Ctrl-C reaches the supervisor, which stops the children in order.
        log = self.log_dir / f"{service}.log"
        self.log_offset[service] = log.stat().st_size if log.exists() else 0
        self.children[service] = Child(fork_service(service, log=str(log), new_session=True))

    def became_ready(self, service: str) -> bool:
        """Whether the child last started logged that it was ready (or, a publisher, standing by)."""
        with open(self.log_dir / f"{service}.log", "rb") as log:
            log.seek(self.log_offset[service])
            since = log.read().decode("utf-8", "replace")
        return f"{service} ready" in since or f"{service} standing by" in since

    def watch(self) -> None:
        """Restart every child that died: at once after a crash, with backoff while it keeps dying at start."""
        if self.stopping:
            return
        now = time.monotonic()
        for service, child in list(self.children.items()):
            if service in self.restart_at:
                if now >= self.restart_at[service]:
                    del self.restart_at[service]
                    self._spawn(service)
                continue
            if child.poll() is None:
                continue
            if self.became_ready(service):
                self.backoff.pop(service, None)
            else:
                self.backoff[service] = min(self.BACKOFF_LIMIT, 2 * self.backoff.get(service, 0.25))
            delay = self.backoff.get(service, 0.0)
            print(f"signoff: {service} exited with {child.returncode}; restarting"
                  f"{f' in {delay:.1f} s' if delay else ''} (log: {self.log_dir / (service + '.log')})",
                  file=sys.stderr, flush=True)
            if delay:
                self.restart_at[service] = now + delay
            else:
                self._spawn(service)

    def stop(self) -> None:
        self.stopping = True
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for child in self.children.values():
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()

    def run_until_interrupted(self) -> int:
        self.start()
        print(f"signoff: services running (logs in {self.log_dir}); Ctrl-C stops them", flush=True)
        try:
            while True:
                time.sleep(self.WATCH_SECONDS)
                self.watch()
        except KeyboardInterrupt:
            print("\nsignoff: stopping", flush=True)
        finally:
            self.stop()
        return 0


if __name__ == "__main__":
    sys.exit(main())
