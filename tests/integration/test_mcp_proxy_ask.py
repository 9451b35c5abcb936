"""`ask` calls of `signoff mcp-proxy` filed through the intake, against the real services:
the `mcp` SDK's own client calls the proxy, a person decides on the gateway, Signoff's
tool-executor calls the real upstream (tests/fixtures/mcp_files_server.py, counting its
runs) once, and a client's retry of the same call (across SIGKILLs of the proxy) finds
the same request and gets the one recorded result."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from services.gateway import programs
from services.mcp_proxy.config import call_id_for
from shared.ledger.tables import ApprovalRequest, Closure, FiledCall, OutboxRow
from shared.messages import filed_session_id
from tests.gateway_client import GatewayClient
from tests.harness import eventually, free_port, rows
from tests.integration.test_gateway import add_people, pending_card, url
from tests.integration.test_mcp_proxy import FILES_SERVER, ROOT, _count, _kind, _running, _text

ORIGIN = "mcp:desktop"
PROGRAM = "desktop-proxy"


def _mcp_tool(name: str, label: str, parameters: dict[str, object]) -> dict[str, object]:
    """A catalogue tool that is the fixture server's tool of that name, run by the executor."""
    return {
        "name": name,
        "label": label,
        "approval": "always",
        "effect": "outward",
        "approvers": ["alice"],
        "parameters": parameters,
        "implementation": {
            "kind": "mcp",
            "tool": name,
            # Its starts are counted apart from the proxy's own upstream's.
            "server": {
                "command": [sys.executable, str(FILES_SERVER), "--started-as", "executor"],
                "env": ["MCP_COUNT_DIR"],
            },
        },
    }


