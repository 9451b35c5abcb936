"""The ledger's store in memory: the port (`store.py`) with dicts for tables, for
the handlers' unit tests (tests/unit/test_ledger_handlers.py), which run every
ledger rule in milliseconds without a database.

It keeps the port's promises as the databases do, which the contract suite
checks on all three adapters: a message is received once (the inbox), one
session's transitions are serialized (a lock per session id, held until the
transaction ends, taken again freely by the transaction that holds it), a
transaction sees its own settled writes and what others committed before it
wrote, its writes reach the tables only at commit, and a primary key taken by
a row committed meanwhile fails the commit as a unique index would.
"""

from __future__ import annotations

import asyncio
import copy
from collections import defaultdict
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from shared.messages import Envelope
from shared.topology import Topology

from .decision_rules import Grant
from .domain import (
    Call,
    ClaimOnRecord,
    ClosureOnRecord,
    KeyedTurn,
    Note,
    RequestOnRecord,
    Step,
    TurnSpend,
    starters_of,
)
from .intake_rules import FiledOnRecord
from .store import (
    INSERT_ORDER,
    NO_OPEN_TURN,
    Duplicate,
    LedgerStore,
    OpenTurn,
    SessionState,
    StepCalls,
    StepRead,
    Writes,
    grant_of,
)

# Each table's primary key (or unique key); the others keep every row.
KEYS: dict[str, tuple[str, ...]] = {
    "sessions": ("id",),
    "inbox": ("message_id",),
    "turns": ("id",),
    "steps": ("id",),
    "tool_calls": ("id",),
    "approval_requests": ("id",),
    "grants": ("id",),
    "approvals": ("request_id", "responder"),
    "decisions": ("request_id",),
    "closures": ("call_id",),
    "provider_attempts": ("step_id", "number", "report_message_id"),
    "transcript": ("session_id", "position"),
    "execution_claims": ("call_id",),
    "filed_calls": ("id",),
    "tool_menus": ("digest",),
    "outbox": ("message_id",),
    "audit_log": ("session_id", "session_seq"),
}


class Conflict(Exception):
    """A row's key is taken (a unique index refuses it)."""


Tables = dict[str, dict[tuple, dict[str, Any]]]


class MemoryDatabase:
    """The committed rows, and the sessions' locks."""

    def __init__(self) -> None:
        self.tables: Tables = defaultdict(dict)
        self.locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # The tool menus its ledger knows it holds (`LedgerStore.stored_menus`).
        self.stored_menus: set[str] = set()

    def rows(self, table: str) -> list[dict[str, Any]]:
        return list(self.tables[table].values())

    def store(
        self, topology: Topology, notify_channel: str | None = None, stored_menus: set[str] | None = None
    ) -> MemoryStore:
        """One transaction; `stored_menus`: another process's knowledge of the menus held
        (None: this database's own ledger's)."""
        return MemoryStore(self, topology, notify_channel, self.stored_menus if stored_menus is None else stored_menus)


# Unique keys besides the primary one, as the database's constraints hold them.
UNIQUE: dict[str, tuple[tuple[str, ...], ...]] = {"filed_calls": (("program", "caller_call_id"),)}


def _key(table: str, row: dict[str, Any]) -> tuple:
    return tuple(row.get(column) for column in KEYS[table])


def _write(tables: Tables, writes: Writes) -> None:
    for request_id in writes.recounted:
        for key in [key for key, row in tables["approvals"].items() if row["request_id"] == request_id]:
            del tables["approvals"][key]
    for digest, row in writes.menus.items():
        # Inserted only if absent, as the databases' ON CONFLICT DO NOTHING.
        tables["tool_menus"].setdefault((digest,), copy.deepcopy(row))
    # Receiving writes the inbox row and a new session; a transition, the rest.
    for name in ("inbox", "sessions", *INSERT_ORDER):
        for row in writes.rows.get(name, ()):
            _insert(tables, name, row)
    for (name, key), values in writes.updates.items():
        tables[name][(key,)].update(copy.deepcopy(values))
    for call_id in writes.withdrawn:
        for request in tables["approval_requests"].values():
            if request["call_id"] == call_id and request["status"] == "pending":
                request["status"] = "cancelled"
    for row in writes.outbox:
        _insert(tables, "outbox", row)
    for row in writes.audit:
        _insert(tables, "audit_log", row)


