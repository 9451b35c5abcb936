"""The OpenAI Agents SDK on Signoff (`pip install './sdk[openai-agents]'`,
docs/openai-agents.md).

    signoff = SignoffApprovals()                       # SIGNOFF_URL, SIGNOFF_TOKEN
    agent = Agent(name="billing", tools=[signoff.gate(send_refund)])
    result = await Runner.run(agent, "Refund order 42")
    saved = result.to_state().to_json()                # keep it; the process may end here
    ...
    result = await signoff.resume(agent, saved)        # when the people have decided

`gate(tool)` makes a function tool need approval (`needs_approval`, which files the call
with Signoff under the model's call id) and wraps its body: the body runs only for a call
Signoff approved, with exactly the arguments a person approved (edited ones included,
through the claim of a `runs: caller` tool), once; a `runs: signoff` tool's output is
Signoff's. `resolve(state)` waits for the decisions of `state`'s interruptions and applies
them (`approve()`, or `reject()` with the person's reason; a person's answer in the tool's
place, `respond`, is a `reject()` whose message is their answer, which the SDK hands the
model verbatim as the tool's output: the SDK has no decision of its own for it); `resume(agent, saved)` loads a
saved `RunState` (`to_json()`), resolves it and runs on until the run no longer waits on
Signoff. Approving an interruption by hand does not run a gated body: it runs only after
Signoff's signed approval.

A tool given only `needs_approval=signoff.needs_approval(name)` (not wrapped) cannot take
edited arguments, which this SDK cannot express: an edited approval of it is rejected
here, and the operator should make such tools not editable on the card.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

from agents import Agent, FunctionTool, RunContextWrapper, Runner, RunResult, RunState
from agents.tool_context import ToolContext

from . import gate as steps
from .models import FiledShown

NOT_DECIDED = "Signoff has no decision on this call: nothing ran"


class NotDecided(RuntimeError):
    """A gated body was invoked for a call no person has decided in Signoff."""


class SignoffApprovals:
    """Signoff behind the SDK's approvals. `url`, `token` and `origin` default to
    `SIGNOFF_URL`, `SIGNOFF_TOKEN` and `SIGNOFF_ORIGIN` (else `openai-agents:<program>`);
    `thread`: the run's id on the cards."""

    def __init__(
        self,
        *,
        url: str | None = None,
        token: str | None = None,
        origin: str | None = None,
        ledger_key: str | None = None,
        thread: str | None = None,
        lease_seconds: int = 120,
    ) -> None:
        self.connection = steps.Connection(
            url, token, origin, ledger_key, lease_seconds=lease_seconds, kind="openai-agents"
        )
        self.thread = thread
        self.wrapped: set[str] = set()

    # --- the tool side -----------------------------------------------------------------------

    def needs_approval(self, tool: str) -> Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]:
        """A `needs_approval` callable for `tool`: files the call with Signoff (once, by the
        model's call id) and asks the SDK to pause for it."""

        async def needs(context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str) -> bool:
            async with self.connection.client() as client:
                await steps.perform(client, self.connection, self._filing(tool, arguments, call_id))
                self.connection.remember(client)
            return True

        return needs

    def gate(self, tool: FunctionTool) -> FunctionTool:
        """`tool`, needing Signoff's approval, its body run only as Signoff decided."""
        body = tool.on_invoke_tool
        self.wrapped.add(tool.name)

        async def invoke(context: ToolContext[Any], arguments_json: str) -> Any:
            filing = self._filing(tool.name, json.loads(arguments_json or "{}"), context.tool_call_id)

            async def run(approved: dict[str, Any]) -> steps.Ran:
                output = await body(context, json.dumps(approved))
                return steps.Ran(result=output, output=output)

            settled = await steps.adrive(steps.settle(filing), self.connection, pause=_not_decided, run=run)
            if settled.ran:
                return settled.result
            if settled.closure == "output":
                return settled.output
            if settled.decision == "respond":
                return settled.message  # the person answered in the tool's place; the body never ran
            raise NotDecided(f"Signoff closed the call as {settled.closure or settled.decision}: {settled.reason}")

        return dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=self.needs_approval(tool.name))

    # --- the run side --------------------------------------------------------------------------

    async def resolve(self, state: RunState[Any], *, timeout: float | None = None) -> RunState[Any]:
        """Wait until a person decided each of `state`'s interruptions in Signoff, and apply
        each decision to `state`: approve, reject with the person's reason, or, answered in
        the tool's place, reject with the person's answer as the tool's output (an edit of
        a tool that is not gated here is rejected: its arguments cannot be changed)."""
        async with asyncio.timeout(timeout), self.connection.client() as client:
            for item in state.get_interruptions():
                arguments = json.loads(item.arguments or "{}")
                filing = self._filing(str(item.tool_name), arguments, str(_call_id(item)))
                filed: FiledShown = await steps.perform(client, self.connection, filing)
                while filed.status == "pending":
                    filed = await client.wait(filed.id)
                verdict = await steps.checked_verdict(client, filed)
                if verdict is None:
                    closure = filed.closure.kind if filed.closure else filed.status
                    state.reject(item, rejection_message=f"Signoff closed the call as {closure}; it did not run.")
                elif verdict.decision == "deny":
                    state.reject(item, rejection_message=f"A person denied the call: {verdict.reason}")
                elif verdict.decision == "respond":
                    state.reject(item, rejection_message=verdict.message)
                elif verdict.arguments != arguments and item.tool_name not in self.wrapped:
                    state.reject(item, rejection_message="Approved with edited arguments, which this tool cannot take.")
                else:
                    state.approve(item)
            self.connection.remember(client)
        return state

    async def resume(
        self, agent: Agent[Any], saved: dict[str, Any] | str | RunState[Any], *, timeout: float | None = None
    ) -> RunResult:
        """Pick a saved run up (`RunState.to_json()`, `to_string()`, or the state), apply
        Signoff's decisions and run on, until the run waits on Signoff no more."""
        if isinstance(saved, RunState):
            state = saved
        elif isinstance(saved, str):
            state = await RunState.from_string(agent, saved)
        else:
            state = await RunState.from_json(agent, saved)
        while True:
            result = await Runner.run(agent, await self.resolve(state, timeout=timeout))
            if not result.interruptions:
                return result
            state = result.to_state()

    def _filing(self, tool: str, arguments: dict[str, Any], call_id: str) -> steps.File:
        return steps.File(tool, dict(arguments), call_id, self.thread, None)


def _not_decided(filed: FiledShown) -> Any:
    raise NotDecided(f"{NOT_DECIDED} (call {filed.id} waits on a person)")


def _call_id(item: Any) -> str | None:
    raw = item.raw_item
    return raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
