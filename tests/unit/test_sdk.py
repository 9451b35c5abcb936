"""The SDK (signoff/): its models agree with the gateway's OpenAPI document, and the
client's own rules (a retried decision keeps its Idempotency-Key, the event stream
resumes after the last event it yielded, logins are sent again when a session ends)
hold against a fake gateway (httpx.MockTransport); the real one is in
tests/integration/test_sdk_examples.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from shared.settings import PROJECT_ROOT
from signoff import Client, Refused
from signoff.client import EventParser
from signoff.models import SCHEMAS as CLIENT_SCHEMAS
from signoff.models import ProblemDocument
from signoff_sdk.models import SCHEMAS as INTAKE_SCHEMAS

# The full client's models (signoff/) and the slim SDK's for the intake (sdk/signoff_sdk/).
SCHEMAS = {**CLIENT_SCHEMAS, **INTAKE_SCHEMAS}
DOCUMENT = json.loads((PROJECT_ROOT / "docs" / "openapi.json").read_text())
IGNORED = {"title", "description", "default", "examples"}


def normalized(schema: Any) -> Any:
    """A schema's shape: its types, formats, enums and references, without the prose."""
    if isinstance(schema, dict):
        return {key: normalized(value) for key, value in schema.items() if key not in IGNORED}
    if isinstance(schema, list):
        return [normalized(value) for value in schema]
    return schema


