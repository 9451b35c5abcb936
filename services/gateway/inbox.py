"""The web inbox: server-rendered pages (Jinja2) where a person signs off from a browser.

Everything here goes through the gateway's own API functions, in-process, with the
person the cookie proves: a decision through `decisions.decide` (the one decision path
the API's route takes too), a login, start, cancel or revocation through the API
routers' functions. So a decision from a page is the same message,
signed the same way, judged by the same ledger, as one sent to the JSON API. What
the pages add is the form around it: a state-changing form carries the session's
CSRF token as a field (checked like the `X-CSRF-Token` header, with the Origin), an
approval carries the digest of the arguments the page showed (the ledger refuses
it for any other arguments), and each rendered form carries its own
Idempotency-Key, so a form sent twice decides once.

Live updates: the pages' script (static/inbox.js) listens to `GET /v1/events`
(EventSource) and reloads the part of the page an event concerns. The pages work
without it, only not live.

Refusals are pages: "you may not approve this" with the ledger's reason code and
text, "this card expired", "already decided", "the arguments changed".
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from shared import audit
from shared.catalogue import ToolSpec
from shared.ledger.pages import BadCursor
from shared.ledger.tables import Turn
from shared.on_screen import FIELD_CHARS, TARGET_CHARS, TEXT_CHARS, card_face, json_lines, visible
from shared.redaction import redact_text

from . import cards, decisions, logins, sessions
from .bodies import CancelBody, DecisionBody, LoginBody, RememberBody, RevokeBody, StartBody
from .callers import Caller, Gateway, caller, check_origin, gateway_of
from .problems import Problem
from .reads import Ledger

HERE = Path(__file__).parent
PREFIX = "/inbox"
# The inbox shows this many cards a page, the oldest first; a link leads to the next
# (with thousands waiting, one page of all of them helps nobody).
INBOX_PAGE = 50
TEMPLATES = Jinja2Templates(directory=str(HERE / "templates"))
# The pages load nothing from elsewhere and may not be framed (an approval button in
# someone else's frame is a click they did not mean).
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}
# The ledger's refusals, as a page says them: (title, what it means for the person).
REFUSALS = {
    "expired": ("This card expired", "Nobody decided in time, so it can no longer be approved; nothing will run."),
    "already_decided": ("Already decided", "Someone decided this card before your answer; yours changed nothing."),
    "digest_mismatch": (
        "The arguments changed",
        "Your approval named other arguments than the ones on record; nothing was approved.",
    ),
    "altered": ("The arguments on record changed", "The call was not run and an operator was told."),
}
# The ledger's reason codes that mean "not you" (the API's 403s).
NOT_YOU = "You may not approve this"
IDEMPOTENCY_KEY_CHARS = 200
MAX_FORM_FIELDS = 16


# --- what a page shows ----------------------------------------------------------------------


def shown_card(card: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A card as a page shows it: what every channel shows of it (`card_face`: every text
    from outside through `visible`, so no bidi override, zero-width or look-alike host
    reaches the page unmarked; the arguments laid out as the console's card lays them
    out), what only a page shows (the description, an edit, who may approve), ages and
    deadlines in seconds."""
    face = card_face(card["id"], card, card.get("args_digest", ""))
    created = _aware(card["created_at"])
    expires = _aware(card["expires_at"]) if card.get("expires_at") else None
    return {
        **card,
        "tool_shown": face.tool,
        "label_shown": face.label,
        "description_shown": visible(card.get("description", ""), TEXT_CHARS),
        # Why it needs approval: the tool's rule over these arguments, as the ledger recorded it.
        "reason_shown": face.reason,
        "filed_shown": face.filed,
        "edit_shown": visible(f"{card.get('edited_by')} changed them: {card.get('edit')}", TEXT_CHARS)
        if card.get("edit")
        else "",
        "target_shown": face.target,
        "warnings": face.warnings,
        "argument_lines": face.arguments,
        "hidden_shown": face.hidden,
        "outward": card.get("effect") == "outward",
        "created_iso": created.isoformat(timespec="seconds"),
        "age_seconds": max(0, int((now - created).total_seconds())),
        "expires_iso": expires.isoformat(timespec="seconds") if expires else None,
        "left_seconds": int((expires - now).total_seconds()) if expires else None,
        "approvers_shown": "anyone the gateway vouches for"
        if card.get("approvers") is None
        else ", ".join(visible(a, FIELD_CHARS) for a in card["approvers"]) or "nobody",
    }


