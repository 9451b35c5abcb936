"""LangGraph: `signoff_interrupt()` for a graph's own nodes, and `SignoffResumer`, which
resumes each thread waiting on Signoff when a person decides (`pip install
'./sdk[langchain]'`, docs/langchain.md).

    def refund(state):
        decided = signoff_interrupt("send_refund", {"customer": "c-42", "amount": 12.5},
                                    call_id=state["refund_id"], run=send_refund)
        if decided.decision == "deny":
            return {"note": decided.reason}
        if decided.decision == "respond":       # a person answered in the tool's place
            return {"note": decided.message}
        return {"refund": decided.output}

The call is filed once under `call_id` (keep it stable across the node's re-runs: a
tool-call id, an id kept in the state), the node pauses with `interrupt()` while nobody
has decided, and on resume the decision is read from the ledger's signed verdict, never
from the resume value. With `run`, an approved `runs: caller` call is claimed (once),
run with the arguments a person approved and reported; a `runs: signoff` call's output
comes back in `output`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from langgraph.config import get_config
from langgraph.types import Command, interrupt

from . import gate
from .errors import NoRunner
from .events import call_of
from .langchain import signoff_of
from .models import FiledShown

Settled = gate.Settled


def signoff_interrupt(
    tool: str,
    arguments: dict[str, Any],
    *,
    call_id: str,
    run: Callable[..., Any] | None = None,
    summary: str | None = None,
    connection: gate.Connection | None = None,
) -> gate.Settled:
    """File `tool(arguments)` with Signoff from inside a node, pause the graph until a
    person decides, and return what they decided (`Settled`: decision approve, edit,
    deny, respond, or how the call closed otherwise; the approved `arguments`; the
    person's `reason` for a denial, their answer in the tool's place in `message`
    (nothing ran); `output`). Nothing the graph is resumed with is read."""
    connection = connection or gate.Connection(kind="langgraph")
    filing = gate.File(tool, dict(arguments), call_id, _thread(), summary)

    def ran(approved: dict[str, Any]) -> gate.Ran:
        if run is None:
            raise NoRunner(f"{tool} is run by its caller: pass run= to signoff_interrupt()")
        output = run(**approved)
        return gate.Ran(result=output, output=output)

    settled = gate.drive(gate.settle(filing), connection, pause=_pause(tool, arguments, call_id), run=ran)
    if settled.ran:
        settled.output = settled.result
    return settled


async def asignoff_interrupt(
    tool: str,
    arguments: dict[str, Any],
    *,
    call_id: str,
    run: Callable[..., Any] | None = None,
    summary: str | None = None,
    connection: gate.Connection | None = None,
) -> gate.Settled:
    """`signoff_interrupt` for async nodes (`run` may be async)."""
    connection = connection or gate.Connection(kind="langgraph")
    filing = gate.File(tool, dict(arguments), call_id, _thread(), summary)

    async def ran(approved: dict[str, Any]) -> gate.Ran:
        if run is None:
            raise NoRunner(f"{tool} is run by its caller: pass run= to asignoff_interrupt()")
        output = run(**approved)
        if asyncio.iscoroutine(output):
            output = await output
        return gate.Ran(result=output, output=output)

    settled = await gate.adrive(gate.settle(filing), connection, pause=_pause(tool, arguments, call_id), run=ran)
    if settled.ran:
        settled.output = settled.result
    return settled


def _thread() -> str | None:
    thread = (get_config().get("configurable") or {}).get("thread_id")
    return None if thread is None else str(thread)


def _pause(tool: str, arguments: dict[str, Any], call_id: str) -> Callable[[FiledShown], Any]:
    def pause(filed: FiledShown) -> Any:
        return interrupt(
            {"type": "tool_approval", "tool_call_id": call_id, "name": tool, "args": arguments,
             "signoff": signoff_of(filed)}
        )  # fmt: skip

    return pause


# --- resuming the threads that wait on Signoff ----------------------------------------------


def waiting_on_signoff(interrupts: Any) -> dict[str, str]:
    """A thread's pending interrupts that wait on Signoff: interrupt id to Signoff call id."""
    return {
        i.id: i.value["signoff"]["call"]
        for i in interrupts or ()
        if isinstance(i.value, dict) and isinstance(i.value.get("signoff"), dict)
    }


