"""Reaching an MCP server with the official `mcp` SDK, over a connection kept open
(`Upstream`): the proxy's upstreams and the executor's `mcp` tools, one each per server.

`mcp` is an optional extra (`pip install 'signoff[mcp]'`): only `signoff mcp-proxy` and
the executor's `mcp` tool kind import this module, and only when they need it, so a
deployment without MCP tools never installs it.

Every way a server can fail comes back as an `UpstreamFailure` of a kind that says
whether the call may have run: `unreachable` (nothing was sent) or `no_answer`, `broke`,
`bad_answer`, `too_large` (the call was sent; whether it ran is unknown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import anyio
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.caching import CacheConfig
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from shared.catalogue import McpServer, MissingSecret
from shared.redaction import redact_text

log = logging.getLogger(__name__)

# The largest result taken from a server (its JSON): a bigger one is refused, not relayed.
MAX_RESULT_BYTES = 1_000_000
# How many pages of `tools/list` are read: a server that never ends its listing cannot hang us.
MAX_LIST_PAGES = 50
# What is kept of an error's text.
ERROR_CHARS = 500

FailureKind = Literal["unreachable", "no_answer", "broke", "bad_answer", "too_large"]


class UpstreamFailure(Exception):
    """A server that did not give an answer. `may_have_run`: the call was sent."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind
        self.message = redact_text(message)[:ERROR_CHARS]

    @property
    def may_have_run(self) -> bool:
        return self.kind != "unreachable"

    def __str__(self) -> str:
        return self.message


def client_for(
    server: McpServer, keys_dir: Path | None, ended: anyio.Event | None = None, errlog: TextIO = sys.stderr
) -> Client:
    """An SDK client for the server, its credentials filled in now (MissingSecret if one
    is absent). A stdio server gets its declared variables and no other of ours.
    `ended` is set when the server's side of the connection ends (a stdio server exited)."""
    transport: Any
    if server.command is not None:
        parameters = StdioServerParameters(
            command=server.command[0], args=server.command[1:], env=server.environment(keys_dir), cwd=server.cwd
        )
        transport = stdio_client(parameters, errlog)
        cache = None
    else:
        assert server.url is not None
        http = create_mcp_http_client(headers=server.filled_headers(keys_dir))
        transport = streamable_http_client(server.url, http_client=http)
        cache = CacheConfig()
    if ended is not None:
        transport = _watched(transport, ended)
    return Client(transport, read_timeout_seconds=server.timeout_seconds, cache=cache)


@contextlib.asynccontextmanager
async def _watched(transport: Any, ended: anyio.Event) -> AsyncIterator[tuple[Any, Any]]:
    """The transport's streams, its read side passed on by a task that sets `ended` when
    it ends: a connection whose server exited while idle is known dead before a call is
    sent on it (the SDK would say so only to the next call, as a call that may have run)."""
    async with transport as (read, write):
        passed, reading = anyio.create_memory_object_stream[Any](0)

        async def pass_on() -> None:
            try:
                async with passed:
                    async for message in read:
                        await passed.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass
            finally:
                ended.set()

        async with anyio.create_task_group() as group:
            group.start_soon(pass_on)
            try:
                yield reading, write
            finally:
                group.cancel_scope.cancel()
                reading.close()


def _why(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_why(inner) for inner in error.exceptions)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _sent_failure(error: BaseException, server: McpServer) -> UpstreamFailure:
    """What a failure after the call was sent says: the call may have run."""
    if isinstance(error, TimeoutError):
        return UpstreamFailure("no_answer", f"{server.shown} did not answer within {server.timeout_seconds:g}s")
    if isinstance(error, MCPError) and error.code == mcp_types.REQUEST_TIMEOUT:
        return UpstreamFailure("no_answer", f"{server.shown} did not answer within {server.timeout_seconds:g}s")
    if isinstance(error, ValidationError):
        return UpstreamFailure("bad_answer", f"{server.shown} answered with what is not an MCP result")
    return UpstreamFailure("broke", f"{server.shown} failed during the call: {_why(error)}")


def checked_result(result: mcp_types.CallToolResult, server: McpServer, limit: int) -> mcp_types.CallToolResult:
    size = len(result.model_dump_json(by_alias=True, exclude_none=True))
    if size > limit:
        raise UpstreamFailure("too_large", f"{server.shown} answered with {size:,} bytes, more than {limit:,}")
    return result


@dataclass(eq=False)
class _Job:
    method: Literal["list", "call"]
    tool: str
    arguments: dict[str, Any]
    answer: asyncio.Future[Any]


