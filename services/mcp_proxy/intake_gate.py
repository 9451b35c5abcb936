"""`ask` calls filed with Signoff's intake (`signoff:` in the proxy's configuration).

The proxy is a program (an API token) filing for the origin the operator declared for it
(`mcp:<name>` in the catalogue's `origins:`). Each call is filed under the call id derived
from what it is (`call_id_for`), so a client's retry of the same call finds the same
request: held, it waits on the same card; decided, it gets the same ending; run, it gets
the result the ledger recorded, never a second run.

A catalogue tool with the executor's `mcp` implementation (`runs: signoff`) is run by the
tool-executor, where the ledger's signed authorization is checked, and its result is
recorded before any client sees it: the proxy only waits and relays. A tool the catalogue
does not have (the origin's `unknown_tools`) is run by its caller: the proxy claims the
approved call, calls its server once and reports how it ended.

While a person decides, the call is held up to `wait_seconds` with progress notifications
(if the client asked for them); then the client gets a tool error naming the request and
saying to call again, which then returns the result. A client that declared URL-mode
elicitation is also sent the card's address on the inbox as a URL elicitation, so its
user can open it; the client's answer to it decides nothing: the ledger's verdict does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mcp_types
from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from shared.catalogue import MissingSecret, credential
from shared.mcp_upstream import UpstreamFailure

from .config import CLIENT_CALL_ID, SignoffConfig, call_id_for
from .server import OUTCOME_META, Answer, Offered, Runner, tool_error

if TYPE_CHECKING:
    from mcp.server.session import ServerSession
    from signoff_sdk import AsyncClient, FiledShown

log = logging.getLogger(__name__)

# How often a held call tells the client it still waits (a progress notification).
PROGRESS_SECONDS = 5.0
# How long the gateway may be away, in a row, before a call is told Signoff did not answer.
GATEWAY_DEADLINE = 20.0
# The intake's bounds on a claim's lease, in seconds.
LEASE_BOUNDS = (5, 24 * 3600)

ENDINGS = {
    "denied": "a person denied it",
    "answered": "a person answered in its place (it did not run)",
    "expired": "nobody decided in time, and the request expired",
    "cancelled": "the request was cancelled",
    "outcome_unknown": "it may or may not have run; a person was asked to find out, and it is not run again",
    "error": "it ran and failed",
}
# The key of the URL elicitation in an `InputRequiredResult` (MCP 2026-07-28).
CARD_INPUT = "signoff/card"


def claim_lease(offered: Offered) -> int:
    """How long the proxy's claim on an approved call lasts: its one call to the server,
    at the longest, and the report after it. Past it with no report (the proxy died, or the
    server did mid-call), the ledger closes the call as outcome unknown and asks a person,
    as soon as nobody can still be running it."""
    low, high = LEASE_BOUNDS
    return min(high, max(low, math.ceil(offered.run_seconds + GATEWAY_DEADLINE)))


def wants_card_url(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the client declared URL-mode elicitation (MCP 2025-11-25 and later)."""
    capabilities = ctx.session.client_capabilities
    return (
        capabilities is not None and capabilities.elicitation is not None and capabilities.elicitation.url is not None
    )


def answered_card_url(ctx: ServerRequestContext[Any]) -> bool:
    """This `tools/call` is a client's retry carrying its answer to the card's elicitation."""
    responses = (ctx.params or {}).get("inputResponses") or (ctx.params or {}).get("input_responses") or {}
    return CARD_INPUT in responses