class SignoffResumer:
    """Resumes a compiled graph's threads when Signoff's decisions come, so nobody polls:
    one stream of the gateway's events (`GET /v1/events`) for all the threads given, and
    as soon as an event says a call a thread waits on left `pending` (decided, answered,
    expired, cancelled), that thread is resumed with `Command(resume={interrupt_id:
    ...})` on the graph and its checkpointer config. The resume value only names the
    call: the gate reads the decision from Signoff itself.

    Nothing is missed: the stream is open before the threads' calls are read once (a
    decision made before, even while no resumer ran, is found then), and a dropped
    stream or a restarted gateway is resumed right after the last event seen
    (`Last-Event-ID`). `position` is that last event id; a resumer given it
    (`since=`) picks the stream up there. `listening` is set once every thread was read
    and only the stream is waited on. Threads are resumed one run at a time (a thread
    is never resumed twice at once)."""

    def __init__(self, graph: Any, connection: gate.Connection | None = None, *, since: str | None = None) -> None:
        self.graph = graph
        self.connection = connection or gate.Connection(kind="langgraph")
        self.position = since
        self.listening = asyncio.Event()

    async def aresume(self, config: dict[str, Any], *, timeout: float | None = None) -> Any:
        """Resume this thread (async graph and checkpointer) as its calls are decided, until it
        waits on Signoff no more; returns the graph's last state values."""
        [values] = await self.run([config], timeout=timeout)
        return values

    def resume(self, config: dict[str, Any], *, timeout: float | None = None) -> Any:
        """The same for a graph run without async (a sync checkpointer): the graph runs in a
        thread of its own, as the gate drives its calls with an event loop of its own."""
        [values] = asyncio.run(self._run([config], timeout, sync=True))
        return values

    async def run(self, configs: list[dict[str, Any]], *, timeout: float | None = None) -> list[Any]:
        """Resume each of these threads as its decisions come, from one event stream; the
        threads' last state values, in order, once none waits on Signoff."""
        return await self._run(configs, timeout, sync=False)

    async def _run(self, configs: list[dict[str, Any]], timeout: float | None, *, sync: bool) -> list[Any]:
        threads = [_Thread(self.graph, config, sync) for config in configs]
        async with asyncio.timeout(timeout), self.connection.client() as client:
            stream = client.events(self.position or "now")
            try:
                if self.position is None:
                    # Open before anything is read: what is decided from here on comes as an event.
                    self.position = (await anext(stream)).id
                for thread in threads:
                    await thread.settle(client, await thread.waiting())
                self.listening.set()
                while any(thread.calls for thread in threads):
                    event = await anext(stream)
                    self.position = event.id
                    call = call_of(event)
                    for thread in threads:
                        if call is not None and call in thread.calls.values() and event.type in DECIDING:
                            await thread.settle(client, {i: c for i, c in thread.calls.items() if c == call})
            finally:
                self.listening.clear()
                await stream.aclose()
            self.connection.remember(client)
        return [thread.values for thread in threads]


# The events after which a call may no longer wait on a person (decided, answered, expired,
# cancelled); the call's own state, read once on the event, says whether it left `pending`.
DECIDING = ("approval.decided", "approval.expired", "tool.closed")


class _Thread:
    """One thread's calls waiting on Signoff (interrupt id to call id), and its last values."""

    def __init__(self, graph: Any, config: dict[str, Any], sync: bool) -> None:
        self.graph, self.config, self.sync = graph, config, sync
        self.calls: dict[str, str] = {}
        self.values: Any = None

    async def waiting(self) -> dict[str, str]:
        state = await (asyncio.to_thread(self.graph.get_state, self.config) if self.sync
                       else self.graph.aget_state(self.config))  # fmt: skip
        self.values, self.calls = state.values, waiting_on_signoff(state.interrupts)
        return self.calls

    async def settle(self, client: Any, asked: dict[str, str]) -> None:
        """Resume the thread for those of `asked` no longer pending, and again while a call
        it waits on next is decided already (each read once, on this event)."""
        while asked:
            decided = {i: {"signoff": c} for i, c in asked.items() if (await client.get(c)).status != "pending"}
            if not decided:
                return
            command: Command[Any] = Command(resume=decided)
            if self.sync:
                await asyncio.to_thread(self.graph.invoke, command, self.config)
            else:
                await self.graph.ainvoke(command, self.config)
            before = set(self.calls.values())
            asked = {i: c for i, c in (await self.waiting()).items() if c not in before}
