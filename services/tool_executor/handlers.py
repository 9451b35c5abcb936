"""The tool-executor handler: claim, run once, record, report."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from shared import faults
from shared.authorization import Authorization, verify_authorization
from shared.catalogue import ToolCatalogue
from shared.consuming import Rejected
from shared.messages import Envelope, ExecuteTool, RefuseExecution, ToolExecuted, encode, now
from shared.observability import EXECUTION_TIME, EXECUTIONS, timed, tool_label
from shared.signatures import Unverified

from .claims import Claims
from .leases import Leases
from .tools import McpConnections, ToolContext, ToolResult, run_tool

log = logging.getLogger("signoff.tool_executor")
# Past this, stop deferring to a Redis lease and let the ledger claim decide.
LEASE_WAIT_LIMIT = 30.0


@dataclass
class Executor:
    catalogue: ToolCatalogue
    claims: Claims
    http: httpx.AsyncClient
    report: Callable[[Envelope], Awaitable[None]]
    # The ledger's public key: what the executor runs must carry the ledger's seal.
    ledger_key: Ed25519PublicKey
    data_dir: Path
    leases: Leases
    # The largest message a consumer accepts (SIGNOFF_MAX_MESSAGE_BYTES): a report past it
    # leaves its output in the claim row, where the ledger reads it.
    max_bytes: int | None = None
    # The tool launcher's socket (SIGNOFF_TOOL_LAUNCHER): python tools start through it.
    tool_launcher: Path | None = None
    # One kept connection per MCP server its `mcp` tools name.
    mcp: McpConnections = field(default_factory=McpConnections)


async def execute_tool(executor: Executor, command: ExecuteTool) -> None:
    """Run an approved call once. A command without the ledger's valid authorization
    runs nothing: it is parked as refused and an operator is told."""
    try:
        granted = verify_authorization(executor.ledger_key, command, at=now())
    except Unverified as refusal:
        await _refuse(executor, command, refusal.code, refusal.detail)
    spec = executor.catalogue.get(command.tool)
    effect = spec.effect if spec else "outward"
    # A live executor holding the Redis lease is already on this call: wait for
    # it (its lease lapses if it dies) instead of contending for the claim row.
    waited = 0.0
    while not await executor.leases.acquire(command.call_id) and waited < LEASE_WAIT_LIMIT:
        await asyncio.sleep(0.1)
        waited += 0.1
    try:
        with timed(EXECUTION_TIME.labels(tool_label(command.tool))):
            await _claim_run_and_report(executor, command, spec, effect, granted)
    finally:
        await executor.leases.release(command.call_id)


async def _refuse(executor: Executor, command: ExecuteTool, code: str, detail: str) -> NoReturn:
    log.error("call %s: refused to run %s: %s: %s", command.call_id, command.tool, code, detail)
    await executor.report(
        RefuseExecution(
            session_id=command.session_id,
            causation_id=command.message_id,
            call_id=command.call_id,
            tool=command.tool,
            reason_code=code,
            reason_text=detail,
        )
    )
    raise Rejected(code, detail)


async def _claim_run_and_report(
    executor: Executor, command: ExecuteTool, spec, effect: str, granted: Authorization
) -> None:
    # verify_authorization compared the command's arguments with the fingerprint the
    # ledger sealed: the seal already proves it, so it is not computed a second time.
    fingerprint = granted.arguments
    while True:
        verdict = await executor.claims.take(
            command.call_id,
            command.idempotency_key,
            effect,
            granted,
            command.tool,
            fingerprint,
            command.authorization,
            # A grant covers a target as the catalogue renders it (the ledger's is the same file).
            target=spec.target_of(command.arguments) if spec is not None else None,
        )
        if verdict.action == "refused":
            await _refuse(executor, command, "not_on_record", verdict.refusal or "")
        if verdict.action != "wait":
            break
        # Another executor holds a live lease; if it dies, the lease runs out.
        assert verdict.wait_until is not None
        await asyncio.sleep(max(0.05, min(1.0, (verdict.wait_until - now()).total_seconds())))

    if verdict.action == "report":
        assert verdict.outcome is not None
        result = ToolResult(verdict.outcome, (verdict.result or {}).get("output"), (verdict.result or {}).get("error"))
    elif verdict.action == "lost":
        log.error("call %s: executor died mid outward call; closing as outcome-unknown", command.call_id)
        result = ToolResult("outcome_unknown", error="the executor stopped mid-call; the outcome is unknown")
    else:
        await faults.reached("executor.after_claim")
        if spec is None:
            result = ToolResult("error", error=f"there is no tool named {command.tool!r}")
        else:
            context = ToolContext(
                command.call_id, command.session_id, command.idempotency_key, verdict.attempt, executor.data_dir
            )
            heartbeat = asyncio.create_task(_keep_lease(executor, command.call_id))
            try:
                result = await run_tool(
                    spec, command.arguments, context, executor.http, executor.tool_launcher, executor.mcp
                )
            finally:
                heartbeat.cancel()
            await faults.reached("executor.after_effect")
        if not await executor.claims.finish(
            command.call_id, result.outcome, {"output": result.output, "error": result.error}
        ):
            log.error("call %s: lost the claim while running; its new holder reports", command.call_id)
            return
        log.info("call %s: %s ran: %s", command.call_id, command.tool, result.outcome)
        await faults.reached("executor.after_record")
    EXECUTIONS.labels(tool_label(command.tool), result.outcome).inc()
    await executor.report(report_of(command, result, executor.max_bytes))


def report_of(command: ExecuteTool, result: ToolResult, max_bytes: int | None) -> ToolExecuted:
    """The report of a finished call. Its result is already whole in the claim row
    (Claims.finish), so an output too large for a message is left there, never lost:
    the report says so (`output_in_claim`) and the ledger reads it from the claim."""
    executed = ToolExecuted(
        session_id=command.session_id,
        causation_id=command.message_id,
        call_id=command.call_id,
        outcome=result.outcome,
        output=result.output,
        # A tool's error is its own text, of any length; the report carries its start.
        error=None if result.error is None else str(result.error)[:4000],
    )
    if max_bytes is not None and len(encode(executed)) > max_bytes:
        log.info("call %s: its output is too large for a message; the ledger reads it from the claim", command.call_id)
        executed = executed.model_copy(update={"output": None, "output_in_claim": True})
    return executed


async def _keep_lease(executor: Executor, call_id: str) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            await asyncio.sleep(executor.claims.lease.total_seconds() / 3)
            try:
                await executor.claims.renew(call_id)
                await executor.leases.renew(call_id)
            except Exception as error:
                # A database blip must not end the heartbeat for good; the next beat may succeed.
                log.warning("call %s: could not renew the claim (%r)", call_id, error)
