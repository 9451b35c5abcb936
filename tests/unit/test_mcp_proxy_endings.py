"""How the proxy tells an MCP client that a filed `ask` call ended without an output:
each ending a tool error of its own kind (`_meta["signoff/outcome"]`), with the reason."""

from __future__ import annotations

import mcp_types
import pytest
from signoff_sdk import AsyncClient, FiledShown

from services.mcp_proxy.config import SignoffConfig
from services.mcp_proxy.intake_gate import IntakeGate
from services.mcp_proxy.server import Offered


def _filed(kind: str, reason: str | None = None, output: object = None) -> FiledShown:
    return FiledShown.model_validate(
        {
            "id": "call_1", "status": "closed", "tool": "delete_file", "origin": "mcp:desktop",
            "caller_call_id": "mcp-x", "thread": None, "runs": "signoff", "request_id": "apr_1",
            "args_digest": None, "expires_at": None, "card": None, "claim": None, "verdict": None, "links": {},
            "closure": {"kind": kind, "reason_text": reason, "output": output},
        }
    )


OFFERED = Offered("delete_file", "files", mcp_types.Tool(name="delete_file", input_schema={"type": "object"}), "ask")


@pytest.mark.parametrize(
    ("kind", "said"),
    [("expired", "nobody decided in time"), ("cancelled", "was cancelled"), ("outcome_unknown", "not run again")],
)
async def test_an_expired_cancelled_or_unknown_call_is_a_tool_error_of_that_kind(kind: str, said: str) -> None:
    config = SignoffConfig(gateway="http://127.0.0.1:1", token="${env:T}", origin="mcp:desktop")
    async with AsyncClient(config.gateway, token="t", verify=False) as client:
        result = await IntakeGate(config, client).ended(OFFERED, _filed(kind, "by the operator"))
    assert result.is_error and said in result.content[0].text
    assert result.meta["signoff/outcome"] == {
        "kind": kind, "reason": "by the operator", "request_id": "apr_1", "call_id": "call_1"
    }


async def test_a_recorded_output_is_the_servers_result_with_its_request() -> None:
    config = SignoffConfig(gateway="http://127.0.0.1:1", token="${env:T}", origin="mcp:desktop")
    output = {"content": [{"type": "text", "text": "deleted a.txt"}], "isError": False}
    async with AsyncClient(config.gateway, token="t", verify=False) as client:
        result = await IntakeGate(config, client).ended(OFFERED, _filed("output", output=output))
    assert not result.is_error and result.content[0].text == "deleted a.txt"
    assert result.meta["signoff/outcome"]["kind"] == "output"
