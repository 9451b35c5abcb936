"""The executor's http tools (services/tool_executor/tools.py) make the request the
card shows (`http_request`, one function for both) and say why a call failed without
its secrets: no URL with `${env:…}` filled in, no raw answer of the target."""

from pathlib import Path

import httpx
import pytest

from services.tool_executor.tools import ERROR_CHARS, ToolContext, run_tool
from shared.catalogue import ToolSpec
from shared.redaction import REDACTED

SCHEMA = {"type": "object", "properties": {"to": {"type": "string"}, "key": {"type": "string", "writeOnly": True}}}


def tool(url: str, headers: dict | None = None) -> ToolSpec:
    return ToolSpec.model_validate({"name": "send", "label": "Send", "effect": "idempotent", "parameters": SCHEMA,
                                    "implementation": {"kind": "http", "url": url, "headers": headers or {}}})


def client(answer) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    monkeypatch.setenv("SIGNOFF_TEST_HOST", "https://relay.example.net")
    monkeypatch.setenv("SIGNOFF_TEST_PATH_SECRET", "pathsecret123")
    monkeypatch.setenv("SIGNOFF_TEST_HEADER_SECRET", "headersecret456")


CONTEXT = ToolContext("call_1", "ses_1", "idk_1", 1, Path("."))
URL = "${env:SIGNOFF_TEST_HOST}/bot${env:SIGNOFF_TEST_PATH_SECRET}/send/{to}"
HEADERS = {"X-Relay": "${env:SIGNOFF_TEST_HEADER_SECRET}"}


async def test_the_request_made_is_the_one_the_card_shows_with_the_executors_values_filled_in():
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"ok": True})

    spec = tool(URL, HEADERS)
    arguments = {"to": "ops team", "key": "argsecret789"}
    async with client(answer) as http:
        result = await run_tool(spec, arguments, CONTEXT, http)
    assert result.outcome == "output"
    [request] = sent
    assert str(request.url) == "https://relay.example.net/botpathsecret123/send/ops%20team"
    assert request.headers["X-Relay"] == "headersecret456" and request.headers["Idempotency-Key"] == "idk_1"
    assert request.content == b'{"key":"argsecret789"}'
    assert spec.card(arguments).target == "POST ${env:SIGNOFF_TEST_HOST}/bot${env:SIGNOFF_TEST_PATH_SECRET}/send/ops%20team"


async def test_a_failing_targets_answer_is_reported_without_any_secret_it_repeats_and_cut_short():
    def answer(request: httpx.Request) -> httpx.Response:
        echo = f"refused {request.url} {request.headers['X-Relay']} {request.content.decode()} " + "x" * 5000
        return httpx.Response(500, text=echo)

    async with client(answer) as http:
        result = await run_tool(tool(URL, HEADERS), {"to": "ops", "key": "argsecret789"}, CONTEXT, http)
    assert result.outcome == "error" and len(result.error) <= ERROR_CHARS
    assert result.error.startswith(
        "HTTP 500 from POST ${env:SIGNOFF_TEST_HOST}/bot${env:SIGNOFF_TEST_PATH_SECRET}/send/ops: refused ")
    for secret in ("pathsecret123", "headersecret456", "argsecret789"):
        assert secret not in result.error
    assert REDACTED in result.error


async def test_a_connection_error_names_the_request_as_the_card_does_never_the_filled_in_url():
    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"cannot reach {request.url}", request=request)

    async with client(answer) as http:
        result = await run_tool(tool(URL, HEADERS), {"to": "ops"}, CONTEXT, http)
    assert result.outcome == "error"
    assert "could not connect for POST ${env:SIGNOFF_TEST_HOST}/bot${env:SIGNOFF_TEST_PATH_SECRET}/send/ops" in (
        result.error)
    assert "pathsecret123" not in result.error


async def test_an_unset_variable_fails_the_call_by_name_and_nothing_is_sent(monkeypatch):
    monkeypatch.delenv("SIGNOFF_TEST_HEADER_SECRET")
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200)

    async with client(answer) as http:
        result = await run_tool(tool(URL, HEADERS), {"to": "ops"}, CONTEXT, http)
    assert (result.outcome, result.error) == (
        "error", "the executor cannot make this call: ${env:SIGNOFF_TEST_HEADER_SECRET} is not set in this "
                 "process's environment")
    assert sent == []
