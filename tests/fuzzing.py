"""The fuzz suite's machinery (tests/integration/test_fuzz.py): hypothesis strategies
for inbound messages, the oracle that says what each one must lead to, and a runner
that publishes them to a live deployment beside real sessions and checks the outcome.

A drawn message is a `Plan`: which queue it goes to; a base message of some type
(usually the queue's own, sometimes another: the wrong type for the queue), its
fields drawn from values valid and not (edge identifiers, NUL, bidi and BOM
characters, surrogate escapes, big integers, NaN, naive and impossible times, forged
signatures and authorizations); mutations (a field dropped, given a wrong type, set
to a string at a length limit or to a huge one, a bad id, an extra field, another
schema version or type); an encoding (JSON; with whitespace or a BOM; JSON that is
not an object; not JSON at all; truncated; invalid UTF-8; deep nesting; padded past
SIGNOFF_MAX_MESSAGE_BYTES, or to exactly the limit); its sender (the queue's own
sender through its own exchange, or the broker's administrator straight into the
queue); its session (a fresh one, one shared by a few messages, a drawn id, or the
real session's); and whether it reuses a message id (an earlier one of its batch, or
one of the real session's once that is committed). Responses may be signed with the
CLI channel's real key, so that fuzzed responses get past the signature check.

`materialize` turns a plan into bytes, and `predict` (the oracle) says what the
consumer must do with them. It decides validity with the very models the consumers
use (shared/messages.py): the test checks the services' behaviour, not the schemas.

- too large: parked as `oversized`; fails validation: parked as `invalid`;
- valid, for the ledger: exactly one `message.rejected` per message id (or, for an
  `execution.refused`, the `operator.alerted` it raises), whichever copy the inbox
  took; none when the id is one of the real session's (dropped as a duplicate);
- valid `step.requested`: the model-step reports on the step and the ledger rejects
  the report (no such step): over the run, at least one rejected report per distinct
  request id and at most one per copy (the model-step's Redis fast path skips an id
  it handled; two copies in flight may both be handled);
- valid `tool.execute` (no authorization from the ledger): nothing runs; each copy
  is parked with the refusal's code and raises one `operator.alerted`.
A message without a message id is parked as `invalid`: an id the consumer minted
would differ on every delivery.

Garbage that would legitimately change state is not sent: a valid `turn.start` from
a channel (it would open a session) is broken on purpose (schema version 2) unless it
reuses a committed real id, and so is a valid `turn.cancel` from a channel naming the
real session.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import func, select

from shared.dead_letters import CONSUMER_HEADER, REASON_HEADER
from shared.ledger.tables import AuditEntry, Base, Decision, ExecutionClaim, OutboxRow, Session, ToolCall, Turn
from shared.ledger.transcripts import EMPTY as EMPTY_TRANSCRIPT
from shared.messages import (
    EVENT,
    CancelTurn,
    ExecuteTool,
    ModelStepCompleted,
    RefuseExecution,
    RequestModelStep,
    RespondToApproval,
    StartTurn,
    ToolExecuted,
    mint,
)
from shared.topology import COMMAND_TYPES, LEDGER_QUEUES, SENDER_EXCHANGES, SENDERS, Topology

QUEUE_MODELS: dict[str, type] = {
    "turn.start": StartTurn,
    "turn.cancel": CancelTurn,
    "approval.respond": RespondToApproval,
    "step.completed": ModelStepCompleted,
    "tool.completed": ToolExecuted,
    "execution.refused": RefuseExecution,
    "step.requested": RequestModelStep,
    "tool.execute": ExecuteTool,
}
ADAPTERS = {kind: TypeAdapter(model) for kind, model in QUEUE_MODELS.items()}
QUEUES = tuple(QUEUE_MODELS)
# Messages per hypothesis example: about what one example's choice buffer (8 kB) holds.
BATCH = 40
# Who parks what (the dead letter's x-signoff-consumer).
CONSUMERS = {**{kind: "approval-ledger" for kind in LEDGER_QUEUES}, "step.requested": "model-step",
             "tool.execute": "tool-executor"}
# The codes the executor parks a `tool.execute` under when it refuses to run it.
REFUSAL_CODES = {"unauthorized", "bad_signature", "altered", "expired", "not_on_record"}
TOOL_NAMES = ("post_to_sink", "put_to_sink", "read_clock", "count", "explode", "no_such_tool")
EVENT_TYPES = ("approval.requested", "approval.decided", "tool.closed", "turn.completed", "turn.failed",
               "message.rejected", "operator.alerted", "nonsense", "")


# --- strategies ---------------------------------------------------------------------

def _minted(prefix: str) -> st.SearchStrategy[str]:
    return st.binary(min_size=16, max_size=16).map(lambda b: f"{prefix}_{b.hex()}")


SPECIAL_STRINGS = ("", " ", "\x00", "a\x00b", "\u202e", "\ufeff", "\U0001f642", "\U0010ffff", "\\", '"', "null",
                   "{}", "' OR 1=1 --", "%s%n", "\r\n", "token:cli", "tester", "cli", "*", "group:finance",
                   "\ud83d\ude42", "\ud800", "ä" * 3)
# Drawn text, and (as often) a string known to trip parsers, encoders or databases.
TEXT = st.one_of(st.text(max_size=16), st.sampled_from(SPECIAL_STRINGS), st.sampled_from(SPECIAL_STRINGS[:5]))
# Identifiers: what the schema accepts (`^[A-Za-z0-9_-]{1,64}$`), at its edges too.
GOOD_ID = st.one_of(_minted("x"), st.text(alphabet="aZ09_-", min_size=1, max_size=8),
                    st.sampled_from(["-", "_", "A" * 64, "call_a", "call_b"]))
BAD_ID = st.one_of(
    st.sampled_from(["", "a" * 65, "has space", "slash/id", "dot.id", "ümlaut", "emoji\U0001f642", "nul\x00id",
                     "tab\tid", "new\nline", "ses_" + "f" * 61, "../../etc/passwd", "*", "#"]),
    st.integers(), st.none(), st.booleans(), st.lists(st.integers(), max_size=2), st.floats(),
)
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT)
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                             st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                          max_leaves=5)
JSON_OBJECT = st.dictionaries(st.text(max_size=8), JSON_VALUE, max_size=3)
TIMES = st.one_of(
    st.just("now"), st.just("now"), st.just("now"), st.just("now-naive"),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC))
    .map(lambda t: t.isoformat()),
    # No time zone: a naive time.
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)).map(lambda t: t.isoformat()),
    st.sampled_from(["", "yesterday", "2025-13-40T25:61:61Z", "1970-01-01T00:00:00Z", "0", "9999-12-31T23:59:59Z"]),
    st.integers(),
)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


AUTHORIZATION = st.one_of(
    st.just(""), TEXT, st.sampled_from(["a.b", "a.b.c", ".", "...", "AAAA.AAAA", "\u00e9.\u00e9"]),
    st.builds(lambda claims, sig: f"{_b64(claims)}.{_b64(sig)}", st.binary(max_size=24),
              st.binary(min_size=64, max_size=64)),
    st.builds(lambda claims: f"{_b64(json.dumps(claims).encode())}.{_b64(bytes(64))}", JSON_VALUE),
)


def _optional(**fields: st.SearchStrategy) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional=fields)


ENVELOPE = _optional(causation_id=st.one_of(st.none(), GOOD_ID), schema_version=st.just(1), occurred_at=TIMES,
                     sequence=st.one_of(st.none(), st.integers()))


_ATTEMPT = st.fixed_dictionaries(
    {"number": st.integers(1, 4), "status": st.sampled_from(["completed", "failed", "abandoned", "completed"]),
     "provider": st.one_of(st.just("scripted"), TEXT)},
    optional={"usage": _optional(input_tokens=st.integers(-1, 2**70), output_tokens=st.integers(-1, 10)),
              "error": st.one_of(st.none(), TEXT)},
)

BODIES: dict[str, st.SearchStrategy[dict]] = {
    "turn.start": st.fixed_dictionaries(
        {"text": st.one_of(st.just("hello"), TEXT)},
        optional={"provider": st.one_of(st.none(), st.sampled_from(["scripted", "openai", "nope", "UPPER", "a" * 65])),
                  "started_by": st.one_of(st.none(), TEXT)}),
    "turn.cancel": _optional(turn_id=st.one_of(st.none(), _minted("trn"), GOOD_ID), reason=TEXT, cancelled_by=TEXT),
    "approval.respond": st.fixed_dictionaries(
        {"request_id": st.one_of(_minted("apr"), GOOD_ID), "decision": st.sampled_from(["approve", "deny"]),
         "args_digest": st.one_of(st.just("hmac-sha256:" + "0" * 64), TEXT)},
        optional={"reason": TEXT, "message": TEXT, "responder": TEXT, "response_id": GOOD_ID, "issued_at": TIMES,
                  "key_id": st.one_of(st.none(), st.sampled_from(["cli", "nope", ""])),
                  "signature": st.one_of(st.none(), TEXT, st.binary(min_size=64, max_size=64).map(_b64)),
                  "response_token": st.one_of(st.none(), TEXT)}),
    "step.completed": st.fixed_dictionaries(
        {"step_id": st.one_of(_minted("stp"), GOOD_ID), "attempts": st.lists(_ATTEMPT, min_size=1, max_size=2)},
        optional={"text": TEXT, "error": st.one_of(st.none(), TEXT),
                  "tool_calls": st.lists(st.fixed_dictionaries(
                      {"provider_call_id": TEXT, "name": st.one_of(st.sampled_from(TOOL_NAMES), TEXT),
                       "arguments": JSON_OBJECT}), max_size=2)}),
    "tool.completed": st.fixed_dictionaries(
        {"call_id": st.one_of(_minted("call"), GOOD_ID),
         "outcome": st.sampled_from(["output", "error", "outcome_unknown"] * 3 + ["bogus"])},
        optional={"output": JSON_VALUE, "error": st.one_of(st.none(), TEXT)}),
    "execution.refused": st.fixed_dictionaries(
        {"call_id": st.one_of(_minted("call"), GOOD_ID, TEXT), "tool": st.one_of(st.sampled_from(TOOL_NAMES), TEXT),
         "reason_code": st.one_of(st.sampled_from(sorted(REFUSAL_CODES)), TEXT), "reason_text": TEXT}),
    "step.requested": st.fixed_dictionaries(
        {"step_id": st.one_of(_minted("stp"), GOOD_ID),
         "provider": st.one_of(st.sampled_from(["scripted", "openai", "anthropic", "nope", "scripted"]),
                               st.sampled_from(["", "Scripted", "a" * 65]), TEXT),
         "transcript_length": st.integers(-1, 3),
         "transcript_digest": st.one_of(st.just(EMPTY_TRANSCRIPT), st.just("sha256:" + "0" * 64), TEXT),
         "tools": st.lists(st.fixed_dictionaries({"name": TEXT, "description": TEXT, "parameters": JSON_OBJECT}),
                           max_size=2)},
        # A menu named by digest: none the ledger stored (the step fails, reported), or not a digest.
        optional={"tools_digest": st.one_of(st.none(), st.just("sha256:" + "0" * 64), TEXT)}),
    "tool.execute": st.fixed_dictionaries(
        {"call_id": st.one_of(_minted("call"), GOOD_ID), "tool": st.one_of(st.sampled_from(TOOL_NAMES), TEXT),
         "arguments": JSON_OBJECT, "idempotency_key": st.one_of(_minted("idk"), GOOD_ID)},
        optional={"authorization": AUTHORIZATION}),
}
ID_FIELDS = ("message_id", "session_id", "causation_id", "request_id", "response_id", "step_id", "call_id",
             "turn_id", "idempotency_key")
HUGE_SIZES = (65, 257, 4001, 65_537, 100_001, 250_000)
BAD_BYTES = (b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80")

# Lengths at the schema's limits (identifiers 64, provider names 64, digests 100,
# signatures 200, names 256, texts 4,000), either side.
LONG_SIZES = (64, 65, 100, 101, 200, 201, 256, 257, 4000, 4001)
_LONG = st.tuples(st.just("long"), st.integers(0, 20), st.sampled_from(LONG_SIZES), st.sampled_from(["x", "é", "\x00"]))
MUTATION = st.one_of(
    st.tuples(st.just("drop"), st.integers(0, 20)),
    _LONG,
    st.tuples(st.just("set"), st.integers(0, 20), JSON_VALUE),
    st.tuples(st.just("huge"), st.integers(0, 20), st.sampled_from(HUGE_SIZES),
              st.sampled_from(["x", "é", "\U0001f642", "\x00"])),
    st.tuples(st.just("extra"), st.text(max_size=10), JSON_VALUE),
    st.tuples(st.just("schema"), st.sampled_from([0, 2, "1", None, 1.5, True, -1, 2**64])),
    st.tuples(st.just("type"), st.one_of(st.sampled_from(QUEUES + EVENT_TYPES), TEXT)),
    st.tuples(st.just("badid"), st.sampled_from(ID_FIELDS), BAD_ID),
)
# Encodings that keep a message as it is, then the faulty ones; large bodies (a few
# per cent) last, so that 100,000 messages do not move gigabytes.
KEEPING = st.one_of(
    st.just(("json",)),
    st.tuples(st.just("spaces"), st.integers(0, 4), st.sampled_from([b" ", b"\n", b"\t"])),
)
FAULTY = st.one_of(
    st.tuples(st.just("bom"), st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe"])),
    st.tuples(st.just("not_object"), st.integers(0, 4)),
    st.tuples(st.just("not_json"), st.one_of(st.binary(max_size=24), st.sampled_from(
        [b"", b"NaN", b"{", b"}", b"[]", b"{}", b"null", b"\x00", b"{'single': 'quotes'}", b"{\"a\":1,}", b"\"x\"",
         b"Infinity", b"1e999999", b"--", b"{\"type\": \"turn.start\"}{}"]))),
    st.tuples(st.just("truncated"), st.floats(0.0, 1.0)),
    st.tuples(st.just("invalid_utf8"), st.floats(0.0, 1.0), st.sampled_from(BAD_BYTES)),
    st.tuples(st.just("nested"), st.sampled_from([64, 200, 1_000, 20_000])),
)
LARGE = st.one_of(
    st.tuples(st.just("oversized"), st.sampled_from([1, 2, 1_000, 100_000])),
    st.just(("at_limit",)),
    st.tuples(st.just("nested"), st.just(120_000)),
)


@dataclass(frozen=True)
class Plan:
    """One drawn message, before it is made concrete (`materialize`)."""

    queue: str
    base_type: str
    fields: dict
    envelope: dict
    message_id: str
    mutations: tuple
    encoding: tuple
    sender: str  # "own" | "admin"
    session: tuple  # ("fresh",) | ("shared", k) | ("drawn", id) | ("real",)
    duplicate: tuple  # () | ("batch", k) | ("real", k)
    signed: bool

    def __repr__(self) -> str:
        def short(value: Any) -> str:
            text = repr(value)
            return text if len(text) <= 60 else text[:57] + "..."

        return (f"Plan({self.queue}<-{self.base_type} {self.sender} session={self.session} dup={self.duplicate} "
                f"enc={short(self.encoding)} mut={short(self.mutations)} signed={self.signed} "
                f"fields={short(self.fields)})")


_QUEUE = st.sampled_from(QUEUES)
_SHAPE = st.integers(0, 99)
_ONE_IN_20 = st.integers(0, 19)
_MUTATIONS = {(low, high): st.lists(MUTATION, min_size=low, max_size=high) for low, high in ((1, 3), (0, 2), (0, 1))}
_SESSION = st.one_of(st.just(("fresh",)), st.tuples(st.just("shared"), st.integers(0, 2)),
                     st.tuples(st.just("drawn"), GOOD_ID), st.just(("real",)))
_DUPLICATE = st.one_of(st.just(()), st.just(()), st.just(()),
                       st.tuples(st.sampled_from(["batch", "real"]), st.integers(0, 99)))
_LEDGER_SENDER = st.sampled_from(["own"] * 7 + ["admin"])
_MESSAGE_ID = _minted("msg")


@st.composite
def plans(draw: Callable, queue: str) -> Plan:
    """40 % of the messages are drawn well-formed for their queue (most of them reach
    its handler), 15 % have one field at a length limit (one side or the other), the
    rest one to three faults; 3 % have a large body."""
    shape = draw(_SHAPE)
    base_type = draw(_QUEUE) if 91 <= shape < 97 else queue
    if shape < 40:
        mutations, encoding = (), draw(KEEPING)
    elif shape < 55:
        mutations, encoding = (draw(_LONG),), draw(KEEPING)  # one field at a length limit: valid or just not
    elif shape < 73:
        mutations, encoding = tuple(draw(_MUTATIONS[1, 3])), draw(KEEPING)
    elif shape < 91:
        mutations, encoding = tuple(draw(_MUTATIONS[0, 2])), draw(FAULTY)
    elif shape < 97:
        mutations, encoding = (), draw(KEEPING)  # another message type than the queue's
    else:
        mutations, encoding = tuple(draw(_MUTATIONS[0, 1])), draw(LARGE)
    if shape >= 97 or draw(_ONE_IN_20) != 0:
        # A huge field only now and then: drop the mutations that would make one.
        mutations = tuple(m for m in mutations if m[0] != "huge" or m[2] < 5_000)
    return Plan(
        queue=queue,
        base_type=base_type,
        fields=draw(BODIES[base_type]),
        envelope=draw(ENVELOPE),
        message_id=draw(_MESSAGE_ID),
        mutations=mutations,
        encoding=encoding,
        sender=draw(_LEDGER_SENDER) if queue in LEDGER_QUEUES else "own",
        session=draw(_SESSION),
        duplicate=draw(_DUPLICATE),
        signed=base_type == "approval.respond" and draw(st.booleans()),
    )


PLANS = {queue: plans(queue) for queue in QUEUES}


@st.composite
def batches(draw: Callable, size: int) -> list[Plan]:
    """`size` plans, as many for each queue (give or take one), taking turns."""
    per_queue = [draw(st.lists(PLANS[queue], min_size=n, max_size=n))
                 for n, queue in zip([size // len(QUEUES) + (i < size % len(QUEUES)) for i in range(len(QUEUES))],
                                     QUEUES, strict=True)]
    return [plans_[turn] for turn in range(max(map(len, per_queue))) for plans_ in per_queue if turn < len(plans_)]


# --- the oracle ---------------------------------------------------------------------

@dataclass(frozen=True)
class Prediction:
    # "dead": parked with `reason`; "ledger": answered by the ledger (one answer per
    # message id); "dropped": a duplicate of a committed real id, dropped silently;
    # "step": reported on by the model-step; "execute": refused by the executor.
    kind: str
    reason: str = ""
    message_id: str = ""
    session_id: str = ""
    call_id: str = ""


def predict(queue: str, body: bytes, max_bytes: int, real_ids: set[str]) -> Prediction:
    if len(body) > max_bytes:
        return Prediction("dead", "oversized")
    try:
        message = ADAPTERS[queue].validate_json(body)
    except ValidationError:
        return Prediction("dead", "invalid")
    if "message_id" not in json.loads(body):
        # Refused: an id minted by the consumer would differ on every delivery.
        return Prediction("dead", "invalid")
    if queue in LEDGER_QUEUES:
        if message.message_id in real_ids:
            return Prediction("dropped", message_id=message.message_id, session_id=message.session_id)
        return Prediction("ledger", message_id=message.message_id, session_id=message.session_id,
                          call_id=getattr(message, "call_id", ""))
    if queue == "step.requested":
        return Prediction("step", message_id=message.message_id, session_id=message.session_id)
    return Prediction("execute", message_id=message.message_id, session_id=message.session_id,
                      call_id=message.call_id)


@dataclass
class Fuzzed:
    """One concrete garbage message, as published."""

    index: int
    part: int
    plan: Plan
    queue: str
    body: bytes
    amqp_id: str
    sender: str
    prediction: Prediction
    forced: str = ""
    size: int = 0

    def describe(self) -> str:
        body = self.body if self.size <= 300 else self.body[:240] + b"...(%d bytes)" % self.size
        return (f"#{self.amqp_id} to {self.queue} as {self.sender}: {self.prediction.kind} "
                f"{self.prediction.reason}{' forced:' + self.forced if self.forced else ''} body={body!r}")


@dataclass
class Context:
    """What materializing a batch needs to know."""

    batch: int
    size: int
    max_bytes: int
    real_session: str
    real_start_id: str
    real_response_id: str
    sign: Callable[[RespondToApproval], RespondToApproval]
    namespace: str


def _part(index: int, size: int) -> int:
    """Where in the real session's life the message goes: 0 before its turn.start,
    1 after it was sent, 2 once its card is out (turn.start committed), 3 once its
    turn completed (the approval committed)."""
    return min(3, index * 4 // max(size, 1))


def _session_id(plan: Plan, index: int, ctx: Context) -> Any:
    kind = plan.session[0]
    if kind == "fresh":
        return f"ses_fz{ctx.batch:05d}x{index:04d}"
    if kind == "shared":
        return f"ses_fz{ctx.batch:05d}shared{plan.session[1]}"
    if kind == "drawn":
        return plan.session[1]
    return ctx.real_session


def _mutate(message: dict, mutation: tuple, base_type: str) -> None:
    op = mutation[0]
    keys = sorted(message)
    if op == "long":
        # Any field of the message type, present or not.
        names = sorted(set(QUEUE_MODELS[base_type].model_fields) - {"type"})
        message[names[mutation[1] % len(names)]] = mutation[3] * mutation[2]
    if op == "drop" and keys:
        message.pop(keys[mutation[1] % len(keys)])
    elif op == "set" and keys:
        message[keys[mutation[1] % len(keys)]] = mutation[2]
    elif op == "huge":
        strings = sorted(k for k, v in message.items() if isinstance(v, str) and k != "type") or keys
        if strings:
            message[strings[mutation[1] % len(strings)]] = mutation[3] * mutation[2]
    elif op == "extra":
        message.setdefault(mutation[1], mutation[2])
    elif op == "schema":
        message["schema_version"] = mutation[1]
    elif op == "type":
        message["type"] = mutation[1]
    elif op == "badid":
        message[mutation[1]] = mutation[2]


def _dumps(message: Any) -> bytes:
    # Not ASCII-escaped: non-ASCII text travels as UTF-8, as most adapters send it.
    # Surrogates cannot travel that way and go as JSON escapes: a pair is a character,
    # a lone one (`\ud800`) JSON that no consumer accepts.
    return json.dumps(message, ensure_ascii=False).encode("utf-8", "backslashreplace")


def _encode(message: dict, encoding: tuple, max_bytes: int) -> bytes:
    kind = encoding[0]
    body = _dumps(message)
    if kind == "bom":
        return encoding[1] + body
    if kind == "spaces":
        return encoding[2] * encoding[1] + body + encoding[2] * encoding[1]
    if kind == "not_object":
        return _dumps([[message], "turn.start", 1, None, True][encoding[1]])
    if kind == "not_json":
        return encoding[1]
    if kind == "truncated":
        return body[: int(len(body) * encoding[1])]
    if kind == "invalid_utf8":
        at = int(len(body) * encoding[1])
        return body[:at] + encoding[2] + body[at:]
    if kind == "nested":
        depth = encoding[1]
        nested = _dumps({**message, "deep": "__DEEP__"})
        return nested.replace(b'"__DEEP__"', b"[" * depth + b"]" * depth)
    if kind == "oversized":
        return body + b" " * max(0, max_bytes + encoding[1] - len(body))
    if kind == "at_limit":
        return body + b" " * max(0, max_bytes - len(body))
    return body


def materialize(plans_: list[Plan], ctx: Context) -> list[Fuzzed]:
    made: list[Fuzzed] = []
    ids: list[str] = []
    real_ids = {ctx.real_start_id, ctx.real_response_id}
    for index, plan in enumerate(plans_):
        part = _part(index, len(plans_))
        message: dict[str, Any] = {"type": plan.base_type, "message_id": plan.message_id,
                                   "session_id": _session_id(plan, index, ctx), **plan.envelope, **plan.fields}
        for name in ("occurred_at", "issued_at"):
            if message.get(name) == "now":
                message[name] = datetime.now(UTC).isoformat()
            elif message.get(name) == "now-naive":  # the local time, without its zone
                message[name] = datetime.now().isoformat()
        if plan.duplicate:
            # A committed real id only (a real one not yet applied would be taken by the
            # garbage and the real message dropped: ids are the sender's to keep unique).
            committed = [ctx.real_start_id] * (part >= 2) + [ctx.real_response_id] * (part >= 3)
            pool = committed if plan.duplicate[0] == "real" and committed else ids
            if pool:
                message["message_id"] = pool[plan.duplicate[1] % len(pool)]
        for mutation in plan.mutations:
            _mutate(message, mutation, plan.base_type)
        if plan.signed:
            with contextlib.suppress(ValidationError):
                response = RespondToApproval.model_validate_json(_dumps(message))
                message = json.loads(ctx.sign(response.model_copy(update={"key_id": "cli"})).model_dump_json())
        body = _encode(message, plan.encoding, ctx.max_bytes)
        prediction = predict(plan.queue, body, ctx.max_bytes, real_ids)
        forced = ""
        if prediction.kind == "ledger" and plan.sender == "own" and (
            plan.queue == "turn.start" or (plan.queue == "turn.cancel" and prediction.session_id == ctx.real_session)
        ):
            # It would legitimately open a session, or cancel the real turn: not garbage.
            forced = "schema_version 2"
            message = {**json.loads(body), "schema_version": 2}
            body = _dumps(message)
            prediction = predict(plan.queue, body, ctx.max_bytes, real_ids)
        if isinstance(message, dict) and isinstance(message.get("message_id"), str):
            ids.append(message["message_id"])
        made.append(Fuzzed(index, part, plan, plan.queue, body, f"fz-{ctx.batch}-{index}", plan.sender, prediction,
                           forced, len(body)))
    return made


# --- the runner ---------------------------------------------------------------------

@dataclass
class Seen:
    """Everything observed on the deployment's events and dead letters, for the whole
    run, attributed as it arrives (a long run must not rescan it)."""

    rejections: dict[str, list] = field(default_factory=lambda: defaultdict(list))  # by rejected message id
    alerts: dict[str, list] = field(default_factory=lambda: defaultdict(list))  # by causation id
    step_reports: Counter = field(default_factory=Counter)  # rejected model-step reports, by session
    executor_alerts: Counter = field(default_factory=Counter)  # alerts of refused tool.execute, by call id
    real_events: dict[str, list] = field(default_factory=lambda: defaultdict(list))  # by real session id
    unattributed: list = field(default_factory=list)
    dead: dict[str, list] = field(default_factory=lambda: defaultdict(list))  # by AMQP message id
    unparsable_events: list = field(default_factory=list)
    dead_without_reason: list = field(default_factory=list)


@dataclass
class Expected:
    """What the garbage published so far must lead to, for the whole run."""

    dead: dict[str, str] = field(default_factory=dict)  # AMQP id -> reason (or "refused")
    garbage_ids: set[str] = field(default_factory=set)
    step_ids: set[str] = field(default_factory=set)
    step_copies: int = 0
    step_sessions: set[str] = field(default_factory=set)
    execute_copies: Counter = field(default_factory=Counter)  # by call id

    def add(self, item: Fuzzed) -> None:
        prediction = item.prediction
        if prediction.message_id:
            self.garbage_ids.add(prediction.message_id)
        if prediction.kind == "dead":
            self.dead[item.amqp_id] = prediction.reason
        elif prediction.kind == "step":
            self.step_ids.add(prediction.message_id)
            self.step_copies += 1
            self.step_sessions.add(prediction.session_id)
        elif prediction.kind == "execute":
            self.dead[item.amqp_id] = "refused"
            self.execute_copies[prediction.call_id] += 1


class FuzzRun:
    """One deployment, fuzzed batch by batch, each batch beside one real session."""

    def __init__(self, deployment, sink, stack: contextlib.AsyncExitStack) -> None:
        self.deployment = deployment
        self.sink = sink
        self.stack = stack
        self.namespace = deployment.namespace
        self.max_bytes = deployment.settings.max_message_bytes
        self.seen = Seen()
        self.expected = Expected()
        self.real_sessions: set[str] = set()
        self.published = 0
        self.batches = 0
        self.timings: list[float] = []
        self.items: list[Fuzzed] = []

    @classmethod
    async def open(cls, deployment, sink, stack: contextlib.AsyncExitStack) -> FuzzRun:
        from tests.harness import RABBITMQ_URL

        run = cls(deployment, sink, stack)
        run.console = await stack.enter_async_context(deployment.console())
        run.senders = {"channel": run.console}
        for identity in ("model-step", "tool-executor", "publisher"):
            run.senders[identity] = await stack.enter_async_context(deployment.console(identity=identity))
        run.exchanges = {}
        for identity, console in run.senders.items():
            name = f"{run.namespace}.{SENDER_EXCHANGES[identity]}"
            run.exchanges[identity] = (await console.channel.get_exchange(name, ensure=False), console.user)
        admin = await aio_pika.connect(RABBITMQ_URL)
        stack.push_async_callback(admin.close)
        run.admin_connection = admin
        run.admin = (await admin.channel(publisher_confirms=True), urlsplit(RABBITMQ_URL).username or "guest")
        events = await run.console.watch("*")
        await events.consume(run._on_event, no_ack=True)
        # The dead letters are the operator's to read (no channel may).
        operator = await stack.enter_async_context(deployment.console(identity="console"))
        reader = await operator.connection.channel()
        await reader.set_qos(prefetch_count=256)
        dead = await reader.declare_queue(f"{run.namespace}.dead-letters", passive=True)
        await dead.consume(run._on_dead)
        return run

    async def _on_event(self, raw: aio_pika.abc.AbstractIncomingMessage) -> None:
        seen, expected = self.seen, self.expected
        try:
            event = EVENT.validate_json(raw.body)
        except ValidationError as error:
            seen.unparsable_events.append((raw.body[:300], str(error)[:300]))
            return
        session_id = event.session_id
        if session_id in self.real_sessions:
            seen.real_events[session_id].append(event)
        if event.type == "message.rejected":
            if event.rejected_message_id in expected.garbage_ids:
                seen.rejections[event.rejected_message_id].append(event)
            elif event.rejected_type == "step.completed":
                seen.step_reports[session_id] += 1
            else:
                seen.unattributed.append(event)
        elif event.type == "operator.alerted":
            if event.causation_id in expected.garbage_ids:
                seen.alerts[event.causation_id].append(event)
            else:
                seen.executor_alerts[event.call_id] += 1
        elif session_id not in self.real_sessions:
            seen.unattributed.append(event)

    async def _on_dead(self, raw: aio_pika.abc.AbstractIncomingMessage) -> None:
        headers = raw.headers or {}
        reason = headers.get(REASON_HEADER)
        deaths = headers.get("x-death")
        if isinstance(reason, bytes):
            reason = reason.decode()
        if not reason and isinstance(deaths, list) and deaths:
            reason = "x-death:" + str(deaths[0].get("reason"))
        if not reason:
            self.seen.dead_without_reason.append((raw.message_id, raw.body[:300], headers))
        consumer = headers.get(CONSUMER_HEADER)
        self.seen.dead[raw.message_id or "?"].append((reason, consumer.decode() if isinstance(consumer, bytes)
                                                      else consumer))
        await raw.ack()

    # --- publishing ---------------------------------------------------------------

    async def _publish(self, item: Fuzzed) -> None:
        message = aio_pika.Message(item.body, message_id=item.amqp_id, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                   content_type="application/json")
        if item.sender == "admin":
            channel, user = self.admin
            message.user_id = user
            await channel.default_exchange.publish(message, routing_key=f"{self.namespace}.{COMMAND_TYPES[item.queue]}")
        else:
            exchange, user = self.exchanges[SENDERS[item.queue]]
            message.user_id = user
            await exchange.publish(message, routing_key=item.queue)
        self.published += 1
        item.body = item.body[:400]  # what describing it needs; a long run keeps no more

    async def _publish_all(self, items: list[Fuzzed]) -> None:
        for item in items:
            self.expected.add(item)
        for start in range(0, len(items), 32):
            await asyncio.gather(*(self._publish(item) for item in items[start:start + 32]))

    # --- one batch ----------------------------------------------------------------

    async def _event(self, session_id: str, kinds: tuple[str, ...], timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.seen.real_events.get(session_id, []):
                if event.type in kinds:
                    return event
            await asyncio.sleep(0.01)
        raise AssertionError(f"no {' or '.join(kinds)} in the real session {session_id} within {timeout}s; "
                             f"its events: {[e.type for e in self.seen.real_events.get(session_id, [])]}\n"
                             f"{self.logs()}")

    async def batch(self, drawn: list[Plan]) -> None:
        started = time.monotonic()
        self.batches += 1
        session_id = mint("ses")
        self.real_sessions.add(session_id)
        start = StartTurn(session_id=session_id, text=f"fuzz batch {self.batches}", started_by="fuzzer")
        response_id = mint("msg")
        ctx = Context(batch=self.batches, size=len(drawn), max_bytes=self.max_bytes, real_session=session_id,
                      real_start_id=start.message_id, real_response_id=response_id, sign=self.console.sign,
                      namespace=self.namespace)
        items = materialize(drawn, ctx)
        self.items += items
        parts = [[item for item in items if item.part == n] for n in range(4)]
        await self._publish_all(parts[0])
        await self.console.send(start)
        await self._publish_all(parts[1])
        requested = await self._event(session_id, ("approval.requested", "turn.failed", "turn.cancelled"))
        assert requested.type == "approval.requested", f"the real turn ended: {requested!r}\n{self.logs()}"
        await self._publish_all(parts[2])
        await self.console.send(self.console.sign(RespondToApproval(
            message_id=response_id, session_id=session_id, request_id=requested.request_id, decision="approve",
            args_digest=requested.args_digest, responder="tester")))
        ended = await self._event(session_id, ("turn.completed", "turn.failed", "turn.cancelled"))
        assert ended.type == "turn.completed", f"the real turn did not complete: {ended!r}\n{self.logs()}"
        await self._publish_all(parts[3])
        await self.settle(items)
        self.check(items, final=False)
        self.timings.append(time.monotonic() - started)

    async def finish(self) -> None:
        """The end of the run: everything answered exactly once, the state checked."""
        await self.settle(self.items)
        await asyncio.sleep(1.0)  # time for any second answer to show
        await self.check_state()
        self.check(self.items, final=True)

    def summary(self) -> str:
        kinds = Counter(item.prediction.kind + (f":{item.prediction.reason}" if item.prediction.reason else "")
                        for item in self.items)
        per_batch = sorted(self.timings)
        return (f"{self.published} messages ({sum(i.size for i in self.items) / 1e6:.1f} MB, "
                f"{dict(sorted(Counter(i.queue for i in self.items).items()))}) in {self.batches} batches beside "
                f"{len(self.real_sessions)} real sessions; predicted {dict(sorted(kinds.items()))}; broken on "
                f"purpose {dict(Counter(i.forced for i in self.items if i.forced))}; per batch "
                f"median {per_batch[len(per_batch) // 2]:.2f} s, max {per_batch[-1]:.2f} s; "
                f"handler failures logged: {self.failures_in_logs() or 'none'}")

    # --- checks ---------------------------------------------------------------------

    def _answers_to(self, item: Fuzzed) -> list:
        prediction, seen = item.prediction, self.seen
        return seen.rejections.get(prediction.message_id, []) + seen.alerts.get(prediction.message_id, [])

    def _waiting_on(self, items: list[Fuzzed]) -> list[str]:
        """What this batch still waits for (empty: everything answered)."""
        missing = []
        seen, expected = self.seen, self.expected
        reports = sum(seen.step_reports.values())
        for item in items:
            prediction = item.prediction
            if item.amqp_id in expected.dead and not seen.dead.get(item.amqp_id):
                missing.append(f"no dead letter for {item.describe()}")
            elif prediction.kind == "ledger" and not self._answers_to(item):
                missing.append(f"no answer from the ledger to {item.describe()}")
            elif prediction.kind == "step" and reports < len(expected.step_ids):
                missing.append(f"{len(expected.step_ids) - reports} step request(s) not reported on, e.g. "
                               f"{item.describe()}")
            elif prediction.kind == "execute" and \
                    seen.executor_alerts[prediction.call_id] < expected.execute_copies[prediction.call_id]:
                missing.append(f"no operator alert for the refused {item.describe()}")
        return missing

    async def settle(self, items: list[Fuzzed], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while (missing := self._waiting_on(items)) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if missing:
            raise AssertionError(f"{len(missing)} fuzzed message(s) never answered:\n  "
                                 + "\n  ".join(missing[:20]) + "\n" + self.logs())

    def check(self, items: list[Fuzzed], *, final: bool) -> None:
        """Every answer is the one predicted, and only once (`final`: for the whole run)."""
        violations = []
        seen, expected = self.seen, self.expected
        for item in items:
            prediction, got = item.prediction, seen.dead.get(item.amqp_id, [])
            if item.amqp_id in expected.dead:
                want = expected.dead[item.amqp_id]
                reasons = [reason for reason, _ in got]
                ok = len(got) == 1 and (reasons[0] in REFUSAL_CODES if want == "refused" else reasons[0] == want) \
                    and got[0][1] == CONSUMERS[item.queue]  # parked by the queue's own consumer
                if not ok:
                    violations.append(f"dead letters {got} (expected one {want}) for {item.describe()}")
            elif got:
                violations.append(f"parked {got} although valid ({prediction.kind}): {item.describe()}")
            if prediction.kind == "ledger":
                # One answer per message id, whichever of its copies the inbox took.
                answers = self._answers_to(item)
                if len(answers) != 1:
                    said = [(a.type, a.reason_code) for a in answers]
                    violations.append(f"{len(answers)} answers {said} (expected 1) to {item.describe()}")
            elif prediction.kind == "dropped" and self._answers_to(item):
                violations.append(f"a duplicate of a real message was answered: {item.describe()}")
            elif prediction.kind == "execute" and \
                    seen.executor_alerts[prediction.call_id] != expected.execute_copies[prediction.call_id]:
                violations.append(f"{seen.executor_alerts[prediction.call_id]} operator alerts for call "
                                  f"{prediction.call_id!r}, expected {expected.execute_copies[prediction.call_id]}: "
                                  f"{item.describe()}")
        # Reports name their session, not the request: counted over the run. A request whose
        # id the model-step handled before is skipped (its Redis fast path); two copies
        # handled at once may both be reported.
        reports = sum(seen.step_reports.values())
        if not len(expected.step_ids) <= reports <= expected.step_copies:
            violations.append(f"{reports} step reports rejected, expected {len(expected.step_ids)}.."
                              f"{expected.step_copies}")
        if final:
            unknown_dead = set(seen.dead) - set(expected.dead)
            violations += [f"an unexpected dead letter {amqp_id}: {seen.dead[amqp_id]}" for amqp_id in unknown_dead]
            violations += [f"a dead letter without a reason: {d!r}" for d in seen.dead_without_reason]
            violations += [f"an event that does not parse: {e!r}" for e in seen.unparsable_events]
            violations += [f"an event nobody fuzzed for: {e!r}" for e in seen.unattributed]
            violations += [f"{n} step reports rejected in session {s!r}, where nothing was fuzzed"
                           for s, n in seen.step_reports.items() if s not in expected.step_sessions]
            violations += [f"{n} operator alerts for call {c!r}, which no fuzzed tool.execute named"
                           for c, n in seen.executor_alerts.items() if c not in expected.execute_copies]
            for session_id in self.real_sessions:
                kinds = Counter(e.type for e in seen.real_events.get(session_id, []))
                if kinds["turn.completed"] != 1 or kinds["turn.failed"] or kinds["turn.cancelled"]:
                    violations.append(f"the real session {session_id} ended as {dict(kinds)}")
            for name, count in self.failures_in_logs().items():
                violations.append(f"{name} logged {count} handler failure(s) (a redelivery, a parked copy that "
                                  "failed, a traceback)")
        if violations:
            raise AssertionError(f"{len(violations)} violation(s):\n  " + "\n  ".join(violations[:30])
                                 + "\n" + self.logs())

    async def queues_left(self, timeout: float) -> dict[str, int]:
        """Messages ready in the deployment's queues, waiting up to `timeout` for them to
        drain. Looked at through a new plain channel each time: a robust channel (a
        Console's, as tests/invariants.py's `queues_left` uses) answers a passive
        re-declaration from its cache, with the counts of its first look."""
        deadline = time.monotonic() + timeout
        while True:
            channel = await self.admin_connection.channel()
            try:
                counts = {}
                for name in Topology(self.namespace).all_queue_names():
                    queue = await channel.declare_queue(name, passive=True)
                    if queue.declaration_result.message_count:
                        counts[name] = queue.declaration_result.message_count
            finally:
                await channel.close()
            if not counts or time.monotonic() > deadline:
                return counts
            await asyncio.sleep(0.1)

    async def check_state(self) -> None:
        """The services are alive, every queue drained, and the ledger holds the real sessions' state only."""
        violations = []
        for name, process in self.deployment.processes.items():
            if process.poll() is not None:
                violations.append(f"{name} exited with {process.poll()}")
        left = await self.queues_left(timeout=15)
        violations += [f"{name} still holds {count} message(s)" for name, count in left.items()]
        real = set(self.real_sessions)
        async with self.console.ledger.sessions() as db:
            sessions = set(await db.scalars(select(Session.id)))
            if sessions != real:
                violations.append(f"sessions other than the real ones: {sorted(sessions - real)[:10]}; "
                                  f"missing: {sorted(real - sessions)[:10]}")
            calls = set(await db.scalars(select(ToolCall.id)))
            requests = set(await db.scalars(select(Base.metadata.tables["approval_requests"].c.id)))
            for table in Base.metadata.sorted_tables:
                # The inbox and outbox record the garbage's rejections, and so does the audit log (below).
                if table.name in ("inbox", "outbox", "audit_log"):
                    continue
                for column, allowed in (("session_id", real), ("request_id", requests), ("call_id", calls)):
                    if column in table.c:
                        values = set(await db.scalars(select(table.c[column]).distinct()))
                        if values - allowed - {None}:
                            violations.append(f"{table.name}.{column} holds {sorted(values - allowed)[:5]}, "
                                              "not the real sessions'")
                        break
            turns = (await db.execute(select(Turn.session_id, Turn.status))).all()
            if sorted(turns) != sorted((s, "completed") for s in real):
                violations.append(f"turns {Counter(status for _, status in turns)}, expected one completed per "
                                  "real session")
            if len(calls) != len(real):
                violations.append(f"{len(calls)} tool calls, expected {len(real)}")
            decisions = await db.scalar(select(func.count()).select_from(Decision))
            claims = await db.scalar(select(func.count()).select_from(ExecutionClaim))
            if decisions != len(real) or claims != len(real):
                violations.append(f"{decisions} decisions and {claims} execution claims, expected {len(real)}")
            audited = (await db.execute(select(AuditEntry.session_id, AuditEntry.kind, AuditEntry.session_seq))).all()
            odd_entries = {(s, kind, seq) for s, kind, seq in audited if s not in real and (
                kind not in ("response.rejected", "message.rejected", "execution.refused") or seq is not None)}
            if odd_entries:
                violations.append(f"the garbage's sessions got audit entries other than refusals {sorted(odd_entries)[:10]}")
            outbox = (await db.execute(select(OutboxRow.session_id, OutboxRow.message_type).distinct())).all()
            odd = {(s, t) for s, t in outbox if s not in real and t not in ("message.rejected", "operator.alerted")}
            if odd:
                violations.append(f"the garbage's sessions got outbox rows {sorted(odd)[:10]}")
            unsent = await db.scalar(select(func.count()).select_from(OutboxRow).where(OutboxRow.sent_at.is_(None)))
            if unsent:
                violations.append(f"{unsent} outbox row(s) never sent")
        if len(self.sink.requests) != len(real):
            violations.append(f"the sink got {len(self.sink.requests)} requests, expected one per real session "
                              f"({len(real)})")
        if violations:
            raise AssertionError(f"{len(violations)} violation(s):\n  " + "\n  ".join(violations) + "\n" + self.logs())

    def logs(self, lines: int = 12) -> str:
        """The services' log lines that say a handler failed, for a failure's message."""
        pattern = re.compile(r"Traceback|will be redelivered|last delivery|copy failed|ERROR")
        said = []
        for name in self.deployment.processes:
            path: Path = self.deployment.log_path(name)
            if path.exists():
                found = [line for line in path.read_text(errors="replace").splitlines()
                         if pattern.search(line) and "refused to run" not in line]
                said += [f"{name}: {line[:300]}" for line in found[-lines:]]
        return "service log lines:\n    " + "\n    ".join(said) if said else "(no failures in the service logs)"

    def failures_in_logs(self) -> dict[str, int]:
        """How many times each service logged a handler failure (a redelivery, a parked copy that failed)."""
        pattern = re.compile(r"will be redelivered|failed on its last delivery|copy failed|Traceback")
        counts = {}
        for name in self.deployment.processes:
            path = self.deployment.log_path(name)
            if path.exists():
                n = sum(1 for line in path.read_text(errors="replace").splitlines() if pattern.search(line))
                if n:
                    counts[name] = n
        return counts


def message_count(default: int) -> int:
    return int(os.environ.get("SIGNOFF_FUZZ_MESSAGES") or default)
