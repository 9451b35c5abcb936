"""The ledger's storage as one port: what a transition asks of it, whatever keeps the rows.

One ledger transition = one transaction: state rows, the inbox row and the
outbox rows commit together or not at all (invariant 1). A handler

- receives its message and locks its session (`receive_and_lock`): the inbox
  says whether the message was applied before (`Duplicate`), and the session's
  row lock orders one session's transitions across ledger replicas;
- reads what it needs as typed values (`step`, `call_and_siblings`,
  `request_and_calls`, ...), never what it wrote itself;
- hands over what it decided: rows to add (`add`), rows to change (`update`,
  `withdraw_request`, `hold_back`), approvals that no longer count
  (`restart_count`), the tool menu a step names (`keep_tool_menu`), messages to
  emit (`emit`) and audit entries (`audit`). Nothing is written then: every write
  is collected and applied at commit (or at a group commit's `settle`), in one
  order: approvals withdrawn by a restarted count, tool menus (each inserted only
  if absent), new rows per table, parents first, then the changes, then the
  outbox rows in emission order, then the audit entries;
- commits, or leaves: whatever was not committed is gone, nothing of it published.

The session row is read once (locked) and written once, at commit. Each audit
entry is chained to the session's entry before it as it is made (`audit`): the
session's row lock orders a session's transitions, so its chain cannot fork, and
its head travels in the session row, written anyway. The global chain is linked
after commit (`services/approval_ledger/audit.py`).

Three adapters keep it: PostgreSQL (`store_postgres.py`), SQLite (`store_sql.py`)
and memory (`store_memory.py`, for the handlers' unit tests). Every database
detail lives in the two database adapters; one contract suite
(tests/integration/test_ledger_store_contract.py) holds all three to the same behaviour.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared import audit, faults
from shared.ledger.held_back import held_back_claim
from shared.messages import Envelope, TranscriptEntry, now
from shared.tool_menu import ToolMenu
from shared.topology import Topology

from .decision_rules import Grant
from .domain import Call, ClaimOnRecord, KeyedTurn, RequestOnRecord, Step, TurnSpend
from .intake_rules import FiledOnRecord

# The tables a transition inserts into, parents before children (foreign keys).
INSERT_ORDER: tuple[str, ...] = (
    "turns",
    "steps",
    "tool_calls",
    "approval_requests",
    "filed_calls",
    "grants",
    "approvals",
    "decisions",
    "closures",
    "provider_attempts",
    "transcript",
    "execution_claims",
)


def storable(value: Any) -> Any:
    """A text as a column can keep it: PostgreSQL's text refuses NUL, so a NUL in a text
    a service wrote (a tool's error, a provider's reply, a model's final text) becomes
    U+FFFD here, where it becomes a record, instead of failing the transition on every
    delivery. JSON columns need nothing: their serializer escapes it (\\u0000)."""
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


def grant_of(row: Any) -> Grant:
    """A `grants` row (anything with its columns as attributes) as the rules read it."""
    return Grant(
        grant_id=row.id,
        granted_by=row.granted_by,
        session_id=row.session_id,
        tool=row.tool,
        tool_version=row.tool_version,
        target=row.target,
        granted_at=row.granted_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        approvals_required=row.approvals_required,
    )


class Duplicate(Exception):
    """The message was applied before: the inbox says so."""


@dataclass(eq=False, slots=True)
class SessionState:
    """The session row of this transition: read (locked) once, written once at commit."""

    id: str
    status: str
    provider: str
    event_seq: int
    transcript_len: int
    created_at: datetime
    updated_at: datetime
    status_reason: str | None = None
    # Who started the session (its first turn that named someone).
    started_by: str | None = None
    # The digest chain of positions 1..transcript_len (shared/ledger/transcripts.py);
    # None: a session from before digests, whose digest is computed when a step needs it.
    transcript_digest: str | None = None
    # Transcript rows already stored (positions 1..n) when the transition began.
    transcript_base: int = 0
    # Entries appended in this transition, in order (positions transcript_base + 1 ...).
    appended: list[TranscriptEntry] = field(default_factory=list)
    # The head of its audit chain: the last entry's number and hash.
    audit_seq: int = 0
    audit_hash: str | None = None
    # What `written` was as stored: what commit need not write again.
    stored: tuple | None = None

    def written(self) -> tuple:
        return (
            self.status,
            self.event_seq,
            self.transcript_len,
            self.transcript_digest,
            self.updated_at,
            self.audit_seq,
            self.audit_hash,
        )

    @classmethod
    def of(cls, row: Any) -> SessionState:
        """From a stored session row (anything with the sessions table's columns as attributes)."""
        state = cls(
            id=row.id,
            status=row.status,
            provider=row.provider,
            event_seq=row.event_seq,
            transcript_len=row.transcript_len,
            created_at=row.created_at,
            updated_at=row.updated_at,
            status_reason=row.status_reason,
            started_by=row.started_by,
            transcript_digest=row.transcript_digest,
            transcript_base=row.transcript_len,
            audit_seq=row.audit_seq,
            audit_hash=row.audit_hash,
        )
        state.stored = state.written()
        return state


@dataclass(frozen=True)
class StepRead:
    step: Step | None
    # Whether the session has a pending request (before this transition).
    session_waits: bool


@dataclass(frozen=True)
class StepCalls:
    """A step's calls in the model's order, one of them the transition's own."""

    calls: list[Call]
    # Whether the session waits on a request other than the one this transition decides.
    session_waits: bool

    def find(self, call_id: str) -> Call | None:
        return next((c for c in self.calls if c.id == call_id), None)


@dataclass(frozen=True)
class OpenTurn:
    """The session's open turn (None: none), its latest step, and that step's calls in the model's order."""

    turn_id: str | None
    step: Step | None
    calls: list[Call]

    def __iter__(self):
        return iter((self.turn_id, self.step, self.calls))


NO_OPEN_TURN = OpenTurn(None, None, [])


@dataclass
class Writes:
    """What a transition collected, applied at once at commit (or a group commit's settle)."""

    # New rows per table (INSERT_ORDER).
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Changes of stored rows, by (table, id), in the order first changed.
    updates: dict[tuple[str, Any], dict[str, Any]] = field(default_factory=dict)
    # Calls whose pending approval request closes as cancelled.
    withdrawn: list[str] = field(default_factory=list)
    # Requests whose approvals so far no longer count (an edit restarted the count),
    # removed before the new rows go in: the editor's own approval is one of those.
    recounted: list[str] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)
    # `tool_menus` rows by digest, each inserted only if absent (another transaction,
    # or another ledger, may have stored the same menu).
    menus: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(
            self.rows or self.updates or self.withdrawn or self.recounted or self.outbox or self.audit or self.menus
        )


class LedgerStore(ABC):
    """The port: one transaction of the ledger (see the module's docstring)."""

    def __init__(self, topology: Topology, notify_channel: str | None, stored_menus: set[str] | None = None) -> None:
        self._topology = topology
        self._notify_channel = notify_channel
        # The digests of the tool menus this process knows its database holds (one set
        # per process and database, shared by its transactions; None: a set of this
        # transaction's own, which knows none): a step names a known menu without a write.
        self.stored_menus: set[str] = stored_menus if stored_menus is not None else set()
        # The menus this transaction stores: known stored once it commits, not before.
        self._storing_menus: set[str] = set()
        self.now: datetime
        self._session: SessionState | None = None
        self._tag: str | None = None
        self._writes = Writes()
        # Whether this transaction already queued its NOTIFY (the publisher's wake-up).
        self._notified = False
        # The message types of the transitions a group commit settled in this transaction.
        self._settled: list[str | None] = []
        # The messages this transaction answers with message.rejected (each logs its own line).
        self.rejected: set[str] = set()
        # Reads of this transition that an earlier statement of it carried (a database
        # adapter's: `call_and_siblings` reads the claim and the turn's spend too), by
        # what they answer; taken once, gone when the transition ends.
        self._carried: dict[tuple[str, ...], Any] = {}

    # -- the transaction -------------------------------------------------------------

    async def __aenter__(self) -> LedgerStore:
        await self._begin()
        self.now = now()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        # Whatever was not committed is gone; nothing of it was published.
        await self._end()

    @abstractmethod
    async def _begin(self) -> None: ...

    @abstractmethod
    async def _end(self) -> None:
        """Roll back whatever is not committed and give the connection back."""

    @abstractmethod
    async def _commit(self) -> None: ...

    @abstractmethod
    async def _apply(self, writes: Writes, notify: bool) -> None:
        """Write what was collected, in the module's order; `notify`: and wake the publisher at commit."""

    # -- receive and lock ------------------------------------------------------------

    @abstractmethod
    async def receive_and_lock(
        self, message: Envelope, *, create_with_provider: str | None = None
    ) -> SessionState | None:
        """The message in the inbox (or Duplicate: it was applied before), and its
        session locked (None: there is none). `create_with_provider`: a session that
        does not exist is created, idle, only if the message is new: two first
        messages of one session meet at the row lock, and a duplicate leaves nothing
        behind, also inside a group commit (which does not roll back for it)."""

    @abstractmethod
    async def lock_session(self, session_id: str) -> SessionState | None:
        """Serialize transitions of one session across ledger replicas (a row lock); None: no such session."""

    def _locked(self, state: SessionState | None) -> SessionState | None:
        self._session = state
        self._carried.clear()
        return state

    def _inbox_row(self, message: Envelope) -> dict[str, Any]:
        self._tag = message.type
        return {
            "message_id": message.message_id,
            "message_type": message.type,
            "session_id": message.session_id,
            "received_at": self.now,
        }

    # -- reads: as stored before this transition ---------------------------------------

    @abstractmethod
    async def step(self, step_id: str, session_id: str) -> StepRead: ...

    @abstractmethod
    async def call_and_siblings(self, call_id: str, session_id: str) -> StepCalls:
        """A tool call and the other calls of its step, with what resuming the step needs."""

    @abstractmethod
    async def request_and_calls(
        self, request_id: str, session_id: str, responder: str, *, response_id: str | None = None
    ) -> tuple[RequestOnRecord | None, StepCalls]:
        """The request as `responder` answers it (whether they approved it already), its
        call and the other calls of its step; whether the session waits on a request
        other than this one. `response_id`: the response at hand, whose `response_used`
        a database adapter reads in the same statement, for the transition to ask next."""

    @abstractmethod
    async def due_requests(self, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
        """(request id, session id) of pending requests whose deadline passed, oldest first."""

    @abstractmethod
    async def due_escalations(self, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
        """(request id, session id) of pending requests to announce again to their escalation group."""

    @abstractmethod
    async def open_turn(self, session_id: str) -> OpenTurn: ...

    @abstractmethod
    async def turn_of_key(self, session_id: str, key: str) -> KeyedTurn | None:
        """The session's turn started with this idempotency key (None: none)."""

    @abstractmethod
    async def turn_starter(self, turn_id: str) -> str | None:
        """Who the turn's channel said started it (None: nobody named)."""

    @abstractmethod
    async def pending_tools(self, session_id: str) -> list[tuple[str, bool]]:
        """(tool, whether escalated) of each request the session waits on: who may approve them."""

    @abstractmethod
    async def response_used(self, response_id: str) -> bool:
        """Whether a decision, or an approval counted towards one, was made with this signed response."""

    @abstractmethod
    async def pending_request_ids(self, session_id: str) -> list[str]:
        """The session's pending requests, oldest first (created_at, id)."""

    @abstractmethod
    async def turn_spend(self, session_id: str, turn_id: str) -> TurnSpend:
        """The turn's model steps, provider calls and tokens."""

    @abstractmethod
    async def claim(self, call_id: str, *, lock: bool = False) -> ClaimOnRecord | None:
        """The executor's claim on a call as it stands; `lock`: held until this transaction ends."""

    @abstractmethod
    async def grants(self, session_id: str) -> list[Grant]:
        """The session's grants (remembered approvals), revoked and expired ones too:
        whether one covers a call is `decision_rules.grant_covering`'s to say."""

    @abstractmethod
    async def grant(self, grant_id: str) -> Grant | None:
        """One grant by its id, whatever its session (None: there is none)."""

    @abstractmethod
    async def filed_call(self, call_id: str) -> FiledOnRecord | None:
        """A call filed through the intake, by its (the ledger's) call id; None: no such filing."""

    @abstractmethod
    async def filed_call_by_caller(self, program: str, caller_call_id: str) -> FiledOnRecord | None:
        """A filed call by who filed it and their own call id (unique); None: not filed."""

    @abstractmethod
    async def due_leases(self, at: datetime, limit: int = 100) -> list[tuple[str, str]]:
        """(call id, session id) of claimed filed calls whose lease ended with no result, on calls still open."""

    @abstractmethod
    async def transcript_entries(self, session_id: str, upto: int) -> list[dict]:
        """The stored transcript entries at positions 1..upto (JSON-mode dumps), in order."""

    @abstractmethod
    async def tool_menu(self, digest: str) -> list[dict] | None:
        """The descriptions of the stored tool menu with this digest (None: none is stored)."""

    async def transcript_rows(self, session: SessionState) -> list[dict]:
        """The whole transcript: the stored rows, then the entries appended now."""
        rows = await self.transcript_entries(session.id, session.transcript_base) if session.transcript_base else []
        return rows + [entry.model_dump(mode="json") for entry in session.appended]

    # -- writes: collected, applied at commit -------------------------------------------

    def add(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        """A new row."""
        row = {column: storable(value) for column, value in row.items()}
        self._writes.rows.setdefault(table, []).append(row)
        return row

    def update(self, table: str, key: Any, **values: Any) -> None:
        """Change a stored row (by id)."""
        self._writes.updates.setdefault((table, key), {}).update({c: storable(v) for c, v in values.items()})

    def withdraw_request(self, call_id: str) -> None:
        """The call's pending approval request closes as cancelled."""
        self._writes.withdrawn.append(call_id)

    def restart_count(self, request_id: str) -> None:
        """The request's approvals so far no longer count (they were given for arguments an
        edit changed): their rows go, before this transition's new rows go in, so its own
        approval (also one by a person who approved before) is the first of the new count.
        The audit log keeps each of them (`response.accepted`)."""
        self._writes.recounted.append(request_id)

    async def hold_back(self, call: Call) -> ClaimOnRecord | None:
        """Keep a call that is being cancelled from running: the ledger takes the call's
        claim itself, finished as cancelled, so an executor that comes later finds it
        done. None: the call had not started and now never will; else the executor's
        claim, locked, as it stands. The claim's primary key decides who was first: an
        executor that claims the call before this commits makes the commit fail, and the
        transition, applied again, finds its claim."""
        claim = await self.claim(call.id, lock=True)
        if claim is not None:
            return claim
        self.add("execution_claims", held_back_claim(call.id, call.idempotency_key, self.now))
        return None

    def keep_tool_menu(self, menu: ToolMenu) -> None:
        """The tool menu a step names is in the ledger when the step's command is: stored
        in this transaction (if absent) unless this process knows it is stored already,
        which is the common case and costs no write. Known only once this commits: a
        transaction rolled back stored nothing, and the next step that names the menu
        stores it again."""
        if menu.digest in self.stored_menus or menu.digest in self._storing_menus:
            return
        self._storing_menus.add(menu.digest)
        self._writes.menus[menu.digest] = {
            "digest": menu.digest,
            "descriptions": menu.descriptions,
            "created_at": self.now,
        }

    def emit(self, session: SessionState | None, message: Envelope) -> Envelope:
        """Append a message to the outbox; it leaves only after commit, in this order."""
        if session is not None:
            session.event_seq += 1
            message = message.model_copy(update={"sequence": session.event_seq})
        exchange, routing_key = self._topology.route(message)
        self._writes.outbox.append(
            {
                "message_id": message.message_id,
                "session_id": message.session_id,
                "message_type": message.type,
                "exchange": exchange,
                "routing_key": routing_key,
                "body": message.model_dump_json(),
                "created_at": self.now,
                "sent_at": None,
            }
        )
        return message

    def audit(
        self,
        session: SessionState | None,
        session_id: str,
        kind: str,
        *,
        subject: str | None = None,
        actor: str | None = None,
        message_id: str | None = None,
        **detail: Any,
    ) -> None:
        """Append an audit entry, chained to the session's last (shared/audit.py); written
        with this transition's other rows, so it commits or vanishes with them."""
        head = None if session is None else (session.audit_seq, session.audit_hash)
        entry = audit.chained(
            session_id=session_id,
            head=head,
            kind=kind,
            subject=subject,
            actor=actor,
            message_id=message_id,
            detail=detail,
            at=self.now,
        )
        if session is not None:
            session.audit_seq, session.audit_hash = entry["session_seq"], entry["hash"]
        self._writes.audit.append(entry)

    async def flush(self, *, final: bool = False) -> None:
        """Write what was collected so far; `final`: also the session row's changes and the NOTIFY."""
        notify = self._collect_session_changes(final)
        writes, self._writes = self._writes, Writes()
        if writes or notify:
            await self._apply(writes, notify)

    def _collect_session_changes(self, final: bool) -> bool:
        """At the end of a transition: the session row's changes join the updates.
        True: this flush also sends the transaction's NOTIFY."""
        session = self._session
        if final and session is not None and session.written() != session.stored:
            self.update(
                "sessions",
                session.id,
                status=session.status,
                event_seq=session.event_seq,
                transcript_len=session.transcript_len,
                transcript_digest=session.transcript_digest,
                updated_at=session.updated_at,
                audit_seq=session.audit_seq,
                audit_hash=session.audit_hash,
            )
            session.stored = session.written()
        notify = final and self._notify_channel is not None and not self._notified
        self._notified = self._notified or notify
        return notify

    # -- commit ----------------------------------------------------------------------

    @property
    def settled(self) -> int:
        """How many transitions a group commit settled in this transaction so far."""
        return len(self._settled)

    async def settle(self) -> None:
        """End one transition of a group commit: write what it collected, session row
        included, and leave the transaction open for the next one (which locks its
        own session and sees these rows). One NOTIFY serves the whole transaction."""
        await self.flush(final=True)
        self._settled.append(self._tag)
        self._session = None
        self._carried.clear()
        self._tag = None

    async def commit(self) -> None:
        await self.flush(final=True)
        tags = self._settled or [self._tag]
        for tag in tags:
            await faults.reached("ledger.before_commit", tag)
        await self._commit()
        self.stored_menus.update(self._storing_menus)
        self._storing_menus = set()
        for tag in tags:
            await faults.reached("ledger.after_commit", tag)
