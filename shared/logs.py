"""Log lines: one JSON object per line where a machine reads them (a log file, a
container's stderr), the familiar text line where a person watches a terminal.

Every line names its service. A line logged while a consumer handles a message
also names that message (type, id, session, causation): the consumer sets
`handling` once, at its boundary (shared/consuming.py), and every line logged
below it, in any task or thread started from there, carries it. So an operator
follows one session across the four services' logs with one filter.

Secrets never go into a log line in the first place (docs/design.md, "Trust
boundaries"); as a last guard the formatter masks the password of any URL a
message happens to quote (a driver's error naming the URL it could not reach).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TextIO

from shared.redaction import redact_text

LogFormat = Literal["auto", "json", "text"]

# What the line concerns, in the order a JSON line lists them.
MESSAGE_FIELDS = ("message_type", "message_id", "session_id", "causation_id")

# The message being handled in this task (and the tasks and threads it starts).
handling: ContextVar[Mapping[str, str] | None] = ContextVar("handling", default=None)

# Attributes every LogRecord has: anything else on a record came from `extra=` and is logged as a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class AboutAMessage(Protocol):
    type: str
    message_id: str
    session_id: str
    causation_id: str | None


def concerning(message: AboutAMessage | None = None, *, message_id: str | None = None) -> None:
    """From now on (in this task), log lines concern this message; only an id when
    the message could not be read (too large, invalid)."""
    if message is None:
        handling.set({"message_id": message_id} if message_id else None)
        return
    about = {
        "message_type": message.type,
        "message_id": message.message_id,
        "session_id": message.session_id,
    }
    if message.causation_id:
        about["causation_id"] = message.causation_id
    handling.set(about)


def concerning_raw(message_id: str | None, body: bytes) -> None:
    """A message known only as bytes (one that failed validation, a hook's event):
    what it says it is, so its lines can still be found by session. Only plain
    strings are taken."""
    about = {"message_id": message_id} if message_id else {}
    try:
        said = json.loads(body)
    except (ValueError, RecursionError):  # a body nested too deep to read is named by its id alone
        said = None
    if isinstance(said, dict):
        for field, key in (("type", "message_type"), ("session_id", "session_id"), ("causation_id", "causation_id")):
            value = said.get(field)
            if isinstance(value, str) and len(value) <= 200:
                about[key] = value
    handling.set(about or None)


def mask_secrets(text: str) -> str:
    """Every line, tracebacks included, without a known secret or a credential's shape."""
    return redact_text(text)


class MessageContext(logging.Filter):
    """Copies the message being handled onto each record, when it is emitted (in the
    emitting task), unless the call gave its own (`extra={"message_id": ...}`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        about = handling.get()
        if about:
            for key, value in about.items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        return True


class JSONLines(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, service, pid, logger,
    message, the message fields, any `extra=` fields, and the exception's traceback."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self.service,
            "pid": record.process,
            "logger": record.name,
            "message": mask_secrets(record.getMessage()),
        }
        for key in MESSAGE_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                line[key] = value
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in line and not key.startswith("_"):
                line[key] = mask_secrets(value) if isinstance(value, str) else value
        if record.exc_info:
            line["exception"] = mask_secrets(self.formatException(record.exc_info))
        elif record.exc_text:
            line["exception"] = mask_secrets(record.exc_text)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class Text(logging.Formatter):
    """The line a person reads: time, service[pid], level, logger, message, then the
    message it concerns in brackets."""

    def __init__(self, service: str) -> None:
        super().__init__(f"%(asctime)s {service}[%(process)d] %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = mask_secrets(super().formatMessage(record))
        about = [f"{key}={getattr(record, key)}" for key in MESSAGE_FIELDS if getattr(record, key, None)]
        return f"{text} [{' '.join(about)}]" if about else text

    def formatException(self, ei: Any) -> str:
        return mask_secrets(super().formatException(ei))


def formatter(service: str, log_format: LogFormat, stream: TextIO) -> logging.Formatter:
    """JSON unless asked for text, or (auto) unless the stream is a terminal."""
    if log_format == "auto":
        log_format = "text" if _is_terminal(stream) else "json"
    return Text(service) if log_format == "text" else JSONLines(service)


def logger_levels(spec: str) -> dict[str, str]:
    """`signoff.ledger=WARNING,signoff.model_step=WARNING`: quiet (or open up) one part of a
    service without changing the rest; a malformed entry is an error at start, not a silent no-op."""
    levels: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, _, level = entry.partition("=")
        level = level.strip().upper()
        if not name.strip() or level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"SIGNOFF_LOG_LEVELS: {entry!r} is not LOGGER=LEVEL (DEBUG, INFO, WARNING, ERROR)")
        levels[name.strip()] = level
    return levels


def configure(service: str, log_format: LogFormat = "auto", *, stream: TextIO | None = None) -> None:
    """Every log line of this process, ours and the libraries', through one handler."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(service, log_format, stream))
    handler.addFilter(MessageContext())
    # force: a forked service child must not keep its parent's handler.
    logging.basicConfig(level=os.environ.get("SIGNOFF_LOG_LEVEL", "INFO").upper(), handlers=[handler], force=True)
    for name, level in logger_levels(os.environ.get("SIGNOFF_LOG_LEVELS", "")).items():
        logging.getLogger(name).setLevel(level)
    # FastStream gives its loggers handlers of their own that print plain text: route them through ours.
    for name in ("faststream",):
        library = logging.getLogger(name)
        library.handlers.clear()
        library.propagate = True
    # httpx logs each request's URL at INFO, and a tool's or a hook's URL may carry a
    # secret resolved from `${env:NAME}` (shared/catalogue.py): only its warnings.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)


def configured() -> bool:
    """Whether this process's lines go through `configure`'s handler (a service, once started)."""
    return any(isinstance(h.formatter, JSONLines | Text) for h in logging.getLogger().handlers)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