# The form's name for an edited argument: `arg.<name>`.
ARGUMENT_FIELD = "arg."


def edit_fields(spec: ToolSpec | None, card: dict[str, Any]) -> list[dict[str, Any]]:
    """The arguments a person may edit on this card (the tool's `editable`, never a hidden
    one), each with its value as shown: text as typed, anything else as JSON."""
    if spec is None or not spec.is_editable:
        return []
    properties = spec.closed_parameters.get("properties", {})
    hidden = set(card.get("hidden", []))
    fields = []
    for name in properties:
        if not spec.may_edit(name) or name in hidden:
            continue
        value = card.get("arguments", {}).get(name)
        text = properties[name].get("type") == "string"
        shown = "" if value is None else (value if text and isinstance(value, str) else json.dumps(value))
        fields.append({"name": name, "label": visible(name, FIELD_CHARS), "value": as_typed(shown), "text": text})
    return fields


def as_typed(value: str) -> str:
    """A value as an edit field shows it: as typed, unless it holds what every other place
    of the card shows as an escape (a bidi control, a zero-width or other invisible
    character): then all of it through `visible`, so the field shows what the card does.
    Sent back unchanged, it leaves the argument as it was (`edited_arguments`)."""
    plain = value.replace("\\", "")
    return value if visible(plain) == plain else visible(value)


def edited_arguments(spec: ToolSpec | None, card: dict[str, Any], form: Mapping[str, str]) -> dict[str, Any]:
    """The whole argument object as edited on the page: the card's arguments as shown, each
    editable field replaced by what the form sent (text as typed, else parsed as JSON; what
    does not parse is sent as typed, and the ledger's schema check refuses it)."""
    arguments = dict(card.get("arguments", {}))
    for field in edit_fields(spec, card):
        sent = form.get(ARGUMENT_FIELD + field["name"])
        if sent is None or sent == field["value"]:
            continue
        if field["text"]:
            arguments[field["name"]] = sent
        else:
            try:
                arguments[field["name"]] = json.loads(sent)
            except ValueError:
                arguments[field["name"]] = sent
    return arguments


# How long a page lets a person remember an approval for, at most (the ledger's own bound is a year).
REMEMBER_HOURS_MAX = 24 * 366


def remember_asked(card: dict[str, Any], form: Mapping[str, str]) -> dict[str, Any] | None:
    """The grant the "Approve and remember" form asks for, as the API takes it: the
    card's target as the page showed it (`remember_target=this`) or any target (`any`),
    for the rest of the session (`remember_for=session`) or `remember_hours` hours.
    None: the form does not remember. The ledger judges whether it may; a value the
    form cannot mean raises ValueError (the page says the form does not fit)."""
    if form.get("remember") != "1":
        return None
    which = form.get("remember_target", "this")
    if which not in ("this", "any"):
        raise ValueError("remember_target is this or any")
    hours: float | None = None
    if form.get("remember_for", "session") == "hours":
        hours = float(form.get("remember_hours", ""))
        if not 0 < hours <= REMEMBER_HOURS_MAX:
            raise ValueError("remember_hours is a positive number of hours, up to a year")
    elif form.get("remember_for", "session") != "session":
        raise ValueError("remember_for is session or hours")
    return {"target": str(card.get("target", "")) if which == "this" else None, "hours": hours}


