"""A LangChain agent whose refunds wait for a person's sign-off in Signoff
(docs/langchain.md). Needs `pip install './sdk[langchain]' langgraph-checkpoint-sqlite`.

    SIGNOFF_URL=http://127.0.0.1:8080 SIGNOFF_TOKEN=signoff_… \\
        python examples/langchain_agent.py --thread order-42 "Refund order 42"

The agent asks for `send_refund`; the call is filed with Signoff and the agent waits
(its pause is in the SQLite checkpointer, `--db`). When a person approves on the card
the refund runs here, once, with the arguments they approved; denied, the agent is told
why; answered in the tool's place, the agent reads the person's answer and nothing runs.
The token needs the scopes `calls:file,requests:read` (the resumer follows the gateway's
event stream). Stopped or killed while it waits, run it again with the same `--thread`: it picks
up the same request. Without `--model` a stand-in model asks for one refund (no network);
with `--model openai:gpt-4.1-mini` (and that provider's package and key) a real one does.
"""

from __future__ import annotations

import argparse
import sqlite3
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from signoff_sdk.langchain import SignoffToolGate
from signoff_sdk.langgraph import SignoffResumer


@tool
def send_refund(customer: str, amount: float) -> str:
    """Refund a customer (runs here, once, after a person approved it)."""
    print(f"refunding {amount} to {customer}", flush=True)
    return f"refunded {amount} to {customer}"


class StandInModel(BaseChatModel):
    """Asks for one refund, then reports what the tool answered."""

    @property
    def _llm_type(self) -> str:
        return "stand-in"

    def bind_tools(self, tools: Any, **kwargs: Any) -> StandInModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            answer = AIMessage(content=str(messages[-1].content))
        else:
            call = {"name": "send_refund", "args": {"customer": "c-42", "amount": 12.5}, "id": "refund-c-42"}
            answer = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=answer)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("text", nargs="?", default="Refund order 42")
    parser.add_argument("--thread", default="order-42", help="the conversation's id (its checkpoints)")
    parser.add_argument("--db", default="agent-checkpoints.sqlite", help="the SQLite checkpointer's file")
    parser.add_argument("--model", help="a chat model for init_chat_model (default: the stand-in)")
    args = parser.parse_args()

    if args.model:
        from langchain.chat_models import init_chat_model

        model: Any = init_chat_model(args.model)
    else:
        model = StandInModel()
    agent = create_agent(
        model,
        [send_refund],
        checkpointer=SqliteSaver(sqlite3.connect(args.db, check_same_thread=False)),
        # The one line that changes: HumanInTheLoopMiddleware(interrupt_on=...) before.
        middleware=[SignoffToolGate(interrupt_on={"send_refund": True})],
    )
    config: Any = {"configurable": {"thread_id": args.thread}}
    if not agent.get_state(config).next:  # a new conversation (else: pick up where it stopped)
        agent.invoke({"messages": [HumanMessage(args.text)]}, config)
    for waiting in agent.get_state(config).interrupts:
        print(f"waiting for a person in Signoff: request {waiting.value['signoff']['request']}", flush=True)
    values = SignoffResumer(agent).resume(config)
    print(values["messages"][-1].content, flush=True)


if __name__ == "__main__":
    main()
