"""An OpenAI Agents SDK agent whose refunds wait for a person's sign-off in Signoff
(docs/openai-agents.md). Needs `pip install './sdk[openai-agents]'`.

    SIGNOFF_URL=http://127.0.0.1:8080 SIGNOFF_TOKEN=signoff_… \\
        python examples/openai_agents_refund.py --state run-42.json "Refund order 42"

The agent asks for `send_refund`; the call is filed with Signoff and the run stops with
an interruption, saved to `--state` (`RunState.to_json()`). When a person decides on the
card, the saved run is resumed with their decision: approved, the refund runs here, once,
with the arguments they approved (edited ones included); denied, the agent is told why.
Stopped or killed while it waits, run it again with the same `--state`: it resumes the
saved run. Without `--model` a stand-in model asks for one refund (no network); with
`--model gpt-4.1-mini` (and `OPENAI_API_KEY`) a real one does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from signoff_sdk.openai_agents import SignoffApprovals


@function_tool
def send_refund(customer: str, amount: float) -> str:
    """Refund a customer (runs here, once, after a person approved it)."""
    print(f"refunding {amount} to {customer}", flush=True)
    return f"refunded {amount} to {customer}"


class StandInModel(Model):
    """Asks for one refund, then reports what the tool answered."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        items = [] if isinstance(input, str) else [i if isinstance(i, dict) else i.model_dump() for i in input]
        outputs = [str(i.get("output")) for i in items if i.get("type") == "function_call_output"]
        output: list[Any]
        if outputs:
            text = ResponseOutputText(type="output_text", text="; ".join(outputs), annotations=[])
            output = [
                ResponseOutputMessage(id="msg", type="message", role="assistant", status="completed", content=[text])
            ]
        else:
            arguments = json.dumps({"customer": "c-42", "amount": 12.5})
            call = ResponseFunctionToolCall(
                type="function_call", call_id="refund-c-42", name="send_refund", arguments=arguments, status="completed"
            )
            output = [call]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the stand-in model does not stream")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("text", nargs="?", default="Refund order 42")
    parser.add_argument("--state", default="run-42.json", help="where the run waiting on Signoff is saved")
    parser.add_argument("--model", help="an OpenAI model name (default: the stand-in)")
    args = parser.parse_args()

    signoff = SignoffApprovals(thread=Path(args.state).stem)
    agent = Agent(name="billing", model=args.model or StandInModel(), tools=[signoff.gate(send_refund)])
    saved = Path(args.state)
    if not saved.exists():
        result = await Runner.run(agent, args.text)
        if not result.interruptions:
            print(result.final_output, flush=True)
            return
        saved.write_text(json.dumps(result.to_state().to_json()))
        print(f"waiting for a person in Signoff ({len(result.interruptions)} call(s)); saved to {saved}", flush=True)
    result = await signoff.resume(agent, json.loads(saved.read_text()))
    saved.unlink()
    print(result.final_output, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