def _insert(tables: Tables, name: str, row: dict[str, Any]) -> None:
    key = _key(name, row)
    if key in tables[name]:
        raise Conflict(f"{name} {key}")
    for columns in UNIQUE.get(name, ()):
        if any(all(other[c] == row[c] for c in columns) for other in tables[name].values()):
            raise Conflict(f"{name} {columns}")
    tables[name][key] = copy.deepcopy(row)


class MemoryStore(LedgerStore):
    def __init__(
        self,
        database: MemoryDatabase,
        topology: Topology,
        notify_channel: str | None = None,
        stored_menus: set[str] | None = None,
    ) -> None:
        super().__init__(topology, notify_channel, stored_menus)
        self._database = database
        self._held: list[asyncio.Lock] = []
        self._held_ids: set[str] = set()
        # What this transaction wrote, in order (replayed on the tables at commit), and
        # its view: the tables as they were at its first write, with its writes.
        self._applied: list[Writes] = []
        self._view: Tables | None = None
        self._committed = False

    @property
    def _tables(self) -> Tables:
        return self._view if self._view is not None else self._database.tables

    async def _begin(self) -> None:
        pass

    async def _end(self) -> None:
        for lock in reversed(self._held):
            lock.release()
        self._held.clear()
        self._held_ids.clear()
        self._applied.clear()
        self._view = None

    async def _commit(self) -> None:
        # Checked on a copy first: a conflict leaves the committed tables as they were.
        after = copy.deepcopy(self._database.tables)
        for writes in self._applied:
            _write(after, writes)
        self._database.tables.clear()
        self._database.tables.update(after)
        self._applied.clear()
        self._view = None

    async def _apply(self, writes: Writes, notify: bool) -> None:
        if self._view is None:
            self._view = copy.deepcopy(self._database.tables)
        _write(self._view, writes)
        self._applied.append(writes)

    # -- receive and lock ------------------------------------------------------------

    async def receive_and_lock(
        self, message: Envelope, *, create_with_provider: str | None = None
    ) -> SessionState | None:
        await self._lock(message.session_id)
        row = self._inbox_row(message)
        if (message.message_id,) in self._tables["inbox"]:
            raise Duplicate(message.message_id)
        received = Writes(rows={"inbox": [row]})
        if create_with_provider is not None and (message.session_id,) not in self._tables["sessions"]:
            received.rows["sessions"] = [
                {
                    "id": message.session_id,
                    "status": "idle",
                    "provider": create_with_provider,
                    "event_seq": 0,
                    "transcript_len": 0,
                    "status_reason": None,
                    "started_by": None,
                    "transcript_digest": None,
                    "audit_seq": 0,
                    "audit_hash": None,
                    "created_at": self.now,
                    "updated_at": self.now,
                }
            ]
        await self._apply(received, False)
        return self._session_row(message.session_id)

    async def lock_session(self, session_id: str) -> SessionState | None:
        await self._lock(session_id)
        return self._session_row(session_id)

    async def _lock(self, session_id: str) -> None:
        if session_id not in self._held_ids:
            lock = self._database.locks[session_id]
            await lock.acquire()
            self._held.append(lock)
            self._held_ids.add(session_id)

    def _session_row(self, session_id: str) -> SessionState | None:
        row = self._tables["sessions"].get((session_id,))
        return self._locked(None if row is None else SessionState.of(SimpleNamespace(**row)))

    # -- reads -----------------------------------------------------------------------

    def _rows(self, table: str) -> list[dict[str, Any]]:
        return list(self._tables[table].values())

    def _waits(self, session_id: str, besides: str | None = None) -> bool:
        return any(
            r["session_id"] == session_id and r["status"] == "pending" and r["id"] != besides
            for r in self._rows("approval_requests")
        )

    def _calls_of_step(self, step_id: str) -> list[Call]:
        step = self._tables["steps"].get((step_id,))
        if step is None:
            return []
        calls = sorted((c for c in self._rows("tool_calls") if c["step_id"] == step_id), key=lambda c: c["position"])
        return [self._call(c, step) for c in calls]

    def _call(self, row: dict[str, Any], step: dict[str, Any]) -> Call:
        closed = self._tables["closures"].get((row["id"],))
        closure = None
        if closed is not None:
            output = (closed["output"] or {}).get("value")
            closure = ClosureOnRecord(closed["kind"], output, closed["reason_code"], closed["reason_text"])
        note = None
        for request in self._rows("approval_requests"):
            if request["call_id"] == row["id"]:
                decision = self._tables["decisions"].get((request["id"],))
                if decision is not None and decision["message"]:
                    note = Note(decision["responder"], decision["message"])
        return Call(
            id=row["id"],
            session_id=row["session_id"],
            step_id=row["step_id"],
            turn_id=step["turn_id"],
            provider_call_id=row["provider_call_id"],
            tool=row["tool"],
            arguments=copy.deepcopy(row["arguments"]),
            idempotency_key=row["idempotency_key"],
            status=row["status"],
            closure=closure,
            note=note,
        )

    async def step(self, step_id: str, session_id: str) -> StepRead:
        row = self._tables["steps"].get((step_id,))
        if row is None:
            return StepRead(None, False)
        return StepRead(Step(row["id"], row["session_id"], row["turn_id"], row["status"]), self._waits(session_id))

    async def call_and_siblings(self, call_id: str, session_id: str) -> StepCalls:
        target = self._tables["tool_calls"].get((call_id,))
        calls = self._calls_of_step(target["step_id"]) if target is not None else []
        return StepCalls(calls, bool(calls) and self._waits(session_id))

    async def request_and_calls(
        self, request_id: str, session_id: str, responder: str, *, response_id: str | None = None
    ) -> tuple[RequestOnRecord | None, StepCalls]:
        row = self._tables["approval_requests"].get((request_id,))
        target = self._tables["tool_calls"].get((row["call_id"],)) if row is not None else None
        step = self._tables["steps"].get((target["step_id"],)) if target is not None else None
        turn = self._tables["turns"].get((step["turn_id"],)) if step is not None else None
        session = self._tables["sessions"].get((row["session_id"],)) if row is not None else None
        if row is None or target is None or step is None or turn is None or session is None:
            return None, StepCalls([], False)
        approvals = [a for a in self._rows("approvals") if a["request_id"] == request_id]
        request = RequestOnRecord(
            row["id"],
            row["session_id"],
            row["status"],
            row["args_digest"],
            row["call_id"],
            tool=target["tool"],
            token_hash=row["response_token_hash"],
            token_used=row["token_used_at"] is not None,
            starters=starters_of(session["started_by"], turn["started_by"]),
            approvals=len(approvals),
            approved_by_responder=any(a["responder"] == responder for a in approvals),
            expires_at=row["expires_at"],
            escalated=row.get("escalated_at") is not None,
            card=copy.deepcopy(row["card"]),
            created_at=row["created_at"],
            approvals_required=row.get("approvals_required"),
        )
        return request, StepCalls(self._calls_of_step(step["id"]), self._waits(session_id, besides=request_id))

    def _pending(self) -> list[dict[str, Any]]:
        return [r for r in self._rows("approval_requests") if r["status"] == "pending"]

    async def due_requests(self, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
        due = sorted((r for r in self._pending() if r["expires_at"] <= at), key=lambda r: r["expires_at"])
        return [(r["id"], r["session_id"]) for r in due[:limit]]

    async def due_escalations(self, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
        due = sorted(
            (
                r
                for r in self._pending()
                if r.get("escalate_at") is not None and r["escalate_at"] <= at and r.get("escalated_at") is None
            ),
            key=lambda r: r["escalate_at"],
        )
        return [(r["id"], r["session_id"]) for r in due[:limit]]

    async def open_turn(self, session_id: str) -> OpenTurn:
        running = [t for t in self._rows("turns") if t["session_id"] == session_id and t["status"] == "running"]
        if not running:
            return NO_OPEN_TURN
        turn_id = max(running, key=lambda t: t["created_at"])["id"]
        steps = [s for s in self._rows("steps") if s["turn_id"] == turn_id]
        if not steps:
            return OpenTurn(turn_id, None, [])
        latest = max(steps, key=lambda s: (s["created_at"], s["id"]))
        step = Step(latest["id"], latest["session_id"], latest["turn_id"], latest["status"])
        return OpenTurn(turn_id, step, self._calls_of_step(step.id))

    async def turn_of_key(self, session_id: str, key: str) -> KeyedTurn | None:
        for turn in self._rows("turns"):
            if turn["session_id"] == session_id and turn.get("idempotency_key") == key:
                return KeyedTurn(turn["id"], turn["started_by"], turn.get("text_digest"))
        return None

    async def turn_starter(self, turn_id: str) -> str | None:
        turn = self._tables["turns"].get((turn_id,))
        return turn["started_by"] if turn is not None else None

    async def pending_tools(self, session_id: str) -> list[tuple[str, bool]]:
        found = []
        for request in self._pending():
            call = self._tables["tool_calls"].get((request["call_id"],))
            if request["session_id"] == session_id and call is not None:
                found.append((call["tool"], request.get("escalated_at") is not None))
        return found

    async def response_used(self, response_id: str) -> bool:
        return any(r["response_id"] == response_id for r in (*self._rows("decisions"), *self._rows("approvals")))

    async def pending_request_ids(self, session_id: str) -> list[str]:
        mine = sorted(
            (r for r in self._pending() if r["session_id"] == session_id), key=lambda r: (r["created_at"], r["id"])
        )
        return [r["id"] for r in mine]

    async def turn_spend(self, session_id: str, turn_id: str) -> TurnSpend:
        steps = {s["id"] for s in self._rows("steps") if s["session_id"] == session_id and s["turn_id"] == turn_id}
        attempts = [a for a in self._rows("provider_attempts") if a["step_id"] in steps]
        tokens = sum(a["input_tokens"] + a["output_tokens"] for a in attempts)
        return TurnSpend(len(steps), len(attempts), tokens)

    async def claim(self, call_id: str, *, lock: bool = False) -> ClaimOnRecord | None:
        row = self._tables["execution_claims"].get((call_id,))
        if row is None:
            return None
        return ClaimOnRecord(
            row["status"],
            row["outcome"],
            copy.deepcopy(row["result"]),
            row["holder"],
            row["attempts"],
            row["claimed_at"],
            row.get("authorization"),
        )

    async def grants(self, session_id: str) -> list[Grant]:
        mine = [row for row in self._rows("grants") if row["session_id"] == session_id]
        return [grant_of(SimpleNamespace(**row)) for row in sorted(mine, key=lambda r: (r["granted_at"], r["id"]))]

    async def grant(self, grant_id: str) -> Grant | None:
        row = self._tables["grants"].get((grant_id,))
        return None if row is None else grant_of(SimpleNamespace(**row))

    async def filed_call(self, call_id: str) -> FiledOnRecord | None:
        row = self._tables["filed_calls"].get((call_id,))
        return None if row is None else _filed(row)

    async def filed_call_by_caller(self, program: str, caller_call_id: str) -> FiledOnRecord | None:
        for row in self._rows("filed_calls"):
            if (row["program"], row["caller_call_id"]) == (program, caller_call_id):
                return _filed(row)
        return None

    async def due_leases(self, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
        calls = self._tables["tool_calls"]
        due = [
            row
            for row in self._rows("filed_calls")
            if row.get("reported_at") is None
            and row.get("lease_expires_at") is not None
            and row["lease_expires_at"] <= at
            and calls[(row["id"],)]["status"] != "closed"
        ]
        due.sort(key=lambda row: row["lease_expires_at"])
        return [(row["id"], row["session_id"]) for row in due[:limit]]

    async def transcript_entries(self, session_id: str, upto: int) -> list[dict]:
        rows = [r for r in self._rows("transcript") if r["session_id"] == session_id and r["position"] <= upto]
        return [copy.deepcopy(r["entry"]) for r in sorted(rows, key=lambda r: r["position"])]

    async def tool_menu(self, digest: str) -> list[dict] | None:
        row = self._tables["tool_menus"].get((digest,))
        return None if row is None else copy.deepcopy(row["descriptions"])


def _filed(row: dict[str, Any]) -> FiledOnRecord:
    return FiledOnRecord(
        row["id"],
        row["session_id"],
        row["program"],
        row["caller_call_id"],
        row["origin"],
        row["tool"],
        row["args_fingerprint"],
        row["runs"],
        row.get("request_id"),
        row.get("claim_token_hash"),
        row.get("claimed_at"),
        row.get("lease_expires_at"),
        row.get("reported_at"),
        row.get("claim_holder"),
    )
