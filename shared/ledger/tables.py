"""The ledger's tables. The database's own constraints carry the guarantees:

- `inbox.message_id` is the primary key: a message is applied at most once.
- `closures.call_id` is unique: a tool call has exactly one closure (invariant 3).
- `approval_requests.call_id` is unique: one request per call, its id never re-minted.
- `execution_claims.call_id` is the primary key: one claim per call (invariant 4).
- `approvals` has one row per request and responder, and `approvals.response_id` is
  unique: a person's approval counts once towards a request, and a response once.
- `audit_log` is appended to, never changed: `(session_id, session_seq)` is unique, so a
  session's chain cannot fork, and `audit_chain.entry_id` is unique, so an entry is
  linked into the global chain once. On PostgreSQL no service's role may UPDATE or
  DELETE either (shared/ledger/roles.py).
- `publisher_leader` has one row, whose `epoch` fences the publishers: every write a
  publisher makes commits only while the epoch is the one it took when it began to lead.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    func,
    select,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shared.messages import Outcome

Id = String(64)


class UtcDateTime(TypeDecorator):
    """A point in time, stored and read back in UTC on both stores.

    PostgreSQL keeps the offset (`timestamptz`); SQLite keeps text without one,
    so a time read back from it was naive and comparing it with an aware "now"
    raised TypeError (an executor's lapsed claim was never decided on SQLite).
    Every time is converted to UTC on the way in and comes back aware."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"a naive datetime ({value!r}) has no place in the ledger: give it a time zone")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: UtcDateTime()}  # noqa: RUF012 (SQLAlchemy reads it)


class Session(Base):
    __tablename__ = "sessions"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    # idle | running | waiting | failed
    status: Mapped[str] = mapped_column(String(16))
    provider: Mapped[str] = mapped_column(String(64))
    # The sequence number of the last event published for this session.
    event_seq: Mapped[int] = mapped_column(Integer, default=0)
    transcript_len: Mapped[int] = mapped_column(Integer, default=0)
    # The digest chain of its transcript (shared/ledger/transcripts.py), named by each
    # model-step request; None: made before digests, computed from its rows when needed.
    transcript_digest: Mapped[str | None] = mapped_column(String(80), nullable=True)
    status_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Who started its first turn that named someone (separation of duties).
    started_by: Mapped[str | None] = mapped_column(String(256), nullable=True)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    # The head of its audit chain: the last entry's number and hash (written with each transition).
    audit_seq: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    audit_hash: Mapped[str | None] = mapped_column(String(80), nullable=True)


class Turn(Base):
    __tablename__ = "turns"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    # running | completed | failed
    status: Mapped[str] = mapped_column(String(16))
    final_text: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The principal the channel says started it (`StartTurn.started_by`).
    started_by: Mapped[str | None] = mapped_column(String(256), nullable=True)
    created_at: Mapped[datetime]
    completed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # Why it ended as it did (migration 0011), as its `turn.failed` or `turn.cancelled`
    # said: a failure's code and text (`provider_failed`, "HTTP 500: …"), a cancellation's
    # reason and who cancelled it. `signoff session show` and `audit show` read them; the
    # audit entry keeps only the text's digest, which they check the text against.
    reason_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason_text: Mapped[str | None] = mapped_column(Text, nullable=True)
    ended_by: Mapped[str | None] = mapped_column(String(256), nullable=True)
    # The caller's name for the turn (`StartTurn.idempotency_key`, migration 0018), unique
    # in its session: the ledger, not a cache, says a start was already made; and the
    # digest of the text it started with, which a repeat must match.
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    text_digest: Mapped[str | None] = mapped_column(String(100), nullable=True)

    __table_args__ = (UniqueConstraint("session_id", "idempotency_key", name="ux_turns_idempotency_key"),)


class Step(Base):
    __tablename__ = "steps"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"))
    # requested | completed
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    completed_at: Mapped[datetime | None] = mapped_column(nullable=True)


class TranscriptRow(Base):
    __tablename__ = "transcript"
    __table_args__ = (UniqueConstraint("session_id", "position"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    position: Mapped[int] = mapped_column(Integer)
    # The TranscriptEntry as JSON: role, text, tool calls or the closure it carries.
    entry: Mapped[dict[str, Any]]


class ToolMenuRow(Base):
    """The tools a model step offers, stored once by their digest (claim-check: a step
    names its menu, shared/tool_menu.py). Inserted by the ledger, if absent, with the
    first step that names it; never changed; the model-step's role may only read it."""

    __tablename__ = "tool_menus"
    digest: Mapped[str] = mapped_column(String(80), primary_key=True)
    # The catalogue's tool descriptions as JSON: name, description and parameters of each.
    descriptions: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_at: Mapped[datetime]


class ToolCall(Base):
    __tablename__ = "tool_calls"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    step_id: Mapped[str] = mapped_column(ForeignKey("steps.id"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    provider_call_id: Mapped[str] = mapped_column(String(256))
    tool: Mapped[str] = mapped_column(String(256))
    arguments: Mapped[dict[str, Any]]
    args_digest: Mapped[str] = mapped_column(String(100))
    # awaiting_approval | executing | closed
    status: Mapped[str] = mapped_column(String(24))
    idempotency_key: Mapped[str] = mapped_column(Id)
    created_at: Mapped[datetime]
    # The grant that authorized it with no card (migration 0014); None: asked for, or
    # run by the catalogue's policy. The executor runs a grant's call only if this names
    # the grant its authorization names, and the grant's row is live and sealed.
    grant_id: Mapped[str | None] = mapped_column(Id, nullable=True)


# The pending requests (migration 0015): what waits for a person, and the only rows the
# sweeps, the per-session reads on the approval path and the gauge look at. Indexes on
# them stay the size of the backlog's due head, not of the backlog, whatever the
# planner's statistics say (autovacuum may be off).
_WAITING = "status = 'pending'"


def _pending_index(name: str, *columns: str, where: str = "") -> Index:
    predicate = text(_WAITING + (f" AND {where}" if where else ""))
    return Index(name, *columns, postgresql_where=predicate, sqlite_where=predicate)


class ApprovalRequest(Base):
    __tablename__ = "approval_requests"
    __table_args__ = (
        Index("ix_approval_requests_due", "status", "expires_at"),
        _pending_index("ix_approval_requests_pending_expiry", "expires_at", where="expires_at IS NOT NULL"),
        _pending_index(
            "ix_approval_requests_pending_escalation",
            "escalate_at",
            where="escalate_at IS NOT NULL AND escalated_at IS NULL",
        ),
        _pending_index("ix_approval_requests_pending_session", "session_id", "created_at", "id"),
        _pending_index("ix_approval_requests_pending_tool_age", "tool", "created_at"),
        _pending_index(
            "ix_approval_requests_pending_tool_expiry", "tool", "expires_at", where="expires_at IS NOT NULL"
        ),
    )
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    call_id: Mapped[str] = mapped_column(ForeignKey("tool_calls.id"), unique=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    # Its call's tool, kept with it (migration 0015): the gauge and `signoff pending`'s
    # pages read a tool's pending requests from an index, not by joining every call.
    tool: Mapped[str | None] = mapped_column(String(256), nullable=True)
    # pending | approved | denied | expired | cancelled
    status: Mapped[str] = mapped_column(String(16), index=True)
    args_digest: Mapped[str] = mapped_column(String(100))
    card: Mapped[dict[str, Any]]
    # The hash of its one-time response token (the token itself is only on the card),
    # and when the token was redeemed: once.
    response_token_hash: Mapped[str | None] = mapped_column(String(100), nullable=True)
    token_used_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime]
    # When an unanswered request closes as expired (None: never; rows made before deadlines).
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # Provenance: the turn and step, the model attempt that produced the call, and the
    # ledger run (process start) that committed it.
    turn_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    step_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    run_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    # When an unanswered request is announced again to its tool's escalation group, and when it was.
    escalate_at: Mapped[datetime | None] = mapped_column(nullable=True)
    escalated_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # The principals it was escalated to, as the tools file named them then (migration 0011).
    escalated_to: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # The ledger's Ed25519 seal, made with the request, over its call's id, tool and
    # argument fingerprint (shared/authorization.py `seal_request`): the executor runs an
    # approved call only if it names the arguments on record and in the command, so
    # arguments swapped in the database never run (None: made before seals; never runs).
    call_seal: Mapped[str | None] = mapped_column(Text, nullable=True)
    # What the tool's approval rule decided for these arguments when the request was made
    # (services/approval_ledger/decision_rules.py `verdict`, migration 0013): how many
    # distinct people must approve (the count tallied, not the catalogue's at response
    # time) and why, as the card and the audit log say it. None: made before rules; the
    # catalogue's `approvals_required` then counts.
    approvals_required: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class Approval(Base):
    """One person's approval of a request, counted towards its `approvals_required`."""

    __tablename__ = "approvals"
    request_id: Mapped[str] = mapped_column(ForeignKey("approval_requests.id"), primary_key=True)
    responder: Mapped[str] = mapped_column(String(256), primary_key=True)
    response_id: Mapped[str] = mapped_column(Id, unique=True)
    message_id: Mapped[str] = mapped_column(Id)
    # The channel whose key signed it.
    channel: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    message: Mapped[str] = mapped_column(Text, default="")
    approved_at: Mapped[datetime]


class Decision(Base):
    __tablename__ = "decisions"
    request_id: Mapped[str] = mapped_column(ForeignKey("approval_requests.id"), primary_key=True)
    decision: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    message: Mapped[str] = mapped_column(Text, default="")
    responder: Mapped[str] = mapped_column(String(256))
    message_id: Mapped[str] = mapped_column(Id)
    # The signed response's own id: a response counts once, whatever message carries it.
    response_id: Mapped[str | None] = mapped_column(Id, unique=True, nullable=True)
    # The channel whose key signed it.
    channel: Mapped[str | None] = mapped_column(String(64), nullable=True)
    decided_at: Mapped[datetime]


class Grant(Base):
    """A remembered approval (migration 0014): calls of `tool` at
    `tool_version` in `session_id`, on `target` (None: any target), that need no more
    than `approvals_required` approvers, run with no card until `expires_at` (None: for
    the rest of the session) or `revoked_at`. Made with the approval of `request_id`,
    by `granted_by`; the ledger's seal over all of that (`grant_seal`,
    shared/authorization.py `seal_grant`) is checked by the executor, so a grant widened
    in the database authorizes nothing."""

    __tablename__ = "grants"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    request_id: Mapped[str] = mapped_column(ForeignKey("approval_requests.id"), unique=True)
    granted_by: Mapped[str] = mapped_column(String(256))
    tool: Mapped[str] = mapped_column(String(256))
    tool_version: Mapped[str] = mapped_column(String(64))
    target: Mapped[str | None] = mapped_column(Text, nullable=True)
    approvals_required: Mapped[int] = mapped_column(Integer)
    granted_at: Mapped[datetime]
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_by: Mapped[str | None] = mapped_column(String(256), nullable=True)
    grant_seal: Mapped[str] = mapped_column(Text)


class Closure(Base):
    __tablename__ = "closures"
    call_id: Mapped[str] = mapped_column(ForeignKey("tool_calls.id"), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    # output | error | denied | expired | cancelled | outcome_unknown
    kind: Mapped[str] = mapped_column(String(24))
    reason_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason_text: Mapped[str | None] = mapped_column(Text, nullable=True)
    output: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime]


class ProviderAttemptRow(Base):
    __tablename__ = "provider_attempts"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    step_id: Mapped[str] = mapped_column(ForeignKey("steps.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    # completed | failed | abandoned | discarded
    status: Mapped[str] = mapped_column(String(16))
    provider: Mapped[str] = mapped_column(String(64))
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    report_message_id: Mapped[str] = mapped_column(Id)
    recorded_at: Mapped[datetime]


class InboxRow(Base):
    __tablename__ = "inbox"
    # Retention deletes by it (migration 0015).
    __table_args__ = (Index("ix_inbox_received", "received_at"),)
    message_id: Mapped[str] = mapped_column(Id, primary_key=True)
    message_type: Mapped[str] = mapped_column(String(32))
    session_id: Mapped[str] = mapped_column(Id)
    received_at: Mapped[datetime]


class OutboxRow(Base):
    __tablename__ = "outbox"
    __table_args__ = (
        Index("ix_outbox_unsent", "sent_at", "id"),
        # The relay's poll starts at the first unsent row (migration 0016, shared/ledger/outbox_relay.py).
        Index(
            "ix_outbox_unsent_id", "id", postgresql_where=text("sent_at IS NULL"), sqlite_where=text("sent_at IS NULL")
        ),
        Index("ix_outbox_txid", "txid", "id"),
        # Ids never reused (migration 0012): the gateway's event ids are outbox ids.
        {"sqlite_autoincrement": True},
    )
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    message_id: Mapped[str] = mapped_column(Id, unique=True)
    session_id: Mapped[str] = mapped_column(Id)
    message_type: Mapped[str] = mapped_column(String(32))
    exchange: Mapped[str] = mapped_column(String(255))
    routing_key: Mapped[str] = mapped_column(String(255))
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    sent_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # PostgreSQL: the writing transaction's id (a server default, migration 0012). The
    # gateway's event stream serves rows in (txid, id) order once no transaction below
    # them is still running, which ids alone do not give (a smaller id may commit later).
    txid: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class PendingTally(Base):
    """How many requests are pending per tool, as deltas: triggers on `approval_requests`
    (migration 0015) add +1 when a request becomes pending and -1 when it stops, in the
    transaction that changes it, so the sum is exactly what committed, crash or not, and
    no writer waits on another's counter row. The gauge sums them and folds them into
    one row per tool (shared/ledger/backlog.py): its cost follows the changes
    since its last reading, never the number waiting."""

    __tablename__ = "pending_tally"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    tool: Mapped[str | None] = mapped_column(String(256), nullable=True)
    delta: Mapped[int] = mapped_column(Integer)


class ExecutionClaim(Base):
    """The tool-executor's durable claim on a call, taken before the tool runs."""

    __tablename__ = "execution_claims"
    call_id: Mapped[str] = mapped_column(Id, primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(Id)
    # claimed | finished
    status: Mapped[str] = mapped_column(String(16))
    holder: Mapped[str] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime]
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    # The ToolExecuted outcome, kept so a redelivery reports it again instead of re-running.
    outcome: Mapped[Outcome | None] = mapped_column(String(24), nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    claimed_at: Mapped[datetime]
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # The ledger's authorization the claim was taken under (the `tool.execute`'s): the
    # ledger believes a result only from a finished claim whose authorization it sealed
    # for this call, tool and arguments (None: the ledger's own hold-back, or made before).
    authorization: Mapped[str | None] = mapped_column(Text, nullable=True)


class FiledCall(Base):
    """A call a program filed through the intake (migration 0019), beside its `tool_calls`
    row (same id). `(program, caller_call_id)` is unique: the same call filed again, by
    any route, finds this row and never makes a second request or card. For `runs:
    caller`, the claim lives here: granted once (`claim_token_hash`, never the token),
    until `lease_expires_at`; a result is taken once (`reported_at`). `verdict` is the
    ledger's Ed25519-sealed statement of what was decided (shared/signatures.py `seal`),
    which a caller outside the trust boundary verifies with the ledger's public key."""

    __tablename__ = "filed_calls"
    __table_args__ = (
        UniqueConstraint("program", "caller_call_id", name="uq_filed_calls_program_call"),
        Index(
            "ix_filed_calls_lease",
            "lease_expires_at",
            postgresql_where=text("reported_at IS NULL"),
            sqlite_where=text("reported_at IS NULL"),
        ),
    )
    id: Mapped[str] = mapped_column(ForeignKey("tool_calls.id"), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    program: Mapped[str] = mapped_column(String(256))
    caller_call_id: Mapped[str] = mapped_column(String(256))
    origin: Mapped[str] = mapped_column(String(100))
    thread: Mapped[str | None] = mapped_column(String(256), nullable=True)
    summary: Mapped[str | None] = mapped_column(String(300), nullable=True)
    # The caller's tool name (the call's own may be `<origin>/<tool>`, declared by the caller).
    tool: Mapped[str] = mapped_column(String(128))
    # The fingerprint of the arguments as filed: the same call id with others is refused.
    args_fingerprint: Mapped[str] = mapped_column(String(100))
    # signoff | caller
    runs: Mapped[str] = mapped_column(String(16))
    request_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    created_at: Mapped[datetime]
    claim_token_hash: Mapped[str | None] = mapped_column(String(100), nullable=True)
    # Who holds the claim, as its caller named itself (a host, a worker), for refusals.
    claim_holder: Mapped[str | None] = mapped_column(String(128), nullable=True)
    claimed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    reported_at: Mapped[datetime | None] = mapped_column(nullable=True)
    verdict: Mapped[str | None] = mapped_column(Text, nullable=True)


# A delivery is pending until it is delivered or given up.
_PENDING = text("delivered_at IS NULL AND given_up_at IS NULL")


class HookDelivery(Base):
    """One lifecycle hook delivery: created with the event's relay, retried until a 2xx,
    or given up (its hook removed, or its retry budget spent)."""

    __tablename__ = "hook_deliveries"
    __table_args__ = (
        UniqueConstraint("hook", "message_id"),
        # Each hook's due deliveries, read per hook: one hook's backlog never hides another's.
        Index("ix_hook_pending", "hook", "next_attempt_at", postgresql_where=_PENDING, sqlite_where=_PENDING),
    )
    # Stable across retries and restarts: receivers use it as their idempotency key.
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    hook: Mapped[str] = mapped_column(String(128))
    message_id: Mapped[str] = mapped_column(Id)
    event_type: Mapped[str] = mapped_column(String(32))
    body: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None] = mapped_column(nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime]
    # Never attempted again once set; the reason is machine-readable: `attempts_exhausted`
    # (its retry budget spent) or `hook_removed` (its hook is no longer configured).
    given_up_at: Mapped[datetime | None] = mapped_column(nullable=True)
    given_up_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)


class DeadLetterAction(Base):
    """What an operator did with a parked message (`signoff dead-letters replay|drop`):
    written by the operator's console before the message leaves the dead-letter queue,
    so a drop is never without its reason on record."""

    __tablename__ = "dead_letter_actions"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    # replayed | dropped
    action: Mapped[str] = mapped_column(String(16))
    message_id: Mapped[str] = mapped_column(String(256), index=True)
    message_type: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[str] = mapped_column(String(256))
    # Why it was parked (its reason and detail), and the operator's reason for the action.
    parked_reason: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    operator: Mapped[str] = mapped_column(String(256))
    acted_at: Mapped[datetime]
    # Which parked copy it was about (its parking time, as `signoff dead-letters` lists it;
    # migration 0011): a console killed after recording the action and before the copy
    # left the queue finds it on its next run and finishes that action, not a second one.
    parked_at: Mapped[str | None] = mapped_column(String(64), nullable=True)


class EndedLogin(Base):
    """A gateway login ended before its time (a logout): the record every gateway
    replica checks, so the end holds whatever happens to Redis (which only caches it).
    Written by the gateway alone (its one table: shared/ledger/gateway_logins.py); a
    row is of no use once its session would have expired anyway, and is pruned then."""

    __tablename__ = "ended_logins"
    # The session id of the cookie (random, never the cookie itself).
    session_id: Mapped[str] = mapped_column(Id, primary_key=True)
    principal: Mapped[str] = mapped_column(String(256))
    ended_at: Mapped[datetime]
    expires_at: Mapped[datetime] = mapped_column(index=True)


class PublisherLeader(Base):
    """The relay's leadership, one row (id 1). A publisher that takes the lead (holding
    the advisory lock) adds one to `epoch`; every write it makes then checks, in its own
    transaction, that the epoch is still its own (services/publisher/leadership.py)."""

    __tablename__ = "publisher_leader"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    # Who leads, for operators: host and pid.
    holder: Mapped[str | None] = mapped_column(String(128), nullable=True)
    since: Mapped[datetime | None] = mapped_column(nullable=True)


class AuditEntry(Base):
    """One thing that happened, chained to the session's entry before it by hash
    (shared/audit.py). Written in the ledger's transaction with the state it
    describes; digests, never arguments, outputs or secrets."""

    __tablename__ = "audit_log"
    __table_args__ = (UniqueConstraint("session_id", "session_seq"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(Id)
    # Its place in the session's chain (1, 2, …); None: its session was not on record
    # (a message refused for an unknown session), so it is chained globally only.
    session_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)
    kind: Mapped[str] = mapped_column(String(32))
    # The request, call or turn it is about, and who acted.
    subject: Mapped[str | None] = mapped_column(String(64), nullable=True)
    actor: Mapped[str | None] = mapped_column(String(256), nullable=True)
    message_id: Mapped[str | None] = mapped_column(Id, nullable=True)
    detail: Mapped[dict[str, Any]]
    recorded_at: Mapped[datetime]
    prev_hash: Mapped[str | None] = mapped_column(String(80), nullable=True)
    hash: Mapped[str] = mapped_column(String(80))
    # PostgreSQL: the writing transaction's id (a server default, migration 0009), the
    # global chain's order; all ids below the oldest running transaction are final.
    txid: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)


class AuditLink(Base):
    """The global chain: each entry, in commit order, linked to the link before it."""

    __tablename__ = "audit_chain"
    seq: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    entry_id: Mapped[int] = mapped_column(ForeignKey("audit_log.id"), unique=True)
    # The entry's hash when it was linked: rewriting the entry and its session chain shows here.
    entry_hash: Mapped[str] = mapped_column(String(80))
    prev_hash: Mapped[str | None] = mapped_column(String(80), nullable=True)
    hash: Mapped[str] = mapped_column(String(80))
    linked_at: Mapped[datetime]


class AuditHead(Base):
    """The global chain's head, one row (id 1): its last link, and how far the linker
    has come (PostgreSQL: the transaction id below which every entry is linked;
    SQLite: the last linked entry id). Locked by each linking pass."""

    __tablename__ = "audit_head"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)
    hash: Mapped[str | None] = mapped_column(String(80), nullable=True)
    horizon: Mapped[int] = mapped_column(BigInteger, default=0)
    linked_at: Mapped[datetime | None] = mapped_column(nullable=True)


TABLES = Base.metadata.tables


def from_the_first_unsent():
    """`outbox.id >= (the first unsent id)`: always true of an unsent row, so a read of
    unsent rows with it finds the same rows. Every row is inserted unsent and then marked
    sent, so with autovacuum behind, the unsent indexes keep an entry for each row relayed
    since the last VACUUM; read as a bitmap (what the planner picks with no statistics),
    every poll visited all of them and their heap blocks. The min() is an index-only scan
    of `ix_outbox_unsent_id` (migration 0016), which marks those entries dead once it has
    seen them, and the read then starts at the first unsent id (docs/benchmarks.md, "The
    relay's poll and the outbox's history"). The relay's poll and the backlog gauge's
    count both take it."""
    unsent = TABLES["outbox"].alias("first_unsent")
    return TABLES["outbox"].c.id >= select(func.min(unsent.c.id)).where(unsent.c.sent_at.is_(None)).scalar_subquery()