class _Connection:
    """One open connection to the server: the task that holds it and the requests handed
    to it. Retired, it is handed nothing more and closes once the calls on it have ended."""

    def __init__(self) -> None:
        self.jobs: asyncio.Queue[_Job | None] = asyncio.Queue()
        # Requests started on it and not yet answered: sent, or about to be.
        self.running: set[_Job] = set()
        self.retired = False
        self.holder: asyncio.Task[None] | None = None
        # Set when the server's side ended (`client_for`).
        self.ended = anyio.Event()

    @property
    def open(self) -> bool:
        return not self.retired and self.holder is not None and not self.holder.done()

    def retire(self) -> None:
        if not self.retired:
            self.retired = True
            self.jobs.put_nowait(None)


class Upstream:
    """One server reached over a connection kept open (the proxy's upstreams, the
    executor's `mcp` tools): opened on the first request, and again on the next request
    after it broke (the server exited, its stream closed) or stopped answering (a call
    ran past `timeout_seconds`: the calls already on the old one finish or time out
    there, and it closes). Calls run side by side on it; each is bounded by the server's
    `timeout_seconds`, and its result by `max_result_bytes`, so a hanging or flooding
    server fails its own calls only. `serve` must run for requests to be answered."""

    def __init__(
        self, name: str, server: McpServer, keys_dir: Path | None, *, max_result_bytes: int = MAX_RESULT_BYTES
    ) -> None:
        self.name = name
        self.server = server
        self.keys_dir = keys_dir
        self.max_result_bytes = max_result_bytes
        self._jobs: asyncio.Queue[_Job] = asyncio.Queue()
        self._connection: _Connection | None = None
        self._connections: set[_Connection] = set()
        # Set once `serve` has stopped: nothing more is sent.
        self._stopped = False

    async def list_tools(self) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = await self._ask(_Job("list", "", {}, asyncio.get_running_loop().create_future()))
        return tools

    @property
    def connected(self) -> bool:
        """Whether a connection stands open for the next request: not once its server was
        seen to exit, nor after it was retired."""
        return self._connection is not None and self._connection.open

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        result: mcp_types.CallToolResult = await self._ask(
            _Job("call", tool, arguments, asyncio.get_running_loop().create_future())
        )
        return result

    async def _ask(self, job: _Job) -> Any:
        if self._stopped:
            raise self._no_longer_served()
        # A caller that stops waiting cancels its answer: a request not yet sent then never is.
        await self._jobs.put(job)
        return await job.answer

    def _no_longer_served(self) -> UpstreamFailure:
        return UpstreamFailure("unreachable", f"{self.server.shown} is no longer served here")

    async def serve(self) -> None:
        """Runs until cancelled: opens connections and hands the requests to the open one.
        Cancelled, it takes no more requests (those waiting are answered `unreachable`);
        the calls already running finish, each within its timeout, and their connection closes."""
        # Taken from the queue and not yet handed to a connection.
        taken: _Job | None = None
        try:
            while True:
                taken = job = await self._jobs.get()
                if job.answer.done():
                    continue
                connection = self._connection
                if connection is None or not connection.open:
                    connection = self._connection = await self._open(job)
                    if connection is None:
                        continue
                if not connection.open:
                    # It ended as it opened: the request was not sent.
                    self._fail_waiting(job, UpstreamFailure("unreachable", f"{self.server.shown} closed at once"))
                    continue
                connection.jobs.put_nowait(job)
                taken = None
        finally:
            self._stopped = True
            for connection in self._connections:
                connection.retire()
            if taken is not None:
                _answer(taken, self._no_longer_served())
            while not self._jobs.empty():
                _answer(self._jobs.get_nowait(), self._no_longer_served())

    async def _open(self, job: _Job) -> _Connection | None:
        """A new connection, once its handshake is done; None when it could not be opened
        (`job`, and every request waiting behind it, is then answered `unreachable`)."""
        connection = _Connection()
        try:
            client = client_for(self.server, self.keys_dir, connection.ended)
        except MissingSecret as missing:
            self._fail_waiting(job, UpstreamFailure("unreachable", f"cannot reach {self.server.shown}: {missing}"))
            return None
        ready = asyncio.Event()
        # The connection lives in a task of its own: the SDK's client must be entered and
        # left in one task, and its start must be bounded from outside it.
        holder = connection.holder = asyncio.create_task(self._hold(client, connection, ready))
        self._connections.add(connection)
        holder.add_done_callback(lambda _: self._ended(connection))
        waiting = asyncio.create_task(ready.wait())
        try:
            await asyncio.wait(
                {holder, waiting}, timeout=self.server.connect_timeout_seconds, return_when="FIRST_COMPLETED"
            )
        finally:
            waiting.cancel()
            if not ready.is_set():
                holder.cancel()
        if ready.is_set():
            return connection
        outcome = (await asyncio.gather(holder, return_exceptions=True))[0]
        why = (
            _why(outcome)
            if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError)
            else (f"no handshake within {self.server.connect_timeout_seconds:g}s")
        )
        self._fail_waiting(job, UpstreamFailure("unreachable", f"could not reach {self.server.shown}: {why}"))
        return None

    def _fail_waiting(self, job: _Job, failure: UpstreamFailure) -> None:
        """`job` and the requests queued behind it get `failure`: none was sent, and each
        would otherwise wait for a start of its own that would most likely fail alike."""
        _answer(job, failure)
        while not self._jobs.empty():
            _answer(self._jobs.get_nowait(), failure)

    async def _hold(self, client: Client, connection: _Connection, ready: asyncio.Event) -> None:
        async with client, anyio.create_task_group() as group:
            ready.set()
            group.start_soon(self._watch, connection)
            async with anyio.create_task_group() as calls:
                while (job := await connection.jobs.get()) is not None:
                    if not job.answer.done():
                        connection.running.add(job)
                        calls.start_soon(self._run, client, job, connection, group.cancel_scope)
                # Retired: leaving `calls` waits for the calls on it, each bounded by its timeout.
            group.cancel_scope.cancel()

    async def _watch(self, connection: _Connection) -> None:
        """A server that exited while idle: its connection takes no call (none was sent)."""
        await connection.ended.wait()
        log.warning("MCP server %s: the server ended the connection", self.name)
        connection.retire()

    def _ended(self, connection: _Connection) -> None:
        """The connection's task ended (it broke, or closed once retired)."""
        holder = connection.holder
        assert holder is not None
        error = None if holder.cancelled() else holder.exception()
        if error is not None or not connection.retired:
            why = redact_text(_why(error))[:ERROR_CHARS] if error is not None else "the server closed it"
            log.warning("MCP server %s: connection ended: %s", self.name, why)
        connection.retired = True
        self._connections.discard(connection)
        # A call started on it may have been sent: it may have run.
        for started in connection.running:
            _answer(started, UpstreamFailure("broke", f"the connection to {self.server.shown} ended during the call"))
        # Handed to it but never started, so never sent: the next connection takes them.
        while not connection.jobs.empty():
            handed = connection.jobs.get_nowait()
            if handed is not None and not handed.answer.done():
                if self._stopped:
                    _answer(handed, self._no_longer_served())
                else:
                    self._jobs.put_nowait(handed)

    async def _run(self, client: Client, job: _Job, connection: _Connection, scope: anyio.CancelScope) -> None:
        try:
            with anyio.fail_after(self.server.timeout_seconds):
                if job.method == "list":
                    _answer(job, await self._listing(client))
                else:
                    result = await client.call_tool(job.tool, job.arguments)
                    _answer(job, checked_result(result, self.server, self.max_result_bytes))
        except UpstreamFailure as failure:
            _answer(job, failure)
        except MCPError as error:
            if error.code == mcp_types.CONNECTION_CLOSED:
                _answer(job, _sent_failure(error, self.server))
                scope.cancel()
            elif error.code == mcp_types.REQUEST_TIMEOUT:
                self._no_answer(job, error, connection)
            else:
                # A JSON-RPC error from the server: it refused the request.
                _answer(job, UpstreamFailure("unreachable", f"{self.server.shown} refused it: {error.message}"))
        except TimeoutError as error:
            self._no_answer(job, error, connection)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as error:
            _answer(job, _sent_failure(error, self.server))
            scope.cancel()
        except Exception as error:
            _answer(job, _sent_failure(error, self.server))
        finally:
            _answer(job, UpstreamFailure("broke", f"the connection to {self.server.shown} ended during the call"))
            connection.running.discard(job)

    def _no_answer(self, job: _Job, error: Exception, connection: _Connection) -> None:
        """A call past its timeout (the SDK's or ours, whichever ends first)."""
        _answer(job, _sent_failure(error, self.server))
        # A server that does not answer may be stuck: the next request gets a new connection.
        connection.retire()

    async def closed(self, seconds: float) -> None:
        """Once `serve` was cancelled: until its connections have closed (their calls
        ended), at most `seconds`; then they are closed under any call still running."""
        holders = {c.holder for c in self._connections if c.holder is not None}
        if holders:
            _, late = await asyncio.wait(holders, timeout=seconds)
            for holder in late:
                holder.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def _listing(self, client: Client) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools


def _answer(job: _Job, value: Any) -> None:
    """The first answer a job gets is its answer (later ones, from cleanup, are dropped)."""
    if job.answer.done():
        return
    if isinstance(value, BaseException):
        job.answer.set_exception(value)
    else:
        job.answer.set_result(value)
