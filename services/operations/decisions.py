"""`signoff pending`, `signoff approve|deny` and `signoff grants`: the requests waiting
for a person, a signed decision on one, and the standing grants."""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import datetime
from typing import Literal

from services.operations.cards import print_request, question
from services.operations.console import Console, check_may_assert
from shared.catalogue import load_catalogue
from shared.ledger.console_reads import ConsoleLedger
from shared.ledger.tables import Grant
from shared.messages import RevokeGrant, now
from shared.on_screen import FIELD_CHARS, TARGET_CHARS, TEXT_CHARS, visible
from shared.settings import Settings

# `signoff pending` shows this many cards unless told otherwise (`--page-size`, `--all`):
# with thousands waiting, a terminal full of cards helps nobody.
PENDING_PAGE = 20


async def list_pending(
    settings: Settings,
    session_id: str | None,
    *,
    tool: str | None = None,
    approver: str | None = None,
    page: int = 1,
    page_size: int = PENDING_PAGE,
    every: bool = False,
) -> int:
    """The pending requests, the first to expire first, a page at a time; then how many
    more there are. Read along `ix_approval_requests_due` (status, expires_at): a page
    costs its cards and the count, not a card per request waiting."""
    if page < 1 or page_size < 1:
        print("signoff: --page and --page-size count from 1", file=sys.stderr)
        return 2
    approvable_by = (load_catalogue(settings.tools_file), approver) if approver else None
    skipped = 0 if every else (page - 1) * page_size
    async with ConsoleLedger(settings) as ledger:
        total, requests = await ledger.pending(
            session_id=session_id,
            tool=tool,
            approver=approvable_by,
            skip=skipped,
            limit=None if every else page_size,
        )
    if not total:
        print("no pending approval requests")
    elif not requests:
        print(f"no page {page}: {total} pending, {page_size} a page")
    for request in requests:
        print(f"session {visible(request.session_id, FIELD_CHARS)}")
        print_request(request)
    more = total - skipped - len(requests)
    if requests and more > 0:
        print(f"{more} more; --all or --page {page + 1}")
    return 0


async def respond(
    settings: Settings,
    request_id: str,
    decision: Literal["approve", "deny", "respond"],
    reason: str,
    message: str,
    responder: str,
    *,
    confirm: bool = False,
) -> int:
    """Send a decision; with `confirm`, first show the card and ask (a person approves
    what they saw, not an id)."""
    check_may_assert(settings, responder)
    async with Console(settings) as console:
        request = await console.request(request_id)
        if request is not None and request.status != "pending":
            print(f"signoff: request {request_id} is already {request.status}", file=sys.stderr)
            return 1
        if confirm and request is not None:
            print_request(request)
            if not _confirmed(question(decision, request.id, responder, request.card)):
                print(f"signoff: not sent; nothing was decided for {request_id}", file=sys.stderr)
                return 1
        message_id = await console.respond(request_id, decision, reason, message, responder)
        print(f"{decision} sent for {request_id} (message {message_id})")
    return 0


def _confirmed(question: str) -> bool:
    """A person's yes at the terminal; no terminal, or anything but yes, is a no."""
    print(question, end="", flush=True)
    answer = sys.stdin.readline() if sys.stdin is not None else ""
    return answer.strip().lower() in ("y", "yes")


def grant_line(grant: Grant, at: datetime) -> str:
    """One grant as `signoff grants` lists it (texts through `visible`)."""
    if grant.revoked_at is not None:
        by = visible(grant.revoked_by or "", FIELD_CHARS)
        state = f"revoked by {by} at {grant.revoked_at.isoformat(timespec='seconds')}"
    elif grant.expires_at is not None and grant.expires_at <= at:
        state = "expired"
    else:
        state = "live"
    target = "any target" if grant.target is None else visible(grant.target, TARGET_CHARS)
    until = "the rest of the session" if grant.expires_at is None else grant.expires_at.isoformat(timespec="seconds")
    return (
        f"{grant.id}  {state}  session {visible(grant.session_id, FIELD_CHARS)}  "
        f"{visible(grant.tool, FIELD_CHARS)} v{visible(grant.tool_version, FIELD_CHARS)} on {target}, "
        f"until {until}; given by {visible(grant.granted_by, FIELD_CHARS)} "
        f"at {grant.granted_at.isoformat(timespec='seconds')}"
    )


async def list_grants(settings: Settings, session_id: str | None) -> int:
    """Every remembered approval (of one session, or all), live, expired or revoked."""
    async with ConsoleLedger(settings) as ledger:
        grants = await ledger.grants(session_id)
    if not grants:
        print("no grants")
    at = now()
    for grant in grants:
        print(grant_line(grant, at))
    return 0


async def revoke_grant(settings: Settings, grant_id: str, reason: str, by: str) -> int:
    """Revoke a grant as `by` (the ledger judges whether they may) and wait for its
    verdict: the audit log's entry for this very command (revoked, or refused and why)."""
    check_may_assert(settings, by)
    async with Console(settings) as console:
        grant = await console.ledger.grant(grant_id)
        if grant is None:
            print(f"signoff: no grant {grant_id}", file=sys.stderr)
            return 1
        command = RevokeGrant(session_id=grant.session_id, grant_id=grant_id, reason=reason, revoked_by=by)
        await console.send(command)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            entry = await console.ledger.audit_entry_of(grant.session_id, command.message_id)
            if entry is not None and entry.kind == "grant.revoked":
                print(f"revoked grant {grant_id}: calls decided from now on ask a person again")
                return 0
            if entry is not None:
                detail = entry.detail or {}
                said = f"{detail.get('reason_code')}: {visible(str(detail.get('reason_text', '')), TEXT_CHARS)}"
                print(f"signoff: not revoked: {said}", file=sys.stderr)
                return 1
            await asyncio.sleep(0.2)
        print(f"signoff: revocation sent for {grant_id}; no answer from the ledger within 30 s", file=sys.stderr)
        return 1
