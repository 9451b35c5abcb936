"""The `signoff` command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from services.model_step.providers import PROVIDERS
from services.operations.supervisor import Supervisor, ask_to_reload
from services.operations.warm_start import SERVICES, run_service
from shared import faults
from shared.settings import Settings

ALIASES = {"ledger": "approval-ledger", "executor": "tool-executor", "model": "model-step"}
AS_HELP = (
    "the person acting (default: the OS user running this); only someone `signoff setup` "
    "registered the CLI's channel for (--cli-principal)"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="signoff", description="Durable human sign-off for AI agents' tool calls.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run one service in the foreground (as a container does)")
    run.add_argument("service", choices=sorted(SERVICES) + sorted(ALIASES))

    up = commands.add_parser("up", help="run all four services as child processes until Ctrl-C")
    up.add_argument("--log-dir", type=Path, help="where each service's log goes (default: <data dir>/logs)")

    setup = commands.add_parser("setup", help="make this deployment's keys (idempotent; says what it did)")
    setup.add_argument(
        "--cli-principal",
        action="append",
        default=[],
        metavar="NAME",
        help="a person the CLI's channel may act as (--as), besides the OS user running setup and those "
        "registered before; repeat for more",
    )
    setup.add_argument(
        "--hand-out",
        type=Path,
        metavar="FOLDER",
        help="also copy each service's own key files into FOLDER/<service>/ (one volume per container)",
    )
    commands.add_parser("migrate", help="bring the ledger's schema up to date")
    commands.add_parser(
        "reload",
        help="have the services of this data folder's `signoff up` read the tools file (and the model-step its "
        "providers) again; a file that cannot be used is refused whole, naming the tool, and nothing changes",
    )

    channel = commands.add_parser("channel", help="channel adapters: register one (no restart), or run Slack or email")
    channel_commands = channel.add_subparsers(dest="channel_command", required=True)
    channel_add = channel_commands.add_parser(
        "add", help="register a channel and the people it may answer for; the ledger takes it without a restart"
    )
    channel_add.add_argument("name", help="slack, email, or your adapter's name")
    channel_add.add_argument(
        "--principal",
        action="append",
        default=[],
        help="a person it may answer for (again for more; "
        "default for slack and email: the people their users file maps)",
    )
    channel_run = channel_commands.add_parser("run", help="run a built-in channel adapter in the foreground")
    channel_run.add_argument("name", choices=["slack", "email"])

    user = commands.add_parser("user", help="the HTTP gateway's users (their logins)")
    user_commands = user.add_subparsers(dest="user_command", required=True)
    user_add = user_commands.add_parser("add", help="add a user, or set their password, groups and role")
    user_add.add_argument("name")
    user_add.add_argument("--group", action="append", default=[], help="a group they belong to; repeat for more")
    user_add.add_argument("--operator", action="store_true", help="may see every session and request")
    secret = user_add.add_mutually_exclusive_group()
    secret.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    secret.add_argument("--generate", action="store_true", help="make a password and print it once")
    secret.add_argument(
        "--oidc", action="store_true", help="no password: they log in only through OpenID Connect, as this name"
    )
    user_remove = user_commands.add_parser("remove", help="remove a user (their sessions end)")
    user_remove.add_argument("name")
    user_commands.add_parser("list", help="the users, their groups and who is an operator")
    token = commands.add_parser("token", help="the HTTP gateway's API tokens for programs")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    token_create = token_commands.add_parser("create", help="make a token (printed once; again: replaces it)")
    token_create.add_argument("--name", required=True, help="the program's name; it speaks as bot:NAME")
    token_create.add_argument(
        "--scope", required=True, help="comma-separated: sessions:start, requests:read, requests:decide"
    )
    token_create.add_argument(
        "--expires",
        help="when it stops working: a lifetime (90m, 12h, 30d) or an ISO time with its zone; default: until revoked",
    )
    token_revoke = token_commands.add_parser("revoke", help="revoke a token (at once, on every gateway)")
    token_revoke.add_argument("name")
    token_commands.add_parser("list", help="the tokens' names and scopes (never the tokens)")
    commands.add_parser("demo", help="run the services and drive one session through an approval")

    session = commands.add_parser("session", help="start or show a session")
    session_commands = session.add_subparsers(dest="session_command", required=True)
    start = session_commands.add_parser("start", help="start a turn (a new session unless --session is given)")
    start.add_argument("text", nargs="?", default="Please publish the release notes for version 1.2.")
    start.add_argument("--session", help="an existing session id, or the id for a new one")
    start.add_argument("--wait", action="store_true", help="follow the session's events until it waits or idles")
    start.add_argument("--provider", help=f"model provider for a new session ({', '.join(PROVIDERS)})")
    start.add_argument(
        "--as",
        dest="responder",
        help="who starts it (a tool may forbid its starter to approve its calls); " + AS_HELP,
    )
    show = session_commands.add_parser("show", help="a session's status, transcript and pending requests")
    show.add_argument("session_id")

    pending = commands.add_parser(
        "pending", help="approval requests waiting for a person, a page at a time, the first to expire first"
    )
    pending.add_argument("--session")
    pending.add_argument("--tool", help="only this tool's requests")
    pending.add_argument("--approver", metavar="NAME", help="only those NAME may approve (as the tools file says now)")
    pending.add_argument("--page", type=int, default=1, help="which page (from 1)")
    pending.add_argument("--page-size", type=int, help="cards per page (20)")
    pending.add_argument("--all", action="store_true", help="every card, not a page")
    approve = commands.add_parser("approve", help="approve a request")
    approve.add_argument("request_id")
    approve.add_argument("--message", default="", help="a note for the model, sent with the decision")
    approve.add_argument("--as", dest="responder", help=AS_HELP)
    approve.add_argument("--yes", action="store_true", help="approve without being shown the card and asked")
    deny = commands.add_parser("deny", help="deny a request")
    deny.add_argument("request_id")
    deny.add_argument("--reason", required=True)
    deny.add_argument("--as", dest="responder", help=AS_HELP)
    answer = commands.add_parser(
        "respond", help="answer a request in the tool's place (it does not run; the model reads the answer)"
    )
    answer.add_argument("request_id")
    answer.add_argument("--message", required=True, help="the answer the model reads as the tool's result")
    answer.add_argument("--as", dest="responder", help=AS_HELP)

    cancel = commands.add_parser("cancel", help="cancel a session's open turn (by session or turn id)")
    cancel.add_argument("target", help="ses_… (its open turn) or trn_…")
    cancel.add_argument("--reason", default="")
    cancel.add_argument("--as", dest="responder", help=AS_HELP)

    grants = commands.add_parser("grants", help="remembered approvals (approve and remember): list them, or revoke one")
    grants.add_argument("--session", help="only this session's grants")
    grants_commands = grants.add_subparsers(dest="grants_command")
    revoke = grants_commands.add_parser("revoke", help="revoke a grant: calls decided after it ask a person again")
    revoke.add_argument("grant_id", help="grt_… (as `signoff grants` lists it)")
    revoke.add_argument("--reason", default="", help="why (recorded in the audit log)")
    revoke.add_argument("--as", dest="responder", help=AS_HELP)

    dead = commands.add_parser(
        "dead-letters", help="list parked (dead-lettered) messages with their reasons; replay or drop them"
    )
    dead.add_argument("--limit", type=int, default=100, help="show at most this many (default 100)")
    dead_commands = dead.add_subparsers(dest="dead_command")
    replay = dead_commands.add_parser("replay", help="send parked messages back where they came from, after a fix")
    drop = dead_commands.add_parser("drop", help="remove parked messages for good, with a reason (recorded)")
    for verb in (replay, drop):
        which = verb.add_mutually_exclusive_group(required=True)
        which.add_argument("message_id", nargs="?", help="the parked message's id (as `signoff dead-letters` lists)")
        which.add_argument("--all", action="store_true", help="every parked message")
        verb.add_argument("--as", dest="operator", default=os.environ.get("USER", "cli"), help="who acts")
    replay.add_argument("--reason", default="", help="why (recorded with the replay)")
    drop.add_argument("--reason", required=True, help="why (recorded in the ledger)")

    commands.add_parser(
        "status",
        help="each service replica (ready?), each queue, relay lag, approvals waiting, dead letters; "
        "exits 1 when something needs a person",
    )
    audit = commands.add_parser("audit", help="the tamper-evident audit log: verify, show a session, export")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    audit_commands.add_parser("verify", help="check both hash chains; name the first broken entry (exit 1)")
    audit_show = audit_commands.add_parser("show", help="a session's story, as a person reads it")
    audit_show.add_argument("session_id")
    export = audit_commands.add_parser("export", help="every entry as a JSON line")
    export.add_argument("--output", help="a file to write (default: standard output)")
    export.add_argument("--session", help="only this session's entries")

    # Listed here; its options are its own (services/operations/tool_launcher.py, `signoff tool-launcher --help`).
    commands.add_parser(
        "tool-launcher",
        help="start python tools as signoff-tools for an executor that is not root (runs as root; "
        "`signoff up` starts it itself)",
    )
    # Listed here; its options are its own (services/mcp_proxy/main.py, `signoff mcp-proxy --help`).
    commands.add_parser(
        "mcp-proxy",
        help="an MCP server in front of other MCP servers, whose `ask` tools wait for a person (stdio or HTTP)",
    )
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["mcp-proxy"]:
        # Before the settings are read: the proxy runs beside a desktop host, not beside the services.
        from services.mcp_proxy import main as mcp_proxy

        return mcp_proxy.main(arguments[1:])
    if arguments[:1] == ["tool-launcher"]:
        # Before the settings are read: the launcher takes none of Signoff's.
        from services.operations import tool_launcher

        return tool_launcher.main(arguments[1:])

    args = parser.parse_args(argv)
    settings = Settings()
    # Crash tests kill a command at a named point (shared/faults.py), as they kill services.
    faults.arm(settings.faults, settings.data_dir)
    try:
        if args.command == "run":
            return run_service(ALIASES.get(args.service, args.service))
        if args.command == "up":
            return Supervisor(settings, args.log_dir).run_until_interrupted()
        if args.command == "reload":
            return ask_to_reload(settings)
        from services.operations import audit_log, decisions, demo, deployment, parked, sessions
        from shared.runtime import check_reachable

        if args.command in ("migrate", "session", "pending", "audit", "grants"):
            check_reachable(settings, only=("PostgreSQL",))
        if getattr(args, "responder", "") is None:
            from shared.keyring import os_user

            args.responder = os_user()  # the CLI's channel asserts whoever runs it

        if args.command == "setup":
            return deployment.setup(settings, args.cli_principal, args.hand_out)
        if args.command == "migrate":
            return asyncio.run(deployment.migrate_only(settings))
        if args.command == "channel":
            from services.operations import channels

            if args.channel_command == "run":
                return channels.run(settings, args.name)
            for line in channels.add(settings, args.name, args.principal):
                print(f"signoff channel: {line}")
            return 0
        if args.command == "user":
            return user_command(settings, args)
        if args.command == "token":
            return token_command(settings, args)
        if args.command == "demo":
            return demo.demo(settings)
        if args.command == "session" and args.session_command == "start":
            return asyncio.run(
                sessions.start_session(settings, args.text, args.session, args.wait, args.provider, args.responder)
            )
        if args.command == "session":
            return asyncio.run(sessions.show_session(settings, args.session_id))
        if args.command == "pending":
            return asyncio.run(
                decisions.list_pending(
                    settings,
                    args.session,
                    tool=args.tool,
                    approver=args.approver,
                    page=args.page,
                    every=args.all,
                    **({"page_size": args.page_size} if args.page_size is not None else {}),
                )
            )
        if args.command == "approve":
            return asyncio.run(
                decisions.respond(
                    settings, args.request_id, "approve", "", args.message, args.responder, confirm=not args.yes
                )
            )
        if args.command == "deny":
            return asyncio.run(decisions.respond(settings, args.request_id, "deny", args.reason, "", args.responder))
        if args.command == "respond":
            return asyncio.run(
                decisions.respond(settings, args.request_id, "respond", "", args.message, args.responder)
            )
        if args.command == "cancel":
            return asyncio.run(sessions.cancel(settings, args.target, args.reason, args.responder))
        if args.command == "grants" and args.grants_command == "revoke":
            return asyncio.run(decisions.revoke_grant(settings, args.grant_id, args.reason, args.responder))
        if args.command == "grants":
            return asyncio.run(decisions.list_grants(settings, args.session))
        if args.command == "status":
            from services.operations.status import show_status

            return asyncio.run(show_status(settings))
        if args.command == "audit" and args.audit_command == "verify":
            return asyncio.run(audit_log.audit_verify(settings))
        if args.command == "audit" and args.audit_command == "show":
            return asyncio.run(audit_log.audit_show(settings, args.session_id))
        if args.command == "audit":
            return asyncio.run(audit_log.audit_export(settings, args.output, args.session))
        if args.command == "dead-letters" and args.dead_command == "replay":
            return asyncio.run(parked.replay_dead_letters(settings, args.message_id, args.operator, args.reason))
        if args.command == "dead-letters" and args.dead_command == "drop":
            return asyncio.run(parked.drop_dead_letters(settings, args.message_id, args.operator, args.reason))
        if args.command == "dead-letters":
            return asyncio.run(parked.dead_letters(settings, args.limit))
    except KeyboardInterrupt:
        return 130
    parser.error("unknown command")
    return 2


def token_command(settings: Settings, args: argparse.Namespace) -> int:
    """`signoff token create|revoke|list`: programs' API tokens, beside the users file."""
    from services.gateway import admin

    if args.token_command == "list":
        for line in admin.list_tokens(settings):
            print(line)
        return 0
    if args.token_command == "revoke":
        done = admin.revoke_token(settings, args.name)
    else:
        token, done = admin.create_token(settings, args.name, args.scope, args.expires)
        print(f"token for {args.name}: {token}  (shown once; send it as Authorization: Bearer …)")
    for line in done:
        print(f"signoff token: {line}")
    return 0


def user_command(settings: Settings, args: argparse.Namespace) -> int:
    """`signoff user add|remove|list`: the gateway's users file, and its channel's principals to match."""
    import getpass
    import secrets as random

    from services.gateway import admin

    if args.user_command == "list":
        for line in admin.list_users(settings):
            print(line)
        return 0
    if args.user_command == "remove":
        done = admin.remove_user(settings, args.name)
    else:
        password: str | None
        if args.oidc:
            password = None
        elif args.generate:
            password = random.token_urlsafe(15)
        elif args.password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = getpass.getpass(f"password for {args.name}: ")
            if getpass.getpass("again: ") != password:
                raise SystemExit("signoff user add: the passwords differ")
        done = admin.add_user(settings, args.name, password, args.group, args.operator)
        if args.generate:
            print(f"password for {args.name}: {password}  (shown once)")
    for line in done:
        print(f"signoff user: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
