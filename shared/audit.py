"""The audit log's rules, as pure functions: how an entry is chained to the one
before it (per session, in the ledger's transaction) and to the global chain
(linked after commit, in commit order), how both chains are checked, and how an
entry reads to a person.

An entry holds what happened, never what was said: tools and ids in clear,
arguments, outputs, tool errors and free text of the model as digests
(`digest_of`), so the record can be exported and kept without the secrets it
is about (docs/design.md, "The audit log").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared.signatures import canonical

HASH_PREFIX = "sha256:"


def digest_of(value: Any) -> str:
    """A plain hash of a value's canonical JSON: shows that two records speak of the
    same content without showing it."""
    return HASH_PREFIX + hashlib.sha256(canonical(value)).hexdigest()


def _moment(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds")


def entry_hash(entry: dict[str, Any], prev_hash: str | None) -> str:
    """An entry's hash: its content and the hash of the session's entry before it
    (None: the session's first, or an entry of no session on record)."""
    covered = {
        "session_id": entry["session_id"],
        "session_seq": entry["session_seq"],
        "kind": entry["kind"],
        "subject": entry["subject"],
        "actor": entry["actor"],
        "message_id": entry["message_id"],
        "detail": entry["detail"],
        "recorded_at": _moment(entry["recorded_at"]),
        "prev_hash": prev_hash,
    }
    return HASH_PREFIX + hashlib.sha256(canonical(covered)).hexdigest()


def chained(
    *,
    session_id: str,
    head: tuple[int, str | None] | None,
    kind: str,
    subject: str | None,
    actor: str | None,
    message_id: str | None,
    detail: dict[str, Any],
    at: datetime,
) -> dict[str, Any]:
    """The row of a new entry after the session's chain head `head` (its last
    sequence number and hash); None: the session is not on record, so the entry
    is chained globally only."""
    entry: dict[str, Any] = {
        "session_id": session_id,
        "session_seq": None if head is None else head[0] + 1,
        "kind": kind,
        "subject": subject,
        "actor": actor,
        "message_id": message_id,
        "detail": detail,
        "recorded_at": at,
        "prev_hash": None if head is None else head[1],
    }
    entry["hash"] = entry_hash(entry, entry["prev_hash"])
    return entry


def link_hash(seq: int, entry_hash_: str, prev_hash: str | None) -> str:
    """A link of the global chain: its position, the entry's hash, the link before it."""
    return HASH_PREFIX + hashlib.sha256(canonical({"seq": seq, "entry": entry_hash_, "prev": prev_hash})).hexdigest()


def links(entries: Iterable[tuple[int, str]], head: tuple[int, str | None]) -> list[dict[str, Any]]:
    """The global chain's next links for `entries` ((id, hash), in commit order) after
    the chain head `head` (its last position and hash)."""
    seq, prev = head
    made = []
    for entry_id, hashed in entries:
        seq += 1
        this = link_hash(seq, hashed, prev)
        made.append({"seq": seq, "entry_id": entry_id, "entry_hash": hashed, "prev_hash": prev, "hash": this})
        prev = this
    return made


@dataclass(frozen=True)
class Broken:
    """The first entry (lowest id) whose record does not hold, and why."""

    entry_id: int | None
    session_id: str | None
    session_seq: int | None
    reason: str

    def line(self) -> str:
        where = f"entry {self.entry_id}" if self.entry_id is not None else "the global chain"
        if self.session_id is not None:
            where += f" (session {self.session_id} #{self.session_seq})"
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class Verdict:
    entries: int
    linked: int
    # Entries committed after the last link: their session chains checked, not yet in the global chain.
    pending: int
    broken: Broken | None

    @property
    def intact(self) -> bool:
        return self.broken is None


def linked_below(entry: dict[str, Any], horizon: int, *, by_txid: bool) -> bool:
    """Whether the linker has passed an entry (services/approval_ledger/audit.py): on
    PostgreSQL every transaction id below the horizon is linked, on SQLite every id up to it."""
    if by_txid:
        return entry["txid"] is not None and entry["txid"] < horizon
    return bool(entry["id"] <= horizon)


def session_problems(entries: list[dict[str, Any]]) -> list[Broken]:
    """Each entry against its hash, and each session's chain: numbered 1, 2, … with
    every entry naming the hash of the one before."""
    problems: list[Broken] = []
    sessions: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        if entry_hash(entry, entry["prev_hash"]) != entry["hash"]:
            problems.append(_at(entry, "its content does not match its hash (changed after it was written)"))
        if entry["session_seq"] is not None:
            sessions.setdefault(entry["session_id"], []).append(entry)
    for chain_of_session in sessions.values():
        chain_of_session.sort(key=lambda e: e["session_seq"])
        previous: dict[str, Any] | None = None
        for entry in chain_of_session:
            expected = 1 if previous is None else previous["session_seq"] + 1
            if entry["session_seq"] != expected:
                problems.append(_at(entry, f"the session's entry #{expected} before it is missing"))
            elif entry["prev_hash"] != (None if previous is None else previous["hash"]):
                problems.append(_at(entry, "it does not name the hash of the session's entry before it"))
            previous = entry
    return problems


def _at(entry: dict[str, Any] | None, reason: str) -> Broken:
    if entry is None:
        return Broken(None, None, None, reason)
    return Broken(entry["id"], entry["session_id"], entry["session_seq"], reason)


def first(problems: list[Broken]) -> Broken | None:
    """The problem at the lowest entry id (one of the global chain alone comes last)."""
    return min(problems, key=lambda p: (p.entry_id is None, p.entry_id or 0), default=None)


def verify(
    entries: list[dict[str, Any]], chain: list[dict[str, Any]], head: dict[str, Any] | None, *, by_txid: bool
) -> Verdict:
    """Check every entry and session chain (`session_problems`), the global chain
    (numbered 1, 2, … each link naming the one before and an entry's hash as it was
    when linked) up to its head, and that every entry the linker has passed is
    linked. `chain`: the links up to the head (read after it). The problem at the
    lowest entry id is named."""
    problems = session_problems(entries)
    by_id = {e["id"]: e for e in entries}
    linked: set[int] = set()
    prev_link: dict[str, Any] | None = None
    for link in sorted(chain, key=lambda k: k["seq"]):
        target = by_id.get(link["entry_id"])
        expected = 1 if prev_link is None else prev_link["seq"] + 1
        prev_hash = None if prev_link is None else prev_link["hash"]
        if link["seq"] != expected:
            problems.append(_at(target, f"link #{expected} of the global chain is missing"))
        elif link["prev_hash"] != prev_hash or link_hash(link["seq"], link["entry_hash"], prev_hash) != link["hash"]:
            problems.append(_at(target, f"link #{link['seq']} of the global chain does not follow the one before it"))
        if target is None:
            problems.append(_at(None, f"link #{link['seq']} names entry {link['entry_id']}, which is gone"))
        elif target["hash"] != link["entry_hash"]:
            problems.append(_at(target, "its hash is not the one the global chain linked (rewritten after it)"))
        linked.add(link["entry_id"])
        prev_link = link
    head_seq, head_hash = (head["seq"], head["hash"]) if head else (0, None)
    if (head_seq, head_hash) != ((prev_link["seq"], prev_link["hash"]) if prev_link else (0, None)):
        problems.append(_at(None, f"the chain head (#{head_seq}) is not the last link of the global chain"))
    horizon = head["horizon"] if head else 0
    pending = 0
    for entry in entries:
        if entry["id"] in linked:
            continue
        if linked_below(entry, horizon, by_txid=by_txid):
            problems.append(_at(entry, "it is missing from the global chain, though written before its last link"))
        else:
            pending += 1
    return Verdict(entries=len(entries), linked=len(linked), pending=pending, broken=first(problems))


# What a person's decision did to a request, as the story tells it.
DECIDED_AS = {"approve": "approved", "deny": "denied", "respond": "answered in the tool's place"}


def _short(value: str | None) -> str:
    return "" if value is None else value if len(value) <= 23 else value[:23] + "…"


def story(entry: dict[str, Any]) -> str:
    """One entry as a person reads it."""
    d = entry["detail"]
    who = entry["actor"] or "someone"
    subject = entry["subject"]
    kind = entry["kind"]
    if kind == "turn.started":
        return f"{who} started turn {subject}"
    if kind == "turn.repeated":
        return f"{who} asked again with the key that started turn {subject}: nothing new started"
    if kind == "call.proposed":
        plan = {"ask": "needs a person's approval", "run": "runs without approval (policy)"}.get(
            d.get("plan"), f"closed at once ({d.get('reason_code')})"
        )
        if d.get("grant_id"):
            plan = f"runs without a card: grant {d['grant_id']} covers it"
        # Why it asks or runs unasked: the tool's rule over the arguments (entries made before rules have none).
        # (Not for a grant's: its reason says why it would have asked.)
        shown = d.get("reason") and d.get("plan") in ("ask", "run") and not d.get("grant_id")
        why = f" ({d['reason']})" if shown else ""
        return (
            f"the model asked to call {d.get('tool')} as {subject} (arguments {_short(d.get('call_digest'))}): "
            f"{plan}{why}"
        )
    if kind == "approval.requested":
        return (
            f"approval request {subject} for {d.get('call_id')} ({d.get('tool')}), "
            f"{d.get('approvals_required')} approval(s) needed, digest {_short(d.get('args_digest'))}"
            + (f": {d['reason']}" if d.get("reason") else "")
            + (f" (the rule could not be evaluated: {d['rule_error']})" if d.get("rule_error") else "")
        )
    if kind == "arguments.edited":
        # Who changed what (secrets hidden), both digests, and the count the edited version restarts.
        withdrawn = d.get("approvals_withdrawn") or 0
        return (
            f"{who} edited the arguments of {subject} ({d.get('tool')}) before approving"
            + (f": {d['edit']}" if d.get("edit") else f" ({', '.join(d.get('changed') or [])})")
            + f"; digest {_short(d.get('original_digest'))} → {_short(d.get('edited_digest'))}, "
            f"{d.get('approvals_required')} approval(s) needed"
            + (f" ({d['reason']})" if d.get("reason") else "")
            + (f"; {withdrawn} earlier approval(s) no longer count" if withdrawn else "")
        )
    if kind == "response.accepted":
        verb = DECIDED_AS.get(str(d.get("decision")), "denied")
        counted = f" ({d['count']} of {d['required']})" if d.get("count") is not None else ""
        return f"{who} {verb} {subject} via channel {d.get('channel')}{counted}"
    if kind == "response.rejected":
        return f"a response by {who} to {subject} was refused: {d.get('reason_code')}: {d.get('reason_text')}"
    if kind == "message.rejected":
        return f"{d.get('type')} {entry['message_id']} was refused: {d.get('reason_code')}: {d.get('reason_text')}"
    if kind == "approval.decided":
        reason = f": {d['reason']}" if d.get("reason") else ""
        return f"{subject} was {DECIDED_AS.get(str(d.get('decision')), 'denied')} by {who}{reason}"
    if kind == "approval.escalated":
        return f"{subject} was announced again to {', '.join(d.get('to', []))}"
    if kind == "grant.created":
        target = f"on {d['target']}" if d.get("target") is not None else "on any target"
        until = f"until {d['expires_at']}" if d.get("expires_at") else "for the rest of the session"
        return (
            f"{who} approved {d.get('request_id')} and remembered it: grant {subject} lets "
            f"{d.get('tool')} run without a card {target}, {until}"
        )
    if kind == "grant.used":
        return f"{d.get('call_id')} ({d.get('tool')}) runs without a card: {who}'s grant {subject} covers it"
    if kind == "grant.revoked":
        reason = f": {d['reason']}" if d.get("reason") else ""
        return f"{who} revoked grant {subject} ({d.get('tool')}); its calls ask a person again{reason}"
    if kind == "execution.authorized":
        basis = f"the approval of {d['request_id']}" if d.get("request_id") else "policy"
        if d.get("grant_id"):
            basis = f"grant {d['grant_id']}"
        return f"{subject} ({d.get('tool')}) was sent to the executor on {basis}"
    if kind == "execution.claimed":
        return f"executor {who} claimed {subject} (attempt {d.get('attempt')})"
    if kind == "execution.finished":
        return f"{subject} ran: {d.get('outcome')}"
    if kind == "execution.refused":
        return f"the executor refused to run {subject} ({d.get('tool')}): {d.get('reason_code')}"
    if kind == "call.closed":
        reason = f" ({d['reason_code']}: {d['reason_text']})" if d.get("reason_text") else ""
        return f"{subject} closed as {d.get('closed_as')}{reason}"
    if kind == "turn.ended":
        reason = f" ({d['reason_code']})" if d.get("reason_code") else ""
        if d.get("status") == "cancelled":
            # A cancellation's who and why are on the entry itself (a person's words, not a digest).
            reason = (f" by {d['by']}" if d.get("by") else "") + (f": {d['reason']}" if d.get("reason") else "")
        return f"turn {subject} {d.get('status')}{reason}"
    return f"{kind} {subject or ''}".rstrip()
