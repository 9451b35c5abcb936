"""Log lines (shared/logs.py): JSON a machine can read, naming the service and the
message a line concerns; text for a person at a terminal; no secret in either."""

import asyncio
import io
import json
import logging
import sys

import pytest
from pydantic import ValidationError

from shared import logs
from shared.messages import StartTurn
from shared.redaction import REDACTED
from shared.settings import Settings


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def output():
    """The root logger writing to a string for the test, restored after it."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    yield stream
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logs.handling.set(None)


def lines(stream):
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_names_the_service_level_logger_pid_and_time(output):
    logs.configure("approval-ledger", "auto", stream=output)
    logging.getLogger("signoff").info("approval-ledger ready (namespace %s)", "n1")
    [line] = lines(output)
    assert line["service"] == "approval-ledger" and line["level"] == "INFO" and line["logger"] == "signoff"
    assert line["message"] == "approval-ledger ready (namespace n1)"
    assert isinstance(line["pid"], int) and line["time"].endswith("+00:00")
    assert "message_id" not in line, "a line about no message names none"


def test_every_line_logged_while_a_message_is_handled_names_it_even_from_tasks_and_threads(output):
    logs.configure("model-step", "json", stream=output)
    message = StartTurn(session_id="ses_1", text="hi", causation_id="msg_cause")
    log = logging.getLogger("signoff.test")

    async def started():
        log.info("in a task it started")

    async def handle():
        logs.concerning(message)
        log.info("in the handler")
        await asyncio.create_task(started())
        await asyncio.to_thread(log.info, "in a thread it started")

    async def elsewhere():
        log.info("in another task")

    async def main():
        await asyncio.create_task(handle())
        await asyncio.create_task(elsewhere())

    asyncio.run(main())
    *about, other = lines(output)
    assert [line["message"] for line in about] == ["in the handler", "in a task it started", "in a thread it started"]
    for line in about:
        assert (line["message_type"], line["message_id"], line["session_id"], line["causation_id"]) == (
            "turn.start", message.message_id, "ses_1", "msg_cause")
    assert "message_id" not in other and "session_id" not in other


def test_a_message_that_could_not_be_read_is_named_by_what_it_says_it_is(output):
    logs.configure("approval-ledger", "json", stream=output)
    logs.concerning_raw("msg_bad", b'{"type": "approval.respond", "session_id": "ses_2", "request_id": 5}')
    logging.getLogger("signoff").warning("dead-lettering msg_bad: invalid")
    logs.concerning_raw("msg_worse", b'{"session_id": {"not": "a string"}')
    logging.getLogger("signoff").warning("dead-lettering msg_worse: invalid")
    first, second = lines(output)
    assert (first["message_id"], first["session_id"], first["message_type"]) == ("msg_bad", "ses_2", "approval.respond")
    assert second["message_id"] == "msg_worse" and "session_id" not in second


def test_extra_fields_are_logged_and_a_lines_own_message_id_wins_over_the_context(output):
    logs.configure("publisher", "json", stream=output)
    logs.concerning(message_id="msg_context")
    logging.getLogger("signoff").info("relayed", extra={"message_id": "msg_own", "rows": 3})
    [line] = lines(output)
    assert line["message_id"] == "msg_own" and line["rows"] == 3


def test_an_exception_is_logged_with_its_traceback_inside_the_json_line(output):
    logs.configure("tool-executor", "json", stream=output)
    try:
        raise RuntimeError("the tool broke")
    except RuntimeError:
        logging.getLogger("signoff").exception("call c1 failed")
    [line] = lines(output)
    assert line["level"] == "ERROR" and line["message"] == "call c1 failed"
    assert line["exception"].startswith("Traceback") and "RuntimeError: the tool broke" in line["exception"]
    assert len(output.getvalue().splitlines()) == 1, "a traceback stays on its line"


def test_a_password_in_a_url_is_masked_in_the_message_and_the_traceback(output):
    logs.configure("publisher", "json", stream=output)
    try:
        raise ConnectionError("cannot reach amqp://signoff.publisher:s3cret@rabbit:5672/")
    except ConnectionError as error:
        logging.getLogger("signoff").exception("lost postgresql://role:hunter2@db/signoff (%s)", error)
    text = output.getvalue()
    assert "s3cret" not in text and "hunter2" not in text
    [line] = lines(output)
    assert f"postgresql://{REDACTED}@db/signoff" in line["message"] and f"amqp://{REDACTED}@rabbit" in line["exception"]


def test_a_terminal_gets_text_lines_with_the_message_in_brackets(output):
    terminal = Terminal()
    logs.configure("model-step", "auto", stream=terminal)
    logs.concerning(StartTurn(session_id="ses_3", text="hi"))
    logging.getLogger("signoff").info("model-step ready")
    text = terminal.getvalue()
    assert " model-step[" in text and "INFO signoff: model-step ready [message_type=turn.start message_id=msg_" in text
    assert "session_id=ses_3]" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_the_format_can_be_forced_either_way():
    assert isinstance(logs.formatter("x", "json", Terminal()), logs.JSONLines)
    assert isinstance(logs.formatter("x", "text", io.StringIO()), logs.Text)
    assert isinstance(logs.formatter("x", "auto", io.StringIO()), logs.JSONLines)
    assert Settings(log_format="text").log_format == "text"
    with pytest.raises(ValidationError):
        Settings(log_format="xml")


def test_libraries_that_bring_their_own_handler_log_through_ours(output):
    faststream = logging.getLogger("faststream")
    faststream.addHandler(logging.StreamHandler(sys.stdout))
    faststream.propagate = False
    logs.configure("approval-ledger", "json", stream=output)
    faststream.warning("connection lost")
    [line] = lines(output)
    assert line["logger"] == "faststream" and line["service"] == "approval-ledger"


def test_the_http_clients_request_lines_which_quote_urls_with_secrets_are_not_logged(output):
    logs.configure("tool-executor", "json", stream=output)
    logging.getLogger("httpx").info("HTTP Request: POST https://api.example/hook?token=resolved-secret")
    logging.getLogger("httpx").warning("a warning still is")
    assert [line["message"] for line in lines(output)] == ["a warning still is"]


def test_single_loggers_can_be_quieted_and_a_malformed_level_list_is_refused(output, monkeypatch):
    monkeypatch.setenv("SIGNOFF_LOG_LEVELS", "signoff.ledger=WARNING, signoff.model_step=warning")
    quiet, loud = logging.getLogger("signoff.ledger"), logging.getLogger("signoff")
    try:
        logs.configure("approval-ledger", "json", stream=output)
        quiet.info("applied turn.start")
        loud.info("approval-ledger ready")
        quiet.warning("a warning still shows")
    finally:
        quiet.setLevel(logging.NOTSET)
        logging.getLogger("signoff.model_step").setLevel(logging.NOTSET)
    assert [line["message"] for line in lines(output)] == ["approval-ledger ready", "a warning still shows"]
    with pytest.raises(ValueError, match="LOGGER=LEVEL"):
        logs.logger_levels("signoff.ledger=LOUD")