def ask_tools(deployment, counts: Path) -> Path:
    """The tests' catalogue with `delete_file` (and `crash`, whose server exits mid-call)
    as MCP tools the executor runs, and the proxy's origin."""
    catalogue = yaml.safe_load(deployment.tools_file.read_text())
    path_only = {"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}}}
    catalogue["tools"].append(_mcp_tool("delete_file", "Delete a file", path_only))
    catalogue["tools"].append(_mcp_tool("crash", "Crash the server", {"type": "object", "properties": {}}))
    catalogue["origins"] = {
        ORIGIN: {
            "programs": [f"bot:{PROGRAM}"],
            "tools": ["delete_file", "crash"],
            "unknown_tools": {"approvers": ["alice"]},
        }
    }
    path = deployment.data_dir.parent / "tools-with-mcp.yaml"
    path.write_text(yaml.safe_dump(catalogue))
    return path


class Ask:
    """The services, a gateway, the proxy's token, and its configuration."""

    def __init__(self, deployment, tmp_path: Path, executor_faults: str = "", **settings: str) -> None:
        self.deployment = deployment
        deployment.extra_env.update(settings)
        self.counts = tmp_path / "counts"
        self.counts.mkdir()
        deployment.extra_env["MCP_COUNT_DIR"] = str(self.counts)
        deployment.tools_file = ask_tools(deployment, self.counts)
        add_people(deployment)
        if executor_faults:
            deployment.start_with_fault("tool-executor", executor_faults)
        else:
            deployment.start()
        deployment.start("gateway")
        keys = deployment.data_dir / "keys"
        token, _ = programs.create(keys, keys / "gateway" / "users.yaml", PROGRAM, programs.parse_scopes("calls:file"))
        self.env = {**os.environ, "MCP_COUNT_DIR": str(self.counts), "PROXY_TOKEN": token}
        self.config = tmp_path / "proxy.yaml"
        self.stack = contextlib.ExitStack()

    def write(self, wait_seconds: float, **settings: object) -> None:
        upstream = {
            "command": [sys.executable, str(FILES_SERVER)],
            "env": ["MCP_COUNT_DIR"],
            "tools": {"read_file": "allow", "add_tool": "allow", "delete_file": "ask", "crash": "ask"},
            **settings,
        }
        signoff = {
            "gateway": url(self.deployment),
            "token": "${env:PROXY_TOKEN}",
            "origin": ORIGIN,
            "wait_seconds": wait_seconds,
        }
        self.config.write_text(yaml.safe_dump({"upstreams": {"files": upstream}, "signoff": signoff}))

    def proxy_command(self) -> list[str]:
        return [sys.executable, "-m", "services.operations.cli", "mcp-proxy", "--config", str(self.config)]

    @contextlib.asynccontextmanager
    async def stdio_client(
        self, wait_seconds: float, upstream: dict[str, object] | None = None, **client: Any
    ) -> AsyncIterator[Client]:
        self.write(wait_seconds, **(upstream or {}))
        command = self.proxy_command()
        parameters = StdioServerParameters(command=command[0], args=command[1:], env=self.env, cwd=str(ROOT))
        async with Client(parameters, read_timeout_seconds=90, **client) as connected:
            yield connected

    def http_proxy(self, wait_seconds: float) -> str:
        """A proxy over Streamable HTTP (a process of its own, to SIGKILL); its URL."""
        self.write(wait_seconds)
        port = free_port()
        self.proxy = self.stack.enter_context(
            _running([*self.proxy_command(), "--http", f"127.0.0.1:{port}"], self.env, port)
        )
        return f"http://127.0.0.1:{port}/mcp"

    def kill_proxy(self) -> None:
        self.proxy.kill()
        self.proxy.wait()

    def session_of(self, arguments: dict[str, object], tool: str = "delete_file") -> str:
        return filed_session_id(f"bot:{PROGRAM}", call_id_for(ORIGIN, tool, arguments, None))


@contextlib.contextmanager
def _ask(deployment, tmp_path: Path, **settings: str) -> Iterator[Ask]:
    ask = Ask(deployment, tmp_path, **settings)
    with ask.stack:
        yield ask


@pytest.fixture
def ask(sqlite_deployment, tmp_path: Path) -> Iterator[Ask]:
    with _ask(sqlite_deployment, tmp_path) as ask:
        yield ask


@pytest.fixture
def ask_expiring(sqlite_deployment, tmp_path: Path) -> Iterator[Ask]:
    """A deployment whose requests expire 3 s after they are filed."""
    with _ask(sqlite_deployment, tmp_path, SIGNOFF_APPROVAL_TIMEOUT_SECONDS="3") as ask:
        yield ask


@pytest.fixture
def ask_executor_dies_after_effect(sqlite_deployment, tmp_path: Path) -> Iterator[Ask]:
    """The tool-executor SIGKILLs itself once a call has run, before it records the result."""
    with _ask(sqlite_deployment, tmp_path, executor_faults="executor.after_effect") as ask:
        yield ask


@pytest.fixture
def ask_on_both_stores(deployment, tmp_path: Path) -> Iterator[Ask]:
    with _ask(deployment, tmp_path) as ask:
        yield ask


async def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # Exited but not yet reaped by its parent (the killed executor's, now init) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


async def decide(ask: Ask, session_id: str, decision: str = "approve", **body: object) -> dict:
    async with GatewayClient(url(ask.deployment)) as alice:
        await alice.login("alice")
        card = await pending_card(alice, session_id, timeout=30)
        answer = await alice.decide(card["id"], decision, **body)
        assert answer.status_code == 200, answer.text
        return card


async def call(proxy_url: str, arguments: dict[str, object]) -> mcp_types.CallToolResult:
    async with Client(proxy_url, read_timeout_seconds=90) as client:
        return await client.call_tool("delete_file", arguments)


async def abandoned(task: asyncio.Task[object]) -> None:
    """A client whose proxy was killed under it: whatever it ends with, it is gone."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_an_ask_call_is_held_shows_a_card_and_runs_once_on_approval_with_the_upstreams_result(ask: Ask) -> None:
    arguments = {"path": "a.txt"}
    progress: list[str | None] = []

    async def noted(done: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async with ask.stdio_client(wait_seconds=60) as client:
        # An allowed read passes straight through, nothing filed.
        assert _text(await client.call_tool("read_file", {"path": "notes.txt"})) == "contents of notes.txt"
        held = asyncio.create_task(client.call_tool("delete_file", arguments, progress_callback=noted))
        card = await decide(ask, ask.session_of(arguments))
        assert card["tool"] == "delete_file" and card["filed"]["origin"] == ORIGIN
        result = await held
        assert not result.is_error, _text(result)
        assert _text(result) == "deleted a.txt (run 1)"
        assert (result.meta or {})["signoff/outcome"]["request_id"] == card["id"]
        assert progress and "waiting for a person's sign-off" in (progress[0] or "")
        # Called again after it ran: the recorded result, not a second run.
        again = await client.call_tool("delete_file", arguments)
        assert _text(again) == "deleted a.txt (run 1)"
    assert _count(ask.counts, "delete_file") == 1
    assert _count(ask.counts, "read_file") == 1


async def test_approved_mcp_calls_the_executor_runs_share_one_server_process_it_started_once(ask: Ask) -> None:
    async with ask.stdio_client(wait_seconds=60) as client:
        for name in ("one.txt", "two.txt", "three.txt"):
            arguments = {"path": name}
            held = asyncio.create_task(client.call_tool("delete_file", arguments))
            await decide(ask, ask.session_of(arguments))
            result = await held
            assert not result.is_error, _text(result)
    assert _count(ask.counts, "delete_file") == 3
    # The executor's own server (the proxy's upstream counts its starts apart).
    assert _count(ask.counts, "started-executor") == 1


async def test_an_executor_killed_after_an_mcp_call_ran_closes_it_as_outcome_unknown_and_its_server_goes_with_it(
    ask_executor_dies_after_effect: Ask,
) -> None:
    ask = ask_executor_dies_after_effect
    arguments = {"path": "once.txt"}
    async with ask.stdio_client(wait_seconds=90) as client:
        held = asyncio.create_task(client.call_tool("delete_file", arguments))
        await decide(ask, ask.session_of(arguments))
        await ask.deployment.replace_after_fault("tool-executor")
        killed_with = int((ask.counts / "executor.pid").read_text())
        result = await held
        # The ledger's claim decides: the replacement reports what it cannot know, never runs it again.
        assert result.is_error and _kind(result) == "outcome_unknown", _text(result)
        again = await client.call_tool("delete_file", arguments)
        assert _kind(again) == "outcome_unknown", _text(again)
    assert _count(ask.counts, "delete_file") == 1
    # The server the killed executor kept does not outlive it (its stdin closed with it).
    await eventually(lambda: _gone(killed_with), timeout=20)


async def test_a_call_still_waiting_says_to_call_again_and_a_denial_returns_the_persons_reason(ask: Ask) -> None:
    arguments = {"path": "keep.txt"}
    async with ask.stdio_client(wait_seconds=1) as client:
        waiting = await client.call_tool("delete_file", arguments)
        assert waiting.is_error and _kind(waiting) == "pending"
        request_id = (waiting.meta or {})["signoff/outcome"]["request_id"]
        assert request_id and request_id in _text(waiting) and "call delete_file again" in _text(waiting).lower()
        card = await decide(ask, ask.session_of(arguments), "deny", reason="that file is the ledger's backup")
        assert card["id"] == request_id
        denied = await client.call_tool("delete_file", arguments)
        assert denied.is_error and _kind(denied) == "denied", _text(denied)
        assert "that file is the ledger's backup" in _text(denied)
        assert (denied.meta or {})["signoff/outcome"]["reason"] == "that file is the ledger's backup"
        # Asked again as a new call (the client's own call id): a new request, not the denial.
        anew = await client.call_tool("delete_file", arguments, meta={"signoff/call_id": "ask-again-1"})
        assert _kind(anew) == "pending" and (anew.meta or {})["signoff/outcome"]["request_id"] != request_id
    assert _count(ask.counts, "delete_file") == 0


async def test_a_persons_answer_in_the_tools_place_reaches_the_client_and_the_upstream_never_runs(ask: Ask) -> None:
    arguments = {"path": "old.txt"}
    async with ask.stdio_client(wait_seconds=60) as client:
        held = asyncio.create_task(client.call_tool("delete_file", arguments))
        await decide(ask, ask.session_of(arguments), "respond", message="old.txt was archived instead; nothing to do")
        answered = await held
        # delete_file declares an output schema, which free text cannot fill: a tool error of
        # kind `answered` that carries the person's answer.
        assert answered.is_error and _kind(answered) == "answered", _text(answered)
        assert "old.txt was archived instead; nothing to do" in _text(answered)
    assert _count(ask.counts, "delete_file") == 0


async def test_a_tool_the_server_added_after_start_is_filed_as_declared_by_the_proxy_and_run_by_it_once(
    ask: Ask,
) -> None:
    async with ask.stdio_client(wait_seconds=60) as client:
        assert not (await client.call_tool("add_tool", {})).is_error
        held = asyncio.create_task(client.call_tool("added_later", {}))
        card = await decide(ask, ask.session_of({}, "added_later"))
        assert card["filed"]["declared_by_caller"] is True
        result = await held
        assert not result.is_error and _text(result) == "later ran", _text(result)
        assert _text(await client.call_tool("added_later", {})) == "later ran"
    assert _count(ask.counts, "later") == 1


async def test_a_proxy_sigkilled_before_the_decision_and_after_the_approval_gives_the_retry_the_one_result(
    ask_on_both_stores: Ask,
) -> None:
    ask = ask_on_both_stores
    # Killed between the call and the decision: the retry finds the same request.
    first = {"path": "b.txt"}
    proxy = ask.http_proxy(wait_seconds=3)
    held = asyncio.create_task(call(proxy, first))
    [request] = await eventually(lambda: rows(ask.deployment, ApprovalRequest), 30)
    ask.kill_proxy()
    await abandoned(held)
    proxy = ask.http_proxy(wait_seconds=3)
    waiting = await call(proxy, first)
    assert _kind(waiting) == "pending", _text(waiting)
    # The retry is the same request, not a second one.
    assert (waiting.meta or {})["signoff/outcome"]["request_id"] == request.id
    assert len(await rows(ask.deployment, ApprovalRequest)) == 1
    await decide(ask, request.session_id)
    result = await call(proxy, first)
    while _kind(result) == "pending":
        result = await call(proxy, first)
    assert _text(result) == "deleted b.txt (run 1)"

    # Killed between the approval and the result: the executor runs it once, the ledger
    # records it, and the retry gets that.
    second = {"path": "c.txt"}
    held = asyncio.create_task(call(proxy, second))
    await decide(ask, ask.session_of(second))
    ask.kill_proxy()
    await abandoned(held)
    await eventually(lambda: asyncio.sleep(0, _count(ask.counts, "delete_file") == 2), 30)
    proxy = ask.http_proxy(wait_seconds=3)
    result = await call(proxy, second)
    while _kind(result) == "pending":
        result = await call(proxy, second)
    assert _text(result) == "deleted c.txt (run 2)"
    assert len(await rows(ask.deployment, ApprovalRequest, session_id=ask.session_of(second))) == 1
    # Each file deleted once, whatever the clients and the proxy went through.
    assert _count(ask.counts, "delete_file") == 2


async def test_an_approved_call_whose_server_dies_mid_call_closes_as_outcome_unknown_for_a_person_never_resent(
    ask: Ask,
) -> None:
    async with ask.stdio_client(wait_seconds=60) as client:
        held = asyncio.create_task(client.call_tool("crash", {}))
        card = await decide(ask, ask.session_of({}, "crash"))
        result = await held
        # The client is told, in a kind a program reads, that it may or may not have run.
        assert result.is_error and _kind(result) == "outcome_unknown", _text(result)
        assert (result.meta or {})["signoff/outcome"]["request_id"] == card["id"]
        assert "not run again" in _text(result)
        # The proxy goes on serving, and the same call again is the same ending, not a second run.
        assert _text(await client.call_tool("read_file", {"path": "after.txt"})) == "contents of after.txt"
        again = await client.call_tool("crash", {})
        assert _kind(again) == "outcome_unknown", _text(again)
    assert _count(ask.counts, "crash") == 1
    # On the ledger: closed as outcome unknown, and an operator is asked to find out.
    [filed] = await rows(ask.deployment, FiledCall, caller_call_id=call_id_for(ORIGIN, "crash", {}, None))
    [closure] = await rows(ask.deployment, Closure, call_id=filed.id)
    assert closure.kind == "outcome_unknown"
    alerts = [
        row
        for row in await rows(ask.deployment, OutboxRow, session_id=closure.session_id)
        if row.message_type == "operator.alerted"
    ]
    assert len(alerts) == 1


@pytest.mark.timeout(300)
@pytest.mark.slow(reason="waits out the proxy's claim on the call (its bound and the report's, 40 s) for the ledger")
async def test_an_approved_call_the_proxy_runs_whose_server_dies_mid_call_closes_as_outcome_unknown_within_its_lease(
    ask: Ask,
) -> None:
    # Under a prefix, the server's `crash` is a tool the catalogue does not know: the proxy
    # claims it once approved and calls the server itself.
    bounds = {"prefix": "raw__", "timeout_seconds": 5, "connect_timeout_seconds": 15}
    async with ask.stdio_client(wait_seconds=60, upstream=bounds) as client:
        held = asyncio.create_task(client.call_tool("raw__crash", {}))
        card = await decide(ask, ask.session_of({}, "raw__crash"))
        assert card["filed"]["declared_by_caller"] is True
        result = await held
        assert result.is_error and _kind(result) == "outcome_unknown", _text(result)
        assert "not run again" in _text(result)
        assert _text(await client.call_tool("raw__read_file", {"path": "after.txt"})) == "contents of after.txt"
        # The claim's lease (the call's bound and the report's) ends with no report: the
        # ledger closes it as outcome unknown and asks a person, and it is not run again.
        [filed] = await rows(ask.deployment, FiledCall, caller_call_id=call_id_for(ORIGIN, "raw__crash", {}, None))

        async def closed() -> list[Closure]:
            return await rows(ask.deployment, Closure, call_id=filed.id)

        [closure] = await eventually(closed, 90)
        assert (closure.kind, closure.reason_code) == ("outcome_unknown", "claim_lapsed")
        again = await client.call_tool("raw__crash", {})
        assert _kind(again) == "outcome_unknown", _text(again)
    assert _count(ask.counts, "crash") == 1
    alerts = [
        row
        for row in await rows(ask.deployment, OutboxRow, session_id=closure.session_id)
        if row.message_type == "operator.alerted"
    ]
    assert len(alerts) == 1


async def test_a_request_nobody_decides_in_time_reaches_the_client_as_an_expired_tool_error(ask_expiring: Ask) -> None:
    ask = ask_expiring
    arguments = {"path": "late.txt"}
    async with ask.stdio_client(wait_seconds=60) as client:
        result = await client.call_tool("delete_file", arguments)
        assert result.is_error and _kind(result) == "expired", _text(result)
        assert "nobody decided in time" in _text(result)
        [request] = await rows(ask.deployment, ApprovalRequest, session_id=ask.session_of(arguments))
        assert (result.meta or {})["signoff/outcome"]["request_id"] == request.id
        # Called again: the same expired request, never a new one that runs.
        assert _kind(await client.call_tool("delete_file", arguments)) == "expired"
    assert len(await rows(ask.deployment, ApprovalRequest)) == 1
    assert _count(ask.counts, "delete_file") == 0


async def test_a_request_an_operator_cancels_reaches_the_held_client_as_a_cancelled_tool_error(ask: Ask) -> None:
    arguments = {"path": "cancelled.txt"}
    session_id = ask.session_of(arguments)
    async with ask.stdio_client(wait_seconds=60) as client:
        held = asyncio.create_task(client.call_tool("delete_file", arguments))
        async with GatewayClient(url(ask.deployment)) as ann:
            await ann.login("ann")
            await pending_card(ann, session_id, timeout=30)
            answer = await ann.post(f"/v1/sessions/{session_id}/cancel", {"reason": "not today"})
            assert answer.status_code == 202, answer.text
        result = await held
        assert result.is_error and _kind(result) == "cancelled", _text(result)
        assert _kind(await client.call_tool("delete_file", arguments)) == "cancelled"
    assert _count(ask.counts, "delete_file") == 0


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_a_client_that_declares_url_elicitation_is_sent_the_inbox_card_and_its_answer_decides_nothing(
    ask: Ask, era: str
) -> None:
    """`legacy`: the 2025-11-25 handshake (an `elicitation/create` request beside the held
    call); `auto`: 2026-07-28 (the call answers with the elicitation, the client calls again)."""
    shown: list[mcp_types.ElicitRequestURLParams] = []
    answers = iter(["accept", "decline"])

    async def elicit(ctx: object, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        assert isinstance(params, mcp_types.ElicitRequestURLParams)
        shown.append(params)
        return mcp_types.ElicitResult(action=next(answers))

    async with ask.stdio_client(wait_seconds=60, mode=era, elicitation_callback=elicit) as client:
        assert client.protocol_version == ("2025-11-25" if era == "legacy" else "2026-07-28")
        # The user follows the link (accept): the call still waits for the approver, who denies it.
        denied = {"path": "kept.txt"}
        held = asyncio.create_task(client.call_tool("delete_file", denied))
        await eventually(lambda: asyncio.sleep(0, len(shown) == 1), 30)
        card = await decide(ask, ask.session_of(denied), "deny", reason="keep it")
        assert shown[0].url == f"{url(ask.deployment)}/inbox/requests/{card['id']}"
        assert card["id"] in shown[0].message
        result = await held
        assert _kind(result) == "denied", _text(result)
        # The user waves the link away (decline): the approver's word still runs it, once.
        approved = {"path": "gone.txt"}
        held = asyncio.create_task(client.call_tool("delete_file", approved))
        await eventually(lambda: asyncio.sleep(0, len(shown) == 2), 30)
        card = await decide(ask, ask.session_of(approved))
        result = await held
        assert not result.is_error and _text(result) == "deleted gone.txt (run 1)", _text(result)
        assert [params.url for params in shown] == [
            shown[0].url,
            f"{url(ask.deployment)}/inbox/requests/{card['id']}",
        ]
    assert _count(ask.counts, "delete_file") == 1


async def test_bad_input_for_an_ask_tool_is_a_json_rpc_error_and_nothing_is_filed(ask: Ask) -> None:
    async with ask.stdio_client(wait_seconds=60) as client:
        for name, arguments in (
            ("no_such_tool", {"path": "a"}),
            ("delete_file", {}),
            ("delete_file", {"path": 7}),
            ("delete_file", {"path": "x" * 10_000_000}),
        ):
            with pytest.raises(MCPError) as refused:
                await client.call_tool(name, arguments)
            assert refused.value.code == mcp_types.INVALID_PARAMS, name
            assert "x" * 100 not in refused.value.message
        # The proxy goes on serving.
        assert _text(await client.call_tool("read_file", {"path": "ok"})) == "contents of ok"
    assert await rows(ask.deployment, FiledCall) == []
    assert await rows(ask.deployment, ApprovalRequest) == []
    assert _count(ask.counts, "delete_file") == 0
