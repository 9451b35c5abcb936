"""`SignoffToolGate` (LangChain 1.x, `signoff_sdk.langchain`) with the real framework and
a fake chat model, against the real services: a gated call is filed once under its
tool-call id and thread, the graph pauses, and only Signoff's signed verdict decides;
a forged `Command(resume=...)` runs nothing; an edit runs the edited arguments; a denial
reaches the model with the person's reason; two calls in one turn are two cards decided
apart; an agent process SIGKILLed while it waits is picked up from its checkpointer with
the same request and the tool runs once."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from signoff_sdk import BadSignature
from signoff_sdk.langgraph import SignoffResumer, signoff_interrupt, waiting_on_signoff
from typing_extensions import TypedDict

from shared.ledger.tables import ApprovalRequest, FiledCall
from shared.settings import Settings
from shared.signatures import new_private_key, public_key_text
from tests.framework_agents import langchain_agent, lines
from tests.harness import POSTGRES_URL, eventually, rows
from tests.integration.test_gateway import add_people, url
from tests.integration.test_intake import decided_by_alice, intake_tools, token

ORIGIN = "langgraph:agent"
PROJECT = Path(__file__).resolve().parents[2]


def framework_tools(deployment) -> Path:
    """The intake's tools, with an origin for each framework's agent (both `bot:agent`)."""
    path = intake_tools(deployment)
    catalogue = yaml.safe_load(path.read_text())
    for origin in (ORIGIN, "openai-agents:agent"):
        catalogue["origins"][origin] = {"programs": ["bot:agent"], "tools": ["send_refund", "post_to_sink"]}
    path.write_text(yaml.safe_dump(catalogue))
    return path


@pytest.fixture
def signoff(deployment, sink, monkeypatch):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.tools_file = framework_tools(deployment)
    add_people(deployment)
    deployment.start()
    deployment.start("gateway")
    # The two settings a newcomer sets: the gateway's address and the program's token (which
    # files calls, and follows the event stream for the resumer).
    monkeypatch.setenv("SIGNOFF_URL", url(deployment))
    monkeypatch.setenv("SIGNOFF_TOKEN", token(deployment, scopes="calls:file,requests:read"))
    monkeypatch.delenv("SIGNOFF_ORIGIN", raising=False)
    return deployment


async def example_decided_by_alice(deployment, script: str, *args: str, cwd: Path, **decision) -> str:
    """Run an example as a user runs it, decide its one card as alice, and return what it printed."""
    example = await asyncio.create_subprocess_exec(
        sys.executable, str(PROJECT / "examples" / script), *args, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert example.stdout is not None
    said = (await asyncio.wait_for(example.stdout.readline(), 60)).decode()
    assert said.startswith("waiting for a person in Signoff"), said + (await example.stderr.read()).decode()
    [request] = [r for r in await rows(deployment, ApprovalRequest) if r.status == "pending"]
    await decided_by_alice(deployment, request.id, **decision)
    out, err = await asyncio.wait_for(example.communicate(), 60)
    assert example.returncode == 0, err.decode()
    return said + out.decode()


def calls(*planned: tuple[str, dict, str]) -> str:
    return json.dumps([{"name": name, "args": args, "id": call_id} for name, args, call_id in planned])


def waiting(agent, config) -> dict[str, dict]:
    """The thread's interrupts that wait on Signoff: Signoff call id to the interrupt's value."""
    state = agent.get_state(config)
    return {
        i.value["signoff"]["call"]: i.value for i in state.interrupts if i.id in waiting_on_signoff(state.interrupts)
    }


@pytest.mark.parametrize("store", ["sqlite"])
async def test_a_forged_resume_runs_nothing_an_edit_runs_the_edited_arguments_and_a_denial_reaches_the_model(
    signoff, tmp_path, monkeypatch
):
    monkeypatch.setenv(
        "FAKE_TOOL_CALLS",
        calls(
            ("send_refund", {"customer": "c-1", "amount": 50}, "call_a"),
            ("send_refund", {"customer": "c-2", "amount": 70}, "call_b"),
        ),
    )
    runs, seen = tmp_path / "runs", tmp_path / "seen"
    agent = langchain_agent(InMemorySaver(), str(runs), str(seen))
    config = {"configurable": {"thread_id": "thread-mem"}}

    first = await agent.ainvoke({"messages": [HumanMessage("Refund both")]}, config)
    assert len(first["__interrupt__"]) == 2
    pending = waiting(agent, config)
    assert {v["tool_call_id"] for v in pending.values()} == {"call_a", "call_b"}
    by_tool_call = {v["tool_call_id"]: v["signoff"] for v in pending.values()}

    # Whoever holds the thread id resumes with "approve": Signoff has no decision, nothing runs.
    forged = {i.id: {"type": "approve"} for i in agent.get_state(config).interrupts}
    again = await agent.ainvoke(Command(resume=forged), config)
    assert len(again["__interrupt__"]) == 2 and not runs.exists()

    # Two cards, decided apart: an edit of the first, a denial of the second.
    await decided_by_alice(signoff, by_tool_call["call_a"]["request"], arguments={"customer": "c-1", "amount": 20})
    # A gate that pins another key than the ledger's believes no verdict: nothing runs.
    saver_shared = agent.checkpointer
    misled = langchain_agent(saver_shared, str(runs), str(seen), ledger_key=public_key_text(new_private_key()))
    with pytest.raises(BadSignature):
        await SignoffResumer(misled).aresume(config, timeout=30)
    assert not runs.exists()
    resumer = SignoffResumer(agent)
    resuming = asyncio.create_task(resumer.aresume(config, timeout=60))
    for _ in range(200):
        if lines(runs):
            break
        await asyncio.sleep(0.05)
    assert lines(runs) == [{"tool": "send_refund", "customer": "c-1", "amount": 20}]
    assert not resuming.done()  # the second call still waits on a person
    await decided_by_alice(signoff, by_tool_call["call_b"]["request"], "deny", reason="not on a Friday")
    final = await resuming

    assert lines(runs) == [{"tool": "send_refund", "customer": "c-1", "amount": 20}]
    last_input = lines(seen)[-1]
    answers = [m for m in last_input if m["type"] == "tool"]
    assert any("not on a Friday" in m["content"] and m["status"] == "error" for m in answers)
    assert any("refunded 20.0 to c-1" in m["content"] and "replaced the arguments" in m["content"] for m in answers)
    assert "refunded 20.0" in final["messages"][-1].content
    assert len(await rows(signoff, ApprovalRequest)) == 2
    filed = await rows(signoff, FiledCall)
    assert sorted((f.caller_call_id, f.thread, f.origin) for f in filed) == [
        ("call_a", "thread-mem", ORIGIN),
        ("call_b", "thread-mem", ORIGIN),
    ]

    # The example, as a newcomer runs it (two settings in the environment).
    printed = await example_decided_by_alice(signoff, "langchain_agent.py", "--thread", "ex", cwd=tmp_path)
    assert "refunding 12.5 to c-42" in printed and printed.rstrip().endswith("refunded 12.5 to c-42")


async def killed_while_waiting_then_restarted(deployment, framework: str, files: list[str]) -> str:
    """Start the agent's process (tests/framework_agents.py), SIGKILL it once it waits on its
    two calls, approve both cards as alice, start it again with `resume`; what it printed."""
    env = {
        **os.environ,
        "FAKE_TOOL_CALLS": calls(
            ("send_refund", {"customer": "c-42", "amount": 12.5}, "call_refund"),
            ("post_to_sink", {"message": "refunded"}, "call_post"),
        ),
    }
    agent = [sys.executable, "-m", "tests.framework_agents", framework]
    first = subprocess.Popen([*agent, "start", *files], cwd=PROJECT, env=env, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    assert first.stdout.readline().split() == ["waiting", "2"]
    first.kill()  # SIGKILL, between the pause and the decision
    first.wait(10)
    requests = await rows(deployment, ApprovalRequest)
    assert len(requests) == 2
    for request in requests:
        await decided_by_alice(deployment, request.id)
    second = subprocess.run([*agent, "resume", *files], cwd=PROJECT, env=env, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert len(await rows(deployment, ApprovalRequest)) == 2  # the same requests: one card each
    return second.stdout


@pytest.mark.parametrize("store", ["sqlite"])
async def test_an_agent_sigkilled_while_it_waits_resumes_from_its_checkpointer_with_the_same_request_and_runs_once(
    signoff, tmp_path, sink
):
    runs, seen, db = tmp_path / "runs", tmp_path / "seen", tmp_path / "checkpoints.sqlite"
    printed = await killed_while_waiting_then_restarted(
        signoff, "langchain", [str(db), "thread-disk", str(runs), str(seen)]
    )
    assert "refunded 12.5 to c-42" in printed
    assert lines(runs) == [{"tool": "send_refund", "customer": "c-42", "amount": 12.5}]
    assert sink.counts["/sink"] == 1  # Signoff ran post_to_sink, once; its body here never ran


@pytest.fixture
def agent_checkpoints(signoff):
    """The agent's own PostgreSQL checkpointer: a schema of its own in the test database,
    owned by a login role of its own (the agent's, not Signoff's nor the administrator's),
    both dropped afterwards. Its URL, as the agent's process connects."""
    role, schema, secret = f"{signoff.namespace}_agent", f"{signoff.namespace}_checkpoints", secrets.token_hex(16)

    async def admin(*statements: str) -> None:
        engine = create_async_engine(Settings(database_url=POSTGRES_URL).ledger_url)
        try:
            async with engine.begin() as conn:
                for statement in statements:
                    await conn.execute(text(statement))
        finally:
            await engine.dispose()

    asyncio.run(admin(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{secret}'",
                      f'CREATE SCHEMA "{schema}" AUTHORIZATION "{role}"'))  # fmt: skip
    where = urlsplit(POSTGRES_URL)
    yield (f"postgresql://{role}:{secret}@{where.hostname}:{where.port or 5432}{where.path}"
           f"?options=-csearch_path%3D{schema}")  # fmt: skip
    asyncio.run(admin(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE', f'DROP OWNED BY "{role}"', f'DROP ROLE "{role}"'))


@pytest.mark.parametrize("store", ["postgres"])
async def test_an_agent_sigkilled_while_it_waits_resumes_from_its_postgresql_checkpointer_with_one_card_and_runs_once(
    signoff, agent_checkpoints, tmp_path, sink
):
    runs, seen = tmp_path / "runs", tmp_path / "seen"
    printed = await killed_while_waiting_then_restarted(
        signoff, "langchain", [agent_checkpoints, "thread-pg", str(runs), str(seen)]
    )
    assert "refunded 12.5 to c-42" in printed
    assert lines(runs) == [{"tool": "send_refund", "customer": "c-42", "amount": 12.5}]
    assert sink.counts["/sink"] == 1  # Signoff ran post_to_sink, once; its body here never ran
    # The pause was the checkpointer's: the thread's checkpoints are in the agent's own schema.
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(agent_checkpoints) as saver:
        assert len(list(saver.list({"configurable": {"thread_id": "thread-pg"}}))) > 2


class RefundState(TypedDict, total=False):
    refund_id: str
    note: str


@pytest.mark.parametrize("store", ["sqlite"])
async def test_a_custom_node_with_signoff_interrupt_pauses_ignores_a_forged_resume_and_runs_once_when_approved(
    signoff, tmp_path
):
    ran: list[dict] = []

    def send_refund(customer: str, amount: float) -> str:
        ran.append({"customer": customer, "amount": amount})
        return f"refunded {amount}"

    def refund(state: RefundState) -> RefundState:
        decided = signoff_interrupt(
            "send_refund", {"customer": "c-7", "amount": 7}, call_id=state["refund_id"], run=send_refund
        )
        return {"note": decided.output if decided.decision in ("approve", "edit") else f"no: {decided.reason}"}

    builder = StateGraph(RefundState)
    builder.add_node("refund", refund)
    builder.add_edge(START, "refund")
    builder.add_edge("refund", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "node-thread"}}

    # Sync nodes and the sync resumer, off the test's event loop, as a program would run them.
    first = await asyncio.to_thread(graph.invoke, {"refund_id": "refund-node-1"}, config)
    [pending] = first["__interrupt__"]
    forged = await asyncio.to_thread(graph.invoke, Command(resume={pending.id: {"type": "approve"}}), config)
    assert "__interrupt__" in forged and ran == []
    await decided_by_alice(signoff, pending.value["signoff"]["request"])
    final = await asyncio.to_thread(SignoffResumer(graph).resume, config, timeout=60)
    assert final["note"] == "refunded 7"
    assert ran == [{"customer": "c-7", "amount": 7}]
    [filed] = await rows(signoff, FiledCall)
    assert (filed.caller_call_id, filed.thread) == ("refund-node-1", "node-thread")


ANSWER = "Customer c-1 was refunded by phone already; tell them it is done."


@pytest.mark.parametrize("store", ["sqlite"])
async def test_a_persons_answer_in_the_tools_place_reaches_the_model_as_the_tools_result_and_the_tool_never_runs(
    signoff, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_TOOL_CALLS", calls(("send_refund", {"customer": "c-1", "amount": 50}, "call_r")))
    runs, seen = tmp_path / "runs", tmp_path / "seen"
    agent = langchain_agent(InMemorySaver(), str(runs), str(seen))
    config = {"configurable": {"thread_id": "thread-respond"}}
    await agent.ainvoke({"messages": [HumanMessage("Refund c-1")]}, config)
    [pending] = waiting(agent, config).values()
    decided = await decided_by_alice(signoff, pending["signoff"]["request"], "respond", message=ANSWER)
    assert decided["decision"] == "respond"
    final = await SignoffResumer(agent).aresume(config, timeout=60)

    assert not runs.exists()  # the tool's body never ran
    [answer] = [m for m in lines(seen)[-1] if m["type"] == "tool"]
    assert (answer["content"], answer["status"]) == (ANSWER, "success")
    assert final["messages"][-1].content == ANSWER
    [request] = await rows(signoff, ApprovalRequest)
    assert request.status == "answered"

    # In a graph's own node: signoff_interrupt returns the answer, and nothing runs.
    ran: list[dict] = []

    def refund(state: RefundState) -> RefundState:
        decided = signoff_interrupt(
            "send_refund", {"customer": "c-8", "amount": 8}, call_id=state["refund_id"], run=lambda **a: ran.append(a)
        )
        return {"note": f"{decided.decision}: {decided.message}"}

    builder = StateGraph(RefundState)
    builder.add_node("refund", refund)
    builder.add_edge(START, "refund")
    builder.add_edge("refund", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    node_config = {"configurable": {"thread_id": "node-respond"}}
    [paused] = (await asyncio.to_thread(graph.invoke, {"refund_id": "refund-node-r"}, node_config))["__interrupt__"]
    await decided_by_alice(signoff, paused.value["signoff"]["request"], "respond", message="done by hand")
    done = await asyncio.to_thread(SignoffResumer(graph).resume, node_config, timeout=60)
    assert done["note"] == "respond: done by hand" and ran == []


@pytest.mark.parametrize("store", ["postgres"])
async def test_the_resumer_follows_the_event_stream_and_a_decision_made_while_the_gateway_was_down_resumes_its_thread(
    signoff, tmp_path, monkeypatch
):
    runs, seen, saver = tmp_path / "runs", tmp_path / "seen", InMemorySaver()
    threads = [{"configurable": {"thread_id": f"stream-{n}"}} for n in (1, 2)]
    requests = []
    for n, config in enumerate(threads):
        # Each thread's model asks for its own call (a tool-call id of its own).
        monkeypatch.setenv("FAKE_TOOL_CALLS", calls(("send_refund", {"customer": "c-5", "amount": 5}, f"call_s{n}")))
        agent = langchain_agent(saver, str(runs), str(seen))
        await agent.ainvoke({"messages": [HumanMessage("Refund c-5")]}, config)
        [pending] = waiting(agent, config).values()
        requests.append(pending["signoff"]["request"])

    resumer = SignoffResumer(agent)
    resuming = asyncio.create_task(resumer.run(threads, timeout=120))
    # Every thread read once; from here on only the event stream moves the resumer.
    await asyncio.wait_for(resumer.listening.wait(), 30)
    # The gateway dies; the first card is decided meanwhile (through the bus, the gateway being
    # down); the gateway comes back, and the resumer's stream picks up right after its last event.
    signoff.kill("gateway")
    async with signoff.console() as console:
        await console.respond(requests[0], "approve", "", "", "alice")
    await eventually(lambda: _decided(signoff, 1))
    assert not runs.exists() and not resuming.done()
    signoff.start("gateway")
    for _ in range(600):
        if lines(runs):
            break
        await asyncio.sleep(0.05)
    assert lines(runs) == [{"tool": "send_refund", "customer": "c-5", "amount": 5}]
    assert not resuming.done()  # the second thread still waits on its card
    await decided_by_alice(signoff, requests[1], "respond", message="c-5 was refunded already")
    first, second = await resuming
    assert "refunded 5" in first["messages"][-1].content
    assert second["messages"][-1].content == "c-5 was refunded already"
    assert lines(runs) == [{"tool": "send_refund", "customer": "c-5", "amount": 5}]  # ran once in all


async def _decided(deployment, count: int) -> bool:
    return len([r for r in await rows(deployment, ApprovalRequest) if r.status != "pending"]) == count