class IntakeGate:
    """Files each `ask` call with the intake, holds it while a person decides, and relays
    how it ended. Nothing here decides or runs an `ask` call on its own authority."""

    def __init__(self, config: SignoffConfig, client: AsyncClient) -> None:
        self.config = config
        self.client = client
        # The requests whose card each connection was sent (as a URL elicitation): once each.
        self._cards_sent: weakref.WeakKeyDictionary[ServerSession, set[str]] = weakref.WeakKeyDictionary()

    async def hold(
        self, ctx: ServerRequestContext[Any], offered: Offered, arguments: dict[str, Any], run: Runner
    ) -> Answer:
        from signoff_sdk import Refused, SignoffError

        own = (ctx.meta or {}).get(CLIENT_CALL_ID)
        call_id = call_id_for(self.config.origin, offered.name, arguments, own if isinstance(own, str) else None)
        ends = time.monotonic() + self.config.wait_seconds
        sending: asyncio.Task[None] | None = None
        decided = False
        try:
            filed = await self.client.file(offered.name, arguments, call_id=call_id)
            if filed.status not in ("closed", "approved") and filed.request_id is not None and wants_card_url(ctx):
                if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    # No request to the client mid-call in this era: the call answers with
                    # the elicitation, and the client's retry (with its answer) is held.
                    if not answered_card_url(ctx):
                        return self.card_elicitation(offered, filed)
                elif filed.request_id not in self._cards_sent.setdefault(ctx.session, set()):
                    self._cards_sent[ctx.session].add(filed.request_id)
                    sending = asyncio.create_task(self.send_card_url(ctx, offered, filed))
            while filed.status not in ("closed", "approved"):
                left = ends - time.monotonic()
                if left <= 0:
                    return self.still_waiting(offered, filed)
                await ctx.session.report_progress(
                    self.config.wait_seconds - left, None, f"waiting for a person's sign-off ({self.where(filed)})"
                )
                filed = await self.client.wait(filed.id, min(left, PROGRESS_SECONDS))
            decided = True
            if filed.status == "approved":
                return await self.run_approved(offered, filed, run)
            return await self.ended(offered, filed)
        except Refused as refused:
            return tool_error(
                "refused",
                f"Signoff refused {offered.name} ({refused.kind}): {refused.detail or 'no detail'}. It did not run.",
                status=refused.status,
                call_id=call_id,
            )
        except SignoffError as error:
            # Unreachable, or a verdict that is not the ledger's: nothing is run from here.
            return tool_error(
                "signoff_unavailable",
                f"{offered.name}: {type(error).__name__}: {error}. Call it again with the same arguments: "
                "it is the same call, and runs at most once.",
                call_id=call_id,
            )
        finally:
            if sending is not None:
                await self.card_url_done(ctx, sending, filed.request_id if decided else None)

    def card_url(self, request_id: str) -> str:
        inbox = (self.config.inbox or f"{self.config.gateway.rstrip('/')}/inbox").rstrip("/")
        return f"{inbox}/requests/{request_id}"

    def where(self, filed: FiledShown) -> str:
        """The request, and where its card opens on the inbox."""
        if filed.request_id is None:
            return f"call {filed.id}"
        return f"request {filed.request_id}, {self.card_url(filed.request_id)}"

    def card_message(self, offered: Offered, filed: FiledShown) -> str:
        return (
            f"{offered.name} waits for a person's sign-off (request {filed.request_id}). Its card on Signoff's "
            "inbox shows what it would do; an approver decides there."
        )

    def card_elicitation(self, offered: Offered, filed: FiledShown) -> mcp_types.InputRequiredResult:
        """The card's address as a URL elicitation, for the client to show its user before
        it calls again (with its answer) and waits on the same request."""
        assert filed.request_id is not None
        params = mcp_types.ElicitRequestURLParams(
            message=self.card_message(offered, filed), url=self.card_url(filed.request_id)
        )
        return mcp_types.InputRequiredResult(input_requests={CARD_INPUT: mcp_types.ElicitRequest(params=params)})

    async def send_card_url(self, ctx: ServerRequestContext[Any], offered: Offered, filed: FiledShown) -> None:
        """Asks the client to show its user the card (MCP 2025-11-25 URL elicitation),
        beside the held call. Whatever it answers, the call waits on the ledger."""
        assert filed.request_id is not None
        try:
            answer = await ctx.session.elicit_url(
                self.card_message(offered, filed),
                self.card_url(filed.request_id),
                filed.request_id,
                related_request_id=ctx.request_id,
            )
            log.info("request %s: the client's user answered the card's link with %s", filed.request_id, answer.action)
        except Exception as error:
            # A client that cannot show it: the progress notes and the tool error still name the card.
            log.info("request %s: the card's link was not shown: %s", filed.request_id, type(error).__name__)

    async def card_url_done(
        self, ctx: ServerRequestContext[Any], sending: asyncio.Task[None], request_id: str | None
    ) -> None:
        """The held call ended: the link, if still shown, is withdrawn; decided (`request_id`
        given, not merely still waiting), the client is told the interaction is over."""
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        if request_id is None:
            return
        try:
            await ctx.session.send_elicit_complete(request_id, related_request_id=ctx.request_id)
        except Exception as error:
            log.info("request %s: could not tell the client its card's link is done: %s", request_id, error)

    def still_waiting(self, offered: Offered, filed: FiledShown) -> mcp_types.CallToolResult:
        return tool_error(
            "pending",
            f"{offered.name} waits for a person's sign-off ({self.where(filed)}); it has not run. "
            f"Call {offered.name} again with the same arguments to wait on and get its result: "
            "it is the same request, and runs at most once.",
            request_id=filed.request_id,
            call_id=filed.id,
            expires_at=filed.expires_at.isoformat() if filed.expires_at else None,
        )

    async def ended(self, offered: Offered, filed: FiledShown) -> mcp_types.CallToolResult:
        """A closed call: the recorded result, or its ending as a typed tool error."""
        from signoff_sdk import CallClosed

        facts = {"request_id": filed.request_id, "call_id": filed.id}
        try:
            output = self.client.outcome(filed, await self.client.verdict_of(filed))
        except CallClosed as closed:
            if closed.kind == "answered" and offered.tool.output_schema is None:
                # A person answered in the tool's place: their answer is the result (nothing ran).
                # A tool that declares an output schema cannot take free text as its result:
                # there the answer comes back as a tool error of kind `answered`, below.
                answer = mcp_types.TextContent(type="text", text=closed.reason)
                return mcp_types.CallToolResult(content=[answer], _meta={OUTCOME_META: {"kind": "answered", **facts}})
            said = ENDINGS.get(closed.kind, closed.kind)
            reason = f": {closed.reason}" if closed.reason else ""
            return tool_error(closed.kind, f"{offered.name}: {said}{reason}.", reason=closed.reason, **facts)
        try:
            result = mcp_types.CallToolResult.model_validate(output)
        except ValueError:
            result = mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=str(output))])
        meta = {**(result.meta or {}), OUTCOME_META: {"kind": "output", **facts}}
        return result.model_copy(update={"meta": meta})

    async def run_approved(self, offered: Offered, filed: FiledShown, run: Runner) -> mcp_types.CallToolResult:
        """A tool Signoff has no implementation of (`runs: caller`): claim the approved
        call (granted once), call its server once with the approved arguments, report."""
        claim = await self.client.claim(
            filed, lease_seconds=claim_lease(offered), holder=f"mcp-proxy pid {os.getpid()}"
        )
        try:
            result = await run(claim.arguments)
        except UpstreamFailure as failure:
            if failure.may_have_run:
                # Not reported: the claim's lease (`claim_lease`) ends with no result, the call
                # closes as outcome unknown, and a person is asked. Never sent again.
                return tool_error(
                    "outcome_unknown",
                    f"{offered.name}: {failure}; it may or may not have run, and is not run again.",
                    request_id=filed.request_id,
                    call_id=filed.id,
                )
            await self.client.report(claim, error=f"{failure} ({failure.kind})")
        else:
            output = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            if result.is_error:
                said = " ".join(getattr(block, "text", "") for block in result.content).strip()
                await self.client.report(claim, error=said or "(no text)")
            else:
                await self.client.report(claim, output)
        return await self.ended(offered, await self.client.get(filed.id))


def intake_gate(config: SignoffConfig, keys_dir: Path | None) -> IntakeGate:
    """The gate for `signoff:`: its token filled in from the environment or the keys folder."""
    try:
        from signoff_sdk import AsyncClient
    except ImportError:
        raise SystemExit("mcp-proxy: `signoff:` needs Signoff's SDK: pip install signoff-sdk (./sdk)") from None
    try:
        token = credential(config.token, keys_dir, os.environ)
    except MissingSecret as missing:
        raise SystemExit(f"mcp-proxy: signoff.token: {missing}") from None
    client = AsyncClient(config.gateway, token=token, origin=config.origin, deadline=GATEWAY_DEADLINE)
    return IntakeGate(config, client)
