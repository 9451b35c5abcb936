"""LangChain 1.x: `SignoffToolGate`, a drop-in for `HumanInTheLoopMiddleware`
(`pip install './sdk[langchain]'`, docs/langchain.md).

    agent = create_agent(model, tools, checkpointer=saver,
                         middleware=[SignoffToolGate(interrupt_on={"send_refund": True})])

Each gated tool call is filed with Signoff under the model's tool-call id and the
thread id, and the graph pauses with LangGraph's `interrupt()` (the checkpointer keeps
the pause). Whatever `Command(resume=...)` the graph is resumed with, the decision is
taken from the ledger's signed verdict: a resume nobody decided in Signoff pauses again
and runs nothing. Approved, the tool runs once (a `runs: caller` tool here, after a
claim Signoff grants once; a `runs: signoff` tool by Signoff, whose output comes back);
edited, with exactly the arguments the person approved, on the same tool; denied, the
model gets a tool message with the person's reason (`reject`); answered in the tool's
place (`respond`), the tool does not run and the model gets the person's answer as the
tool's result.

`signoff_sdk.langgraph.SignoffResumer` resumes the waiting threads as decisions come.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware, InterruptOnConfig, ToolCallRequest
from langchain_core.messages import ToolMessage
from langgraph.config import get_config
from langgraph.types import Command, interrupt

from . import gate
from .models import FiledShown

# A LangChain decision and Signoff's that stands for it: a person denies on a Signoff card
# what a LangChain reviewer would reject, and answers on the card in the tool's place
# what a reviewer would `respond`.
SIGNOFF_DECISION = {"approve": "approve", "edit": "edit", "reject": "deny", "respond": "respond"}
EDIT_NOTICE = (
    "Note: a person replaced the arguments of this tool call before it ran. The call recorded "
    "in your message is the one you produced, not the one that executed. This was intentional "
    "and authorized. Do not re-issue your original call."
)
NOT_EXECUTED = "The tool was not executed. Do not retry this tool call unless the user explicitly requests it."
ALL: list[Any] = ["approve", "edit", "reject", "respond"]

ToolResult = ToolMessage | Command[Any]


class SignoffToolGate(AgentMiddleware):  # type: ignore[type-arg]
    """`HumanInTheLoopMiddleware`'s arguments (`interrupt_on`: tool name to `True`, `False`
    or an `InterruptOnConfig`), decided in Signoff. `url`, `token` and `origin` default to
    `SIGNOFF_URL`, `SIGNOFF_TOKEN` and `SIGNOFF_ORIGIN` (else `langgraph:<program>`).

    Who may decide, and how (edit, expiry, how many approvers), is the Signoff operator's
    catalogue; `allowed_decisions` only narrows what this agent accepts: an edit it does
    not allow is not run. A denial reaches the model as `reject` would (a tool message
    with the person's reason, status error); an answer in the tool's place as `respond`
    would (a tool message with the person's answer, status success; the tool did not
    run), or, for a tool that does not allow `respond`, as a rejection with the answer
    as its reason."""

    def __init__(
        self,
        interrupt_on: dict[str, bool | InterruptOnConfig],
        *,
        description_prefix: str = "Tool execution requires approval",
        edit_notice: str | None = EDIT_NOTICE,
        interrupt_mode: str = "per_call",
        url: str | None = None,
        token: str | None = None,
        origin: str | None = None,
        ledger_key: str | None = None,
        lease_seconds: int = 120,
    ) -> None:
        super().__init__()
        # Each call is filed and paused on its own: `batched` is taken and means the same.
        if interrupt_mode not in ("batched", "per_call"):
            raise ValueError(f"`interrupt_mode` must be 'batched' or 'per_call', got {interrupt_mode!r}.")
        self.interrupt_on: dict[str, InterruptOnConfig] = {}
        for name, config in interrupt_on.items():
            if config is True:
                self.interrupt_on[name] = InterruptOnConfig(allowed_decisions=list(ALL))
            elif isinstance(config, dict):
                if not config.get("allowed_decisions"):
                    raise ValueError(f"Invalid `interrupt_on` config for tool {name!r}: `allowed_decisions` is empty.")
                self.interrupt_on[name] = config
        self.description_prefix = description_prefix
        self.edit_notice = edit_notice
        self.connection = gate.Connection(url, token, origin, ledger_key, lease_seconds=lease_seconds, kind="langgraph")

    # --- the middleware's hooks ------------------------------------------------------------

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]) -> ToolResult:
        config = self._gated(request)
        if config is None:
            return handler(request)
        call = self._filing(request, config)

        def run(arguments: dict[str, Any]) -> gate.Ran:
            return _ran(handler(_with(request, arguments)))

        settled = gate.drive(gate.settle(call, _allowed(config)), self.connection, pause=self._pause(request), run=run)
        return self._answer(request, config, settled)

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolResult]]
    ) -> ToolResult:
        config = self._gated(request)
        if config is None:
            return await handler(request)
        call = self._filing(request, config)

        async def run(arguments: dict[str, Any]) -> gate.Ran:
            return _ran(await handler(_with(request, arguments)))

        settled = await gate.adrive(
            gate.settle(call, _allowed(config)), self.connection, pause=self._pause(request), run=run
        )
        return self._answer(request, config, settled)

    # --- the parts -------------------------------------------------------------------------

    def _gated(self, request: ToolCallRequest) -> InterruptOnConfig | None:
        config = self.interrupt_on.get(request.tool_call["name"])
        when = config.get("when") if config is not None else None
        if config is None or (when is not None and not when(request)):
            return None
        return config

    def _filing(self, request: ToolCallRequest, config: InterruptOnConfig) -> gate.File:
        tool_call = request.tool_call
        if not tool_call.get("id"):
            raise ValueError(f"Tool call `{tool_call['name']}` has no id: Signoff files a call by its id.")
        thread = (get_config().get("configurable") or {}).get("thread_id")
        return gate.File(
            tool=tool_call["name"],
            arguments=dict(tool_call["args"]),
            call_id=str(tool_call["id"]),
            thread=None if thread is None else str(thread),
            summary=_summary(config.get("description")),
        )

    def _pause(self, request: ToolCallRequest) -> Callable[[FiledShown], Any]:
        tool_call = request.tool_call

        def pause(filed: FiledShown) -> Any:
            # The value is `per_call` HITL's `ToolApprovalRequest`, with where Signoff has it:
            # what the graph is resumed with is not read.
            return interrupt(
                {
                    "type": "tool_approval",
                    "tool_call_id": tool_call["id"],
                    "name": tool_call["name"],
                    "args": tool_call["args"],
                    "description": f"{self.description_prefix}: decided in Signoff",
                    "signoff": signoff_of(filed),
                }
            )

        return pause

    def _answer(self, request: ToolCallRequest, config: InterruptOnConfig, settled: gate.Settled) -> ToolResult:
        tool_call = request.tool_call
        name, call_id = tool_call["name"], str(tool_call["id"])
        if settled.ran:
            return self._noted(settled.result, settled) if isinstance(settled.result, ToolMessage) else settled.result
        if settled.refused is not None:
            return ToolMessage(content=f"Not run: {settled.refused}.", name=name, tool_call_id=call_id, status="error")
        if settled.closure == "output":
            return self._noted(ToolMessage(content=_content(settled.output), name=name, tool_call_id=call_id), settled)
        if settled.decision == "respond" and "respond" in config["allowed_decisions"]:
            # HITL's `respond`: the person's answer is the tool's result; the tool never ran.
            return ToolMessage(content=settled.message, name=name, tool_call_id=call_id, status="success")
        if settled.decision in ("deny", "respond"):
            reason = settled.reason if settled.decision == "deny" else settled.message
            said = f" with reason: {reason}" if reason else ""
            text = f"User rejected the tool call for `{name}`{said}"
            if not said:
                text += (
                    ". The tool was not executed. Do not retry this tool call unless the user explicitly requests it."
                )
            return ToolMessage(content=text, name=name, tool_call_id=call_id, status="error")
        reason = f": {settled.reason}" if settled.reason else ""
        text = f"The tool call for `{name}` was not completed: Signoff closed it as {settled.closure}{reason}"
        return ToolMessage(content=text, name=name, tool_call_id=call_id, status="error")

    def _noted(self, message: ToolMessage, settled: gate.Settled) -> ToolMessage:
        if not settled.edited or not self.edit_notice or not isinstance(message.content, str):
            return message
        notice = f"{self.edit_notice} Executed with arguments {json.dumps(settled.arguments, default=str)}."
        return message.model_copy(update={"content": f"{notice}\n\nTool response:\n{message.content}"})


def signoff_of(filed: FiledShown) -> dict[str, Any]:
    """What an interrupt says of the Signoff call it waits on (the resumer reads `call`)."""
    return {"call": filed.id, "request": filed.request_id, "status": filed.status, "expires_at": str(filed.expires_at)}


def _allowed(config: InterruptOnConfig) -> set[str]:
    return {SIGNOFF_DECISION[d] for d in config["allowed_decisions"] if d in SIGNOFF_DECISION}


def _with(request: ToolCallRequest, arguments: dict[str, Any]) -> ToolCallRequest:
    """The same tool, with the arguments a person approved (never another tool)."""
    return request.override(tool_call={**request.tool_call, "args": arguments})


def _ran(result: ToolResult) -> gate.Ran:
    """What Signoff records of the tool's run: its message's content, or its error."""
    message = result if isinstance(result, ToolMessage) else _message_in(result)
    if message is None:
        return gate.Ran(result=result, output=None)
    if message.status == "error":
        return gate.Ran(result=result, error=_content(message.content)[:4000])
    return gate.Ran(result=result, output=message.content)


def _message_in(command: Command[Any]) -> ToolMessage | None:
    update = command.update if isinstance(command.update, dict) else {}
    return next((m for m in update.get("messages", []) if isinstance(m, ToolMessage)), None)


def _content(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, default=str)


def _summary(description: Any) -> str | None:
    """A static description, as the card's one-line summary (300 characters at most)."""
    if not isinstance(description, str):
        return None
    line = " ".join(description.split())
    return line[:300] or None