def shown_grants(grants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A session's grants as its page lists them (texts through `visible`)."""
    return [
        {
            **grant,
            "tool_shown": visible(grant["tool"], FIELD_CHARS),
            "target_shown": "any target" if grant["target"] is None else visible(grant["target"], TARGET_CHARS),
            "by_shown": visible(grant["granted_by"], FIELD_CHARS),
            "until_shown": "the rest of the session"
            if grant["expires_at"] is None
            else _aware(grant["expires_at"]).isoformat(timespec="seconds"),
            "state_shown": "live"
            if grant["live"]
            else f"revoked by {visible(grant['revoked_by'] or '', FIELD_CHARS)}"
            if grant["revoked_at"]
            else "expired",
        }
        for grant in grants
    ]


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def duration(seconds: int | None) -> str:
    """`3 h 05 min`, `4 min 09 s`, `12 s`: what a person reads at a glance."""
    if seconds is None:
        return "no expiry"
    if seconds <= 0:
        return "expired"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


TEMPLATES.env.filters["duration"] = duration


def sorted_for(user, cards: list[dict[str, Any]], starters: dict[str, set[str]], approved: set[str]) -> dict:
    """The person's cards, split: those waiting for them, and those of sessions they
    started that wait on someone else (they may cancel those, not approve them). An
    operator's view of cards they may not approve goes with the second."""
    mine, others = [], []
    for card in cards:
        approvers = card.get("approvers")
        listed = approvers is None or user.name in approvers
        starter = user.name in starters.get(card["session_id"], set())
        if listed and not (starter and not card.get("starter_may_approve", True)) and card["id"] not in approved:
            mine.append(card)
        else:
            card["why_not_yours"] = (
                "you approved it; it waits for more approvers"
                if card["id"] in approved
                else "you started this session and this tool needs someone else to approve it"
                if listed and starter
                else "you are not among its approvers"
            )
            others.append(card)
    return {"mine": mine, "others": others}


# --- reads the pages add (the ledger's record: shared/ledger/gateway_reads.py) ------------


async def story(ledger, session_id: str) -> list[dict[str, Any]]:
    """The session's story from its audit log, as `signoff audit show` tells it (shared/audit.py
    `story`): who started it, each model step's calls, each request, who decided what and
    when, what ran, each closure and its reason. A turn's end gets its reason's text from
    the turn's row when that text is the one the entry's digest names."""
    entries, turns = await ledger.record.audit_entries(session_id)
    told = []
    for entry in entries:
        as_dict = {
            "kind": entry.kind,
            "subject": entry.subject,
            "actor": entry.actor,
            "message_id": entry.message_id,
            "detail": entry.detail or {},
        }
        text = redact_text(audit.story(as_dict))
        digest = as_dict["detail"].get("reason_digest")
        turn = turns.get(entry.subject or "")
        if entry.kind == "turn.ended" and digest and turn is not None and turn.reason_text:
            if audit.digest_of(turn.reason_text) == digest:
                text += ": " + redact_text(turn.reason_text)
            else:
                text += " (the turn's reason text on record does not match this entry's digest)"
        told.append(
            {
                "at": _aware(entry.recorded_at).isoformat(timespec="seconds"),
                "kind": entry.kind,
                "actor": visible(entry.actor or "", FIELD_CHARS),
                "text": visible(text, TEXT_CHARS),
            }
        )
    return told


async def until_on_record(gateway, session_id: str) -> bool:
    """A session just started is on record once the ledger has committed its turn: the
    page it leads to waits for that (at most as long as a decision waits for its verdict),
    so it does not open on "no such session"."""
    deadline = time.monotonic() + gateway.settings.gateway_decision_wait_seconds
    pause = 0.02
    while await gateway.ledger.session(session_id) is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(pause)
        pause = min(pause * 1.5, 0.25)
    return True


# --- forms -------------------------------------------------------------------------------------


async def until_revoked(gateway, grant_id: str) -> Any:
    """The grant's row once the ledger recorded its revocation, or as it stands after the
    gateway's decision wait (a refused revocation leaves it live)."""
    deadline = time.monotonic() + gateway.settings.gateway_decision_wait_seconds
    while True:
        grant = await gateway.ledger.grant(grant_id)
        if grant is None or grant.revoked_at is not None or time.monotonic() >= deadline:
            return grant
        await asyncio.sleep(0.1)


async def form_of(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (the body is bounded by the gateway's limit before this
    reads it); one value per field, the first."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise Problem(415, "unsupported-media-type", "Send the page's form", "A form of the inbox's pages.")
    try:
        text = (await request.body()).decode("utf-8")
        fields = parse_qs(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise Problem(400, "malformed-form", "The form could not be read") from None
    return {name: values[0] for name, values in fields.items()}


def new_key() -> str:
    return "inbox-" + secrets.token_urlsafe(18)


def safe_next(target: str | None) -> str:
    # Only a page of the inbox: never a redirect to another site.
    if target == PREFIX or (
        target
        and target.startswith((PREFIX + "/", PREFIX + "?"))
        and not target.startswith(PREFIX + "//")
        and "\\" not in target
    ):
        return target
    return PREFIX


# --- the routes --------------------------------------------------------------------------------


def page(request: Request, template: str, status: int = 200, who=None, **context: Any) -> HTMLResponse:
    gateway = gateway_of(request)
    context.update(
        request=request,
        who=who,
        csrf=gateway.sessions.csrf_token(who.login) if who is not None else "",
        oidc=gateway.oidc is not None,
    )
    return TEMPLATES.TemplateResponse(request, template, context, status_code=status, headers=PAGE_HEADERS)


def problem_page(request: Request, problem: Problem, who=None) -> HTMLResponse:
    return page(
        request,
        "problem.html",
        status=problem.status,
        who=who,
        title=problem.title,
        detail=problem.detail,
        kind=problem.kind,
    )


async def person(request: Request) -> Caller | None:
    """The person the cookie proves (callers.caller: valid, unexpired, not ended, still a
    user), or None: the page sends them to log in. Programs use the JSON API."""
    if request.headers.get("authorization"):
        raise Problem(403, "people-only", "The inbox is for people", "Programs use the JSON API under /v1.")
    try:
        return await caller(request)
    except Problem as problem:
        if problem.status == 401:
            return None
        raise


def to_login(request: Request) -> RedirectResponse:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{PREFIX}/login?next={quote(here, safe='')}", status_code=303)


Seen = TypeVar("Seen")


async def seen_by_person(
    request: Request, read: Callable[[Ledger, Caller], Awaitable[Seen]]
) -> tuple[Caller, Seen] | Response:
    """What a page shows, read as the person logged in: the login page when nobody is,
    a problem page when they may not see it (a card or session of others: not found)."""
    who = None
    try:
        who = await person(request)
        if who is None:
            return to_login(request)
        return who, await read(gateway_of(request).ledger, who)
    except Problem as problem:
        return problem_page(request, problem, who)


async def form_changing(request: Request) -> tuple[Caller, dict[str, str]]:
    """A form that changes state: a person logged in, the session's CSRF token in the
    form's `csrf_token` field, and (when the browser names one) this gateway's Origin."""
    who = await person(request)
    if who is None:
        raise Problem(401, "unauthenticated", "Log in first", "Your session ended; log in again.")
    form = await form_of(request)
    gateway = gateway_of(request)
    check_origin(request, gateway.settings)
    if not gateway.sessions.csrf_ok(who.login, form.get("csrf_token")):
        raise Problem(403, "csrf", "The form's CSRF token is missing or wrong", "Reload the page and try again.")
    return who, form


# --- the routes: the pages under /inbox (their script and style: /inbox/static, mounted by the app)


router = APIRouter(prefix=PREFIX, include_in_schema=False)


# --- login and logout ----------------------------------------------------------------


@router.get("/login")
async def login_page(request: Request, next: str | None = None) -> Response:
    return page(request, "login.html", next=safe_next(next), error=None)


@router.post("/login")
async def login_form(request: Request) -> Response:
    form = await form_of(request)
    target = safe_next(form.get("next"))
    try:
        body = LoginBody(name=form.get("name", ""), password=form.get("password", ""))
    except ValidationError:
        return page(request, "login.html", status=401, next=target, error="Wrong name or password.")
    answered = Response()
    try:
        await logins.login(body=body, request=request, response=answered)
    except Problem as problem:
        said = "Wrong name or password." if problem.status == 401 else f"{problem.title}. {problem.detail}"
        return page(request, "login.html", status=problem.status, next=target, error=said)
    moved = RedirectResponse(target, status_code=303)
    for name, value in answered.raw_headers:
        if name == b"set-cookie":
            moved.raw_headers.append((name, value))
    return moved


@router.post("/logout")
async def logout_form(request: Request) -> Response:
    try:
        who, _ = await form_changing(request)
        answered = await logins.logout(request=request, who=who)
    except Problem as problem:
        return problem_page(request, problem)
    moved = RedirectResponse(f"{PREFIX}/login", status_code=303)
    moved.raw_headers.extend((n, v) for n, v in answered.raw_headers if n == b"set-cookie")
    return moved


# --- the inbox -----------------------------------------------------------------------


@router.get("")
async def inbox(
    request: Request, decided: str | None = None, outcome: str | None = None, cursor: str | None = None
) -> Response:
    try:
        who = await person(request)
    except Problem as problem:
        return problem_page(request, problem)
    if who is None:
        return to_login(request)
    ledger = gateway_of(request).ledger
    try:
        cards, following = await ledger.requests(who.user, "pending", None, None, INBOX_PAGE, cursor)
    except BadCursor:
        cards, following = await ledger.requests(who.user, "pending", None, None, INBOX_PAGE)
    starters = {s: await ledger.starters(s) for s in {c["session_id"] for c in cards}}
    now = datetime.now(UTC)
    approved = await ledger.record.approved_by(who.user.name, [c["id"] for c in cards])
    split = sorted_for(who.user, [shown_card(c, now) for c in cards], starters, approved)
    notice = None
    if decided and outcome in OUTCOMES:
        notice = OUTCOMES[outcome].format(request=visible(decided, FIELD_CHARS))
    more = None if following is None else f"{PREFIX}?{urlencode({'cursor': following})}"
    return page(request, "inbox.html", who=who, notice=notice, more=more, paged=cursor is not None, **split)


@router.post("/sessions")
async def start_form(request: Request) -> Response:
    """Ask the agent something: a new session started by this person."""
    gateway = gateway_of(request)
    try:
        who, form = await form_changing(request)
        body = StartBody(text=form.get("text", ""))
        started = await sessions.start_session(body=body, gateway=gateway, who=who)
    except ValidationError:
        return problem_page(request, Problem(422, "invalid", "Say what the agent should do"))
    except Problem as problem:
        return problem_page(request, problem)
    await until_on_record(gateway, started.session_id)
    return RedirectResponse(f"{PREFIX}/sessions/{started.session_id}", status_code=303)


# --- a card --------------------------------------------------------------------------


@router.get("/requests/{request_id}")
async def card_page(request: Request, request_id: str) -> Response:
    seen = await seen_by_person(request, lambda ledger, who: cards.card_for(ledger, who, _identifier(request_id)))
    if isinstance(seen, Response):
        return seen
    who, card = seen
    ledger = gateway_of(request).ledger
    shown = shown_card(card, datetime.now(UTC))
    starters = await ledger.starters(card["session_id"])
    approved = await ledger.record.approved_by(who.user.name, [card["id"]])
    split = sorted_for(who.user, [shown], {card["session_id"]: starters}, approved)
    return page(
        request,
        "card.html",
        who=who,
        card=shown,
        key=new_key(),
        hint=None if split["mine"] else shown.get("why_not_yours"),
        may_see_session=await ledger.may_see_session(who.user, card["session_id"]),
        edit_fields=edit_fields(ledger.catalogue.get(card["tool"]), card),
    )


async def decision_asked(gateway: Gateway, who: Caller, request_id: str, form: Mapping[str, str]) -> DecisionBody:
    """The decision a card's form asks for, as the API takes it. The form must carry its
    Idempotency-Key, an approval the digest the page showed, a denial a reason, an answer
    in the tool's place its message; an edit or a remember is read against the card."""
    decision = form.get("decision", "")
    key = form.get("idempotency_key", "")
    if decision not in ("approve", "deny", "respond"):
        raise Problem(422, "invalid", "Choose approve, deny or answer")
    if not key or len(key) > IDEMPOTENCY_KEY_CHARS or not all("\x21" <= c <= "\x7e" for c in key):
        raise Problem(422, "invalid", "The form is not one of this inbox's", "Reload the card and try again.")
    if decision == "approve" and not form.get("args_digest"):
        # The API would take the ledger's digest; a page must name the one it showed.
        raise Problem(422, "invalid", "The approval names no arguments", "Reload the card and try again.")
    if decision == "deny" and not form.get("reason", "").strip():
        raise Problem(422, "reason-required", "Say why you deny it", "A denial needs a reason.")
    if decision == "respond" and not form.get("message", "").strip():
        raise Problem(422, "answer-required", "Write your answer", "An answer in the tool's place needs its text.")
    edited = remember = None
    if decision == "approve" and (form.get("edit") == "1" or form.get("remember") == "1"):
        card = await cards.card_for(gateway.ledger, who, _identifier(request_id))
        if form.get("edit") == "1":
            # The card's arguments as shown, the edited fields replaced; the ledger judges the edit.
            edited = edited_arguments(gateway.ledger.catalogue.get(card["tool"]), card, form)
        try:
            asked = remember_asked(card, form)
        except ValueError as error:
            raise Problem(422, "invalid", "The form does not fit", str(error)) from None
        remember = None if asked is None else RememberBody(**asked)
    return DecisionBody(
        decision="approve" if decision == "approve" else "respond" if decision == "respond" else "deny",
        reason=form.get("reason", "").strip() if decision == "deny" else "",
        message=form.get("message", "").strip() if decision in ("approve", "respond") else "",
        args_digest=form.get("args_digest") if decision == "approve" else None,
        arguments=edited,
        remember=remember,
    )


@router.post("/requests/{request_id}/decision")
async def decision_form(request: Request, request_id: str) -> Response:
    """Approve or deny as the person logged in, through the one decision path the API's
    route takes (decisions.decide); the form carries its own Idempotency-Key."""
    who = None
    gateway = gateway_of(request)
    try:
        who, form = await form_changing(request)
        body = await decision_asked(gateway, who, request_id, form)
        verdict = await decisions.decide(gateway, who, _identifier(request_id), body, form["idempotency_key"])
    except ValidationError as error:
        return problem_page(request, Problem(422, "invalid", "The form does not fit", _fields(error)), who)
    except Problem as problem:
        return problem_page(request, problem, who)
    return verdict_page(request, who, request_id, body.decision, _answer(verdict))


def verdict_page(request: Request, who: Caller, request_id: str, decision: str, answered: dict[str, Any]) -> Response:
    """Back to the inbox, saying what happened; a refusal is a page of its own."""
    if answered.get("outcome") == "accepted":
        outcome = decision if answered.get("decided", True) else "counted"
        return RedirectResponse(f"{PREFIX}?decided={request_id}&outcome={outcome}", status_code=303)
    if answered.get("status") == "pending":
        return RedirectResponse(f"{PREFIX}?decided={request_id}&outcome=sent", status_code=303)
    code = str(answered.get("reason_code") or "")
    title, meaning = REFUSALS.get(code, (NOT_YOU if answered.get("status") == 403 else "Refused", ""))
    return page(
        request,
        "refused.html",
        status=int(answered.get("status", 409)),
        who=who,
        title=title,
        meaning=meaning,
        reason_code=code,
        reason_text=visible(answered.get("detail", ""), TEXT_CHARS),
        request_id=request_id,
    )


# --- a session -----------------------------------------------------------------------


@router.get("/sessions/{session_id}")
async def session_page(request: Request, session_id: str) -> Response:
    seen = await seen_by_person(
        request, lambda ledger, who: sessions.seen_session(ledger, who, _identifier(session_id))
    )
    if isinstance(seen, Response):
        return seen
    who, shown = seen
    ledger = gateway_of(request).ledger
    turn = await ledger.record.latest_turn(session_id)
    now = datetime.now(UTC)
    return page(
        request,
        "session.html",
        who=who,
        session=shown,
        turn_said=turn_said(turn, len(shown["pending_requests"])),
        turn_open=turn is not None and turn.status == "running",
        pending=[shown_card(c, now) for c in shown["pending_requests"]],
        story=await story(ledger, session_id),
        transcript=[_shown_entry(e) for e in shown["transcript"]],
        grants=shown_grants(shown.get("grants", [])),
    )


@router.post("/grants/{grant_id}/revoke")
async def revoke_form(request: Request, grant_id: str) -> Response:
    """Revoke a grant through the API's route; the page returns to the session once
    the ledger has recorded it (or after the decision wait: the page then says so)."""
    who = None
    gateway = gateway_of(request)
    try:
        who, form = await form_changing(request)
        body = RevokeBody(reason=form.get("reason", "").strip())
        await sessions.revoke_grant(grant_id=_identifier(grant_id), body=body, gateway=gateway, who=who)
    except ValidationError as error:
        return problem_page(request, Problem(422, "invalid", "The form does not fit", _fields(error)), who)
    except Problem as problem:
        return problem_page(request, problem, who)
    grant = await until_revoked(gateway, grant_id)
    session_id = grant.session_id if grant is not None else ""
    return RedirectResponse(f"{PREFIX}/sessions/{session_id}?revoked={grant_id}", status_code=303)


@router.post("/sessions/{session_id}/cancel")
async def cancel_form(request: Request, session_id: str) -> Response:
    who = None
    try:
        who, form = await form_changing(request)
        body = CancelBody(reason=form.get("reason", "").strip())
        await sessions.cancel_session(
            session_id=_identifier(session_id), body=body, gateway=gateway_of(request), who=who
        )
    except ValidationError as error:
        return problem_page(request, Problem(422, "invalid", "The form does not fit", _fields(error)), who)
    except Problem as problem:
        return problem_page(request, problem, who)
    return RedirectResponse(f"{PREFIX}/sessions/{session_id}?cancelling=1", status_code=303)


STATIC = StaticFiles(directory=str(HERE / "static"))


OUTCOMES = {
    "approve": "You approved {request}. It runs once, now.",
    "deny": "You denied {request}. The model is told your reason.",
    "respond": "You answered {request} in the tool's place. It does not run; the model reads your answer.",
    "counted": "Your approval of {request} is counted; it waits for more approvers.",
    "sent": "Your decision on {request} was sent; the ledger has not judged it yet.",
}


def turn_said(turn: Turn | None, waiting_on: int) -> str:
    """The session's last turn as a person reads it: running (and on how many cards it
    waits), or how it ended, by whom and why (redacted, through `visible`)."""
    if turn is None:
        return "none yet"
    said = turn.status
    if turn.status == "running" and waiting_on:
        said += f", waiting on {waiting_on} card{'s' if waiting_on > 1 else ''}"
    if turn.ended_by:
        said += f" by {visible(turn.ended_by, FIELD_CHARS)}"
    if turn.reason_code and turn.status != "cancelled":
        said += f" ({visible(turn.reason_code, FIELD_CHARS)})"
    if turn.reason_text:
        said += ": " + visible(redact_text(turn.reason_text), TEXT_CHARS)
    return said


def _identifier(value: str) -> str:
    if not value or len(value) > 64 or not all(c.isascii() and (c.isalnum() or c in "_-") for c in value):
        raise Problem(404, "not-found", "No such page", "No card or session with that id.")
    return value


def _answer(verdict: Any) -> dict[str, Any]:
    """The API's answer as a dict: a Verdict, or a JSON response (a problem, or 202 pending)."""
    if hasattr(verdict, "model_dump"):
        return verdict.model_dump()
    body = json.loads(bytes(verdict.body))
    if verdict.status_code == 202:
        return {**body, "status": "pending"}
    return body


def _fields(error: ValidationError) -> str:
    # Where, never the input itself.
    return "; ".join(".".join(str(p) for p in e.get("loc", ())) + ": " + str(e.get("msg")) for e in error.errors())


def _shown_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A transcript entry (already redacted by the read) through `visible`."""
    return {
        "role": entry["role"],
        "text": visible(entry["text"], TEXT_CHARS) if entry["text"] else "",
        "calls": [
            f"{visible(c.get('name') or '', FIELD_CHARS)} {' '.join(json_lines(c.get('arguments', {}), max_lines=20))}"
            for c in entry["tool_calls"]
        ],
        "closure": entry.get("closure"),
        "call_id": entry.get("call_id"),
    }
