"""Agents built with the real frameworks for the adapters' tests, with fake models (no
network): a LangChain `create_agent` agent and an OpenAI Agents SDK agent, each with a
`runs: caller` tool (`send_refund`, whose body appends a line to a file, so a test counts
how many times it ran, across processes) and a `runs: signoff` one (`post_to_sink`).

Run as a program it is the agent's process, which a test SIGKILLs and starts again:

    python -m tests.framework_agents langchain start|resume DB THREAD RUNS SEEN
        (DB: a SQLite file, or a `postgresql://` URL: a PostgreSQL checkpointer)
    python -m tests.framework_agents openai-agents start|resume STATE RUNS SEEN

(`SIGNOFF_URL` and `SIGNOFF_TOKEN` in the environment; `FAKE_TOOL_CALLS`: the calls the
model asks for first, as JSON.) `start` runs the agent until it waits on Signoff, prints
`waiting`, and waits for the decisions; `resume` picks the run up from the checkpointer (or
the saved run state) and prints the final answer.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from pydantic import Field

DEFAULT_CALLS = [{"name": "send_refund", "args": {"customer": "c-42", "amount": 12.5}, "id": "call_refund_1"}]


def planned_calls() -> list[dict[str, Any]]:
    return json.loads(os.environ.get("FAKE_TOOL_CALLS") or json.dumps(DEFAULT_CALLS))


def record(path: str | None, line: Any) -> None:
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


def lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- LangChain ------------------------------------------------------------------------------


class ScriptedChatModel(BaseChatModel):
    """Asks for `calls` on the user's message, answers in words once every tool answered,
    and writes down what it was given each time (`seen`, a file)."""

    calls: list[dict[str, Any]] = Field(default_factory=planned_calls)
    seen: str | None = None

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        record(
            self.seen, [{"type": m.type, "content": m.content, "status": getattr(m, "status", None)} for m in messages]
        )
        if isinstance(messages[-1], ToolMessage):
            answer = AIMessage(content="; ".join(str(m.content) for m in messages if isinstance(m, ToolMessage)))
        else:
            answer = AIMessage(content="", tool_calls=self.calls)
        return ChatResult(generations=[ChatGeneration(message=answer)])


def langchain_tools(runs: str | None):
    @tool
    def send_refund(customer: str, amount: float) -> str:
        """Refund a customer."""
        record(runs, {"tool": "send_refund", "customer": customer, "amount": amount})
        return f"refunded {amount} to {customer}"

    @tool
    def post_to_sink(message: str) -> str:
        """Post a message (Signoff runs it: this body never runs)."""
        record(runs, {"tool": "post_to_sink", "message": message})
        return "posted here"

    return [send_refund, post_to_sink]


def langchain_agent(checkpointer: Any, runs: str | None, seen: str | None, ledger_key: str | None = None):
    from langchain.agents import create_agent
    from signoff_sdk.langchain import SignoffToolGate

    return create_agent(
        ScriptedChatModel(seen=seen),
        langchain_tools(runs),
        checkpointer=checkpointer,
        middleware=[SignoffToolGate(interrupt_on={"send_refund": True, "post_to_sink": True}, ledger_key=ledger_key)],
    )


def langchain_process(command: str, db: str, thread: str, runs: str, seen: str) -> None:
    import contextlib
    import sqlite3

    with contextlib.ExitStack() as stack:
        if db.startswith("postgresql://"):
            from langgraph.checkpoint.postgres import PostgresSaver

            saver: Any = stack.enter_context(PostgresSaver.from_conn_string(db))
            saver.setup()  # its tables, once (idempotent)
        else:
            from langgraph.checkpoint.sqlite import SqliteSaver

            saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
        langchain_run(command, saver, thread, runs, seen)


def langchain_run(command: str, saver: Any, thread: str, runs: str, seen: str) -> None:
    from langchain_core.messages import HumanMessage
    from signoff_sdk.langgraph import SignoffResumer, waiting_on_signoff

    agent = langchain_agent(saver, runs, seen)
    config = {"configurable": {"thread_id": thread}}
    if command == "start":
        agent.invoke({"messages": [HumanMessage("Refund order 42")]}, config)
        print("waiting", len(waiting_on_signoff(agent.get_state(config).interrupts)), flush=True)
    values = SignoffResumer(agent).resume(config)
    print("answer", json.dumps(values["messages"][-1].content), flush=True)


# --- OpenAI Agents SDK -------------------------------------------------------------------------


def scripted_model(seen: str | None):
    from agents import Model, ModelResponse, Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    class ScriptedModel(Model):
        """Asks for the planned calls on the user's message, answers in words once every
        call has an output, and writes down what it was given each time (`seen`)."""

        async def get_response(self, system_instructions, input, *args: Any, **kwargs: Any) -> ModelResponse:
            items = [input] if isinstance(input, str) else list(input)
            given = [i if isinstance(i, dict) else i.model_dump() for i in items if not isinstance(i, str)]
            record(seen, given)
            outputs = [i for i in given if i.get("type") == "function_call_output"]
            if outputs:
                text = "; ".join(str(o.get("output")) for o in outputs)
                content = [ResponseOutputText(type="output_text", text=text, annotations=[])]
                output: list[Any] = [
                    ResponseOutputMessage(
                        id="msg_1", type="message", role="assistant", status="completed", content=content
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        id=f"fc_{c['id']}",
                        call_id=c["id"],
                        name=c["name"],
                        arguments=json.dumps(c["args"]),
                        status="completed",
                    )
                    for c in planned_calls()
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any):
            raise NotImplementedError

    return ScriptedModel()


def openai_agent(runs: str | None, seen: str | None, signoff: Any):
    from agents import Agent, function_tool

    @function_tool
    def send_refund(customer: str, amount: float) -> str:
        """Refund a customer."""
        record(runs, {"tool": "send_refund", "customer": customer, "amount": amount})
        return f"refunded {amount} to {customer}"

    @function_tool
    def post_to_sink(message: str) -> str:
        """Post a message (Signoff runs it: this body never runs)."""
        record(runs, {"tool": "post_to_sink", "message": message})
        return "posted here"

    return Agent(
        name="billing", model=scripted_model(seen), tools=[signoff.gate(send_refund), signoff.gate(post_to_sink)]
    )


def openai_agents_process(command: str, state_file: str, runs: str, seen: str) -> None:
    import asyncio

    from agents import Runner

    from signoff_sdk.openai_agents import SignoffApprovals

    signoff = SignoffApprovals(thread="run-1")
    agent = openai_agent(runs, seen, signoff)

    async def main() -> None:
        if command == "start":
            result = await Runner.run(agent, "Refund order 42")
            Path(state_file).write_text(json.dumps(result.to_state().to_json()))
            print("waiting", len(result.interruptions), flush=True)
            await signoff.resolve(result.to_state())  # killed here, before anyone decides
        result = await signoff.resume(agent, json.loads(Path(state_file).read_text()))
        print("answer", json.dumps(result.final_output), flush=True)

    asyncio.run(main())


if __name__ == "__main__":
    framework, *rest = sys.argv[1:]
    if framework == "langchain":
        langchain_process(*rest)
    elif framework == "openai-agents":
        openai_agents_process(*rest)
    else:
        raise SystemExit(f"no such agent: {framework}")
