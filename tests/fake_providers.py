"""Loopback model providers as strict as the real ones, for the tests.

Two servers, each a thread on 127.0.0.1 and a free port:

- `FakeOpenAI` speaks chat completions (POST /v1/chat/completions). With
  `renumber=True` it behaves like self-hosted servers that number tool-call
  ids per response: `Bash_0`, `Bash_1`, ... from 0 again on every response.
- `FakeAnthropic` speaks Messages (POST /v1/messages).

Both answer HTTP 400, with the real providers' wording, to a request that
carries a tool call without its result right after it, a result that answers
no call there, or two calls with the same id (results would be ambiguous). The
Anthropic one also insists on alternating roles and tool results first.

Replies come from a script, like the scripted provider: a request whose
transcript holds n assistant messages gets the n-th reply, so a retried
request gets the same reply. `fail_next(n, status)` makes the next n requests
fail with that status (429 carries `Retry-After: 0`). `answer_next(*bodies)`
makes the next requests succeed (HTTP 200) with these bodies, one each, whatever
their shape: garbage a provider might send. Every request, the status answered
and the usage reported are kept for the test to check.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeReply:
    text: str = ""
    # (tool name, arguments) per call.
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


class BadRequest(Exception):
    pass


class FakeProvider:
    path = "/"

    def __init__(self, script: list[FakeReply], *, api_key: str | None = None) -> None:
        self.script = list(script)
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.usages: list[dict[str, int]] = []
        self._failures: list[tuple[int, str | None]] = []
        self._bodies: list[Any] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, payload, headers = fake._answer(self.path, {k.lower(): v for k, v in self.headers.items()}, raw)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fail_next(self, n: int, status: int = 429, message: str | None = None) -> None:
        """The next n requests fail with `status`; `message`: what the error body says
        (e.g. one that quotes the key it was sent, as some providers' errors do)."""
        with self._lock:
            self._failures.extend([(status, message)] * n)

    def answer_next(self, *bodies: Any) -> None:
        with self._lock:
            self._bodies.extend(bodies)

    @property
    def bad_requests(self) -> list[int]:
        return [s for s in self.statuses if s == 400]

    # --- one request ----------------------------------------------------------

    def _answer(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, Any, dict[str, str]]:
        with self._lock:
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                body = None
            self.requests.append({"path": path, "headers": headers, "body": body})
            status, payload, extra = self._decide(path, headers, body)
            self.statuses.append(status)
            return status, payload, extra

    def _decide(self, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any, dict[str, str]]:
        if path != self.path:
            return 404, self.error("not_found", f"no route {path}"), {}
        if self._failures:
            status, message = self._failures.pop(0)
            extra = {"Retry-After": "0"} if status == 429 else {}
            kind = "rate_limit_error" if status == 429 else "api_error"
            return status, self.error(kind, message or f"injected {status}"), extra
        if not self.authorized(headers):
            return 401, self.error("authentication_error", "invalid api key"), {}
        if self._bodies:
            return 200, self._bodies.pop(0), {}
        if not isinstance(body, dict):
            return 400, self.error("invalid_request_error", "body is not a JSON object"), {}
        try:
            self.check(body, headers)
        except BadRequest as problem:
            return 400, self.error("invalid_request_error", str(problem)), {}
        except (AttributeError, KeyError, TypeError) as problem:  # a shape the checks did not expect
            return 400, self.error("invalid_request_error", f"malformed request: {problem!r}"), {}
        assistants = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        reply = self.script[assistants] if assistants < len(self.script) else FakeReply("(the fake has no more replies)")
        usage = {"input": 10 * len(body["messages"]) + 3, "output": 2 + len(reply.text) // 4 + 7 * len(reply.tool_calls)}
        self.usages.append(usage)
        return 200, self.render(reply, body, usage), {}

    # --- per protocol -----------------------------------------------------------

    def authorized(self, headers: dict[str, str]) -> bool:
        raise NotImplementedError

    def check(self, body: dict, headers: dict[str, str]) -> None:
        raise NotImplementedError

    def render(self, reply: FakeReply, body: dict, usage: dict[str, int]) -> dict:
        raise NotImplementedError

    def error(self, kind: str, message: str) -> dict:
        raise NotImplementedError


class FakeOpenAI(FakeProvider):
    path = "/v1/chat/completions"

    def __init__(self, script: list[FakeReply], *, api_key: str | None = None, renumber: bool = False) -> None:
        super().__init__(script, api_key=api_key)
        self.renumber = renumber

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def authorized(self, headers: dict[str, str]) -> bool:
        return self.api_key is None or headers.get("authorization") == f"Bearer {self.api_key}"

    def error(self, kind: str, message: str) -> dict:
        return {"error": {"message": message, "type": kind}}

    def check(self, body: dict, headers: dict[str, str]) -> None:
        if not body.get("model"):
            raise BadRequest("you must provide a model parameter")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array")
        for tool in body.get("tools", []):
            if tool.get("type") != "function" or not tool.get("function", {}).get("name"):
                raise BadRequest("tools must be functions with a name")
        seen: set[str] = set()
        open_ids: set[str] = set()
        for index, message in enumerate(messages):
            role = message.get("role")
            if role not in ("system", "user", "assistant", "tool"):
                raise BadRequest(f"messages[{index}].role: invalid value {role!r}")
            if role == "tool":
                call_id = message.get("tool_call_id")
                if call_id not in open_ids:
                    raise BadRequest("Invalid parameter: messages with role 'tool' must be a response to a "
                                     f"preceding message with 'tool_calls' (messages[{index}], id {call_id!r}).")
                open_ids.discard(call_id)
                continue
            if open_ids:
                raise BadRequest("An assistant message with 'tool_calls' must be followed by tool messages "
                                 "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                                 f"response messages: {', '.join(sorted(open_ids))}")
            calls = (message.get("tool_calls") or []) if role == "assistant" else []
            for call in calls:
                call_id = call.get("id")
                if not call_id or call.get("type") != "function":
                    raise BadRequest(f"messages[{index}].tool_calls: each call needs an id and type 'function'")
                if call_id in seen:
                    raise BadRequest(f"Duplicate tool call id {call_id!r} in messages[{index}]")
                try:
                    json.loads(call["function"]["arguments"])
                except (KeyError, TypeError, ValueError):
                    raise BadRequest(f"messages[{index}].tool_calls: function.arguments must be a JSON string") from None
                seen.add(call_id)
                open_ids.add(call_id)
        if open_ids:
            raise BadRequest("An assistant message with 'tool_calls' must be followed by tool messages responding "
                             f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                             f"{', '.join(sorted(open_ids))}")

    def render(self, reply: FakeReply, body: dict, usage: dict[str, int]) -> dict:
        calls = [
            {
                "id": f"Bash_{i}" if self.renumber else f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            for i, (name, arguments) in enumerate(reply.tool_calls)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": usage["input"], "completion_tokens": usage["output"],
                      "total_tokens": usage["input"] + usage["output"]},
        }


class FakeAnthropic(FakeProvider):
    path = "/v1/messages"

    @property
    def base_url(self) -> str:
        return self.url

    def authorized(self, headers: dict[str, str]) -> bool:
        return self.api_key is None or headers.get("x-api-key") == self.api_key

    def error(self, kind: str, message: str) -> dict:
        return {"type": "error", "error": {"type": kind, "message": message}}

    def check(self, body: dict, headers: dict[str, str]) -> None:
        if not headers.get("anthropic-version"):
            raise BadRequest("anthropic-version: header is required")
        if not body.get("model") or not isinstance(body.get("max_tokens"), int):
            raise BadRequest("model and max_tokens are required")
        for tool in body.get("tools", []):
            if not tool.get("name") or tool.get("input_schema", {}).get("type") != "object":
                raise BadRequest("tools: each needs a name and an input_schema of type object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: at least one message is required")
        seen: set[str] = set()
        expected: set[str] = set()  # tool_use ids the next message must answer
        for index, message in enumerate(messages):
            role, content = message.get("role"), message.get("content")
            if role != ("user" if index % 2 == 0 else "assistant"):
                raise BadRequest(f"messages.{index}: roles must alternate between 'user' and 'assistant', "
                                 "starting with 'user'")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            if not blocks:
                raise BadRequest(f"messages.{index}: all messages must have non-empty content")
            results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
            if any(b.get("type") == "text" and not b.get("text") for b in blocks):
                raise BadRequest(f"messages.{index}: text content blocks must be non-empty")
            if results and any(b.get("type") != "tool_result" for b in blocks[:len(results)]):
                raise BadRequest(f"messages.{index}: tool_result blocks must come before any other content")
            unexpected = [r for r in results if r not in expected]
            if unexpected:
                raise BadRequest(f"messages.{index}.content: unexpected `tool_use_id` found in `tool_result` "
                                 f"blocks: {', '.join(map(str, unexpected))}. Each `tool_result` block must have a "
                                 "corresponding `tool_use` block in the previous message.")
            missing = expected - set(results)
            if missing:
                raise BadRequest(f"messages.{index - 1}: `tool_use` ids were found without `tool_result` blocks "
                                 f"immediately after: {', '.join(sorted(missing))}. Each `tool_use` block must have "
                                 "a corresponding `tool_result` block in the next message.")
            expected = set()
            for block in blocks if role == "assistant" else []:
                if block.get("type") == "tool_use":
                    if block.get("id") in seen:
                        raise BadRequest(f"messages.{index}: `tool_use` ids must be unique")
                    seen.add(block["id"])
                    expected.add(block["id"])
        if expected:
            raise BadRequest(f"messages.{len(messages) - 1}: `tool_use` ids were found without `tool_result` "
                             f"blocks immediately after: {', '.join(sorted(expected))}.")

    def render(self, reply: FakeReply, body: dict, usage: dict[str, int]) -> dict:
        content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
        content += [{"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": name, "input": arguments}
                    for name, arguments in reply.tool_calls]
        return {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
            "usage": {"input_tokens": usage["input"], "output_tokens": usage["output"]},
        }