def fields(schema: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    return {name: normalized(field) for name, field in schema["properties"].items()}, set(schema.get("required", []))


def answered_schemas() -> set[str]:
    """The named schemas a successful answer of any path holds, and those they hold."""
    names: set[str] = set()

    def walk(schema: Any) -> None:
        if isinstance(schema, dict):
            ref = schema.get("$ref")
            if ref and ref.rsplit("/", 1)[-1] not in names:
                names.add(ref.rsplit("/", 1)[-1])
                walk(DOCUMENT["components"]["schemas"][ref.rsplit("/", 1)[-1]])
            for value in schema.values():
                walk(value)
        elif isinstance(schema, list):
            for value in schema:
                walk(value)

    for operations in DOCUMENT["paths"].values():
        for operation in operations.values():
            for status, response in operation["responses"].items():
                if status.startswith("2"):
                    walk(response.get("content", {}))
    return names


def sdk_schema(model) -> dict[str, Any]:
    return model.model_json_schema(ref_template="#/components/schemas/{model}", mode="serialization")


def test_every_answer_of_the_gateway_has_an_sdk_model():
    assert answered_schemas() == set(SCHEMAS) - {"ProblemDocument"}


@pytest.mark.parametrize("name", sorted(set(SCHEMAS) - {"ProblemDocument"}))
def test_each_sdk_model_has_the_field_names_and_types_of_its_openapi_schema(name):
    assert fields(sdk_schema(SCHEMAS[name])) == fields(DOCUMENT["components"]["schemas"][name])


def test_the_sdk_problem_document_is_the_one_every_error_answer_holds():
    expected = fields(sdk_schema(ProblemDocument))
    seen = 0
    for operations in DOCUMENT["paths"].values():
        for operation in operations.values():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    assert fields(response["content"]["application/problem+json"]["schema"]) == expected
                    seen += 1
    assert seen > 20


# --- the client against a fake gateway ----------------------------------------------------

CARD = {
    "id": "req_1", "session_id": "ses_1", "status": "pending", "tool": "refund", "label": "Refund",
    "description": "", "effect": "outward", "target": "payments", "arguments": {"amount": 20}, "hidden": [],
    "args_digest": "hmac-sha256:ab", "created_at": "2026-12-01T00:00:00+00:00", "expires_at": None,
    "approvers": None, "approvals": 0, "approvals_required": 1, "starter_may_approve": True,
}
VERDICT = {"response_id": "rsp_1", "request_id": "req_1", "decision": "approve", "responder": "alice",
           "outcome": "accepted", "decided": True}


class FakeGateway:
    """Logs in alice, then answers as `script` says; records every request."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.seen: list[httpx.Request] = []
        self.logins = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/login":
            self.logins += 1
            me = {"principal": "alice", "operator": False, "groups": [], "csrf_token": f"csrf{self.logins}",
                  "expires_at": 0.0}
            return httpx.Response(200, json=me, headers={"set-cookie": f"signoff_session=c{self.logins}; Secure"})
        self.seen.append(request)
        assert self.answers, f"a request the test did not expect: {request.method} {request.url}"
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def client(self, **kwargs) -> Client:
        return Client("http://gateway.test", "alice", "pw", transport=httpx.MockTransport(self), **kwargs)


def test_a_decision_whose_answer_was_lost_is_sent_again_with_the_same_idempotency_key():
    fake = FakeGateway(httpx.ReadError("connection reset"), httpx.Response(503), httpx.Response(200, json=VERDICT))
    with fake.client() as client:
        verdict = client.approve(client_card())
    assert verdict.decided and verdict.responder == "alice"
    keys = {request.headers["idempotency-key"] for request in fake.seen}
    assert len(fake.seen) == 3 and len(keys) == 1
    for request in fake.seen:
        assert request.headers["x-csrf-token"] == "csrf1" and request.headers["cookie"] == "signoff_session=c1"
        # The digest of the card read: the ledger refuses the approval of other arguments.
        assert json.loads(request.content) == {"decision": "approve", "reason": "", "message": "",
                                               "args_digest": "hmac-sha256:ab"}


def client_card():
    from signoff.models import Card

    return Card.model_validate(CARD)


def test_each_decision_call_has_its_own_key_unless_one_is_given():
    fake = FakeGateway(*(httpx.Response(200, json=VERDICT) for _ in range(3)))
    with fake.client() as client:
        client.approve("req_1")
        client.approve("req_1")
        client.approve("req_1", idempotency_key="mine")
    first, second, third = (request.headers["idempotency-key"] for request in fake.seen)
    assert first != second and third == "mine"


def test_a_decision_answered_202_is_polled_until_the_ledger_decides():
    pending = {"response_id": "rsp_1", "request_id": "req_1", "status": "pending",
               "links": {"poll": "/v1/requests/req_1/decision/rsp_1"}}
    fake = FakeGateway(httpx.Response(202, json=pending), httpx.Response(202, json=pending),
                       httpx.Response(200, json=VERDICT))
    with fake.client() as client:
        assert client.approve("req_1").outcome == "accepted"
    assert [(r.method, r.url.path) for r in fake.seen] == [("POST", "/v1/requests/req_1/decision")] + [
        ("GET", "/v1/requests/req_1/decision/rsp_1")] * 2


def test_a_refusal_raises_with_the_ledgers_reason_code_and_is_not_sent_again():
    refused = {"type": "urn:signoff:problem:not-an-approver", "title": "Refused by the ledger", "status": 403,
               "reason_code": "not_an_approver", "detail": "mallory may not approve"}
    fake = FakeGateway(httpx.Response(403, json=refused, headers={"content-type": "application/problem+json"}))
    with fake.client() as client, pytest.raises(Refused) as raised:
        client.approve("req_1")
    assert raised.value.reason_code == "not_an_approver" and raised.value.kind == "not-an-approver"
    assert len(fake.seen) == 1


def test_starting_a_session_is_never_sent_twice():
    fake = FakeGateway(httpx.ReadError("connection reset"))
    with fake.client() as client, pytest.raises(httpx.ReadError):
        client.start_session("go")
    assert len(fake.seen) == 1


def test_an_ended_session_logs_in_again_once_and_the_request_is_sent_with_the_new_login():
    ended = httpx.Response(401, json={"type": "urn:signoff:problem:unauthenticated", "title": "Log in", "status": 401})
    fake = FakeGateway(ended, httpx.Response(200, json={"requests": [CARD]}))
    with fake.client() as client:
        [card] = client.pending(tool="refund")
    assert card.arguments == {"amount": 20} and fake.logins == 2
    assert fake.seen[1].headers["cookie"] == "signoff_session=c2"
    assert dict(fake.seen[1].url.params) == {"status": "pending", "tool": "refund", "limit": "100"}


def test_an_id_that_is_not_an_id_never_becomes_another_path():
    with FakeGateway().client() as client, pytest.raises(ValueError):
        client.session("../requests")


def sse(*events: tuple[str, str, dict]) -> bytes:
    text = ": ping\r\n\r\n"
    for event_id, kind, data in events:
        text += f"id: {event_id}\r\nevent: {kind}\r\ndata: {json.dumps(data)}\r\n\r\n"
    return text.encode()


def test_the_event_stream_reconnects_and_resumes_after_the_last_event_it_yielded():
    fake = FakeGateway(
        httpx.Response(200, content=sse(("1.1", "approval.requested", {"session_id": "s", "request_id": "r"}),
                                        ("1.2", "approval.decided", {"session_id": "s"}))),
        httpx.ConnectError("gateway gone"),
        httpx.Response(503),
        httpx.Response(200, content=sse(("2.5", "turn.completed", {"session_id": "s"}))),
    )
    with fake.client() as client:
        events = client.events(since="0.9")
        seen = [next(events) for _ in range(3)]
        events.close()
    assert [(e.id, e.type) for e in seen] == [("1.1", "approval.requested"), ("1.2", "approval.decided"),
                                             ("2.5", "turn.completed")]
    assert seen[0].request_id == "r" and seen[2].session_id == "s"
    assert [r.headers.get("last-event-id") for r in fake.seen] == ["0.9", "1.2", "1.2", "1.2"]


def test_the_event_parser_ignores_heartbeats_and_joins_data_lines():
    parser = EventParser()
    lines = [": ping - 2026-12-01", "", "id: 3.4", "event: turn.failed", 'data: {"a":', "data: 1}", ""]
    events = [event for line in lines if (event := parser.feed(line)) is not None]
    assert [(e.id, e.type, e.data) for e in events] == [("3.4", "turn.failed", {"a": 1})]


def test_an_approval_of_a_card_names_the_digest_of_that_card_and_an_explicit_digest_wins():
    fake = FakeGateway(*(httpx.Response(200, json=VERDICT) for _ in range(3)))
    with fake.client() as client:
        client.approve(client_card())
        client.approve(client_card(), args_digest="hmac-sha256:cd")
        client.approve("req_1")
    digests = [json.loads(request.content).get("args_digest") for request in fake.seen]
    # By id alone: the gateway fills in the request's digest as the ledger holds it.
    assert digests == ["hmac-sha256:ab", "hmac-sha256:cd", None]


def bot_rule():
    import importlib.util

    spec = importlib.util.spec_from_file_location("approval_bot", PROJECT_ROOT / "examples" / "approval_bot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.allowed


@pytest.mark.parametrize(("changes", "allowed"), [
    ({}, True),
    ({"arguments": {"amount": 100, "customer": "c"}}, True),
    ({"arguments": {"amount": 100.01, "customer": "c"}}, False),
    ({"tool": "refund_all"}, False),
    ({"status": "approved"}, False),
    # What it cannot see or compare is left for a person.
    ({"arguments": {"amount": "[hidden]"}, "hidden": ["amount"]}, False),
    ({"arguments": {"amount": 5}, "hidden": ["amount"]}, False),
    ({"arguments": {"amount": True}}, False),
    ({"arguments": {"amount": "5"}}, False),
    ({"arguments": {"customer": "c"}}, False),
])
def test_the_example_bot_approves_only_its_tool_within_every_limit_and_never_what_the_card_hides(changes, allowed):
    from signoff.models import Card

    card = Card.model_validate({**CARD, **changes})
    assert bot_rule()(card, "refund", {"amount": 100.0}) is allowed


def test_the_channel_adapters_token_responder_is_the_one_the_ledger_records():
    from services.approval_ledger.domain import TOKEN_RESPONDER_PREFIX, token_responder
    from signoff import channel

    assert channel.TOKEN_RESPONDER_PREFIX == TOKEN_RESPONDER_PREFIX
    assert token_responder("inbox") == channel.TOKEN_RESPONDER_PREFIX + "inbox"
