"""Every list of approval requests comes a page at a time: `signoff pending`
(a page of 20, `--page`, `--all`, by tool and by who may approve, the first to expire
first, with how many more), and the gateway's `GET /v1/requests` (a `limit` and the
`next` cursor), on both stores, against the real services."""

from __future__ import annotations

import asyncio
import re

from shared.ledger.tables import ApprovalRequest
from shared.messages import StartTurn, mint
from tests.gateway_client import GatewayClient
from tests.harness import eventually, rows
from tests.integration.test_command_line import signoff_here
from tests.integration.test_gateway import add_people, url

COUNTED, REVIEWED = 21, 2


async def backlog(deployment) -> list[ApprovalRequest]:
    """`COUNTED` sessions waiting on `count` (anyone may approve it) and `REVIEWED` on
    `post_reviewed` (alice, bob, carol): their requests, the first to expire first."""
    async with deployment.console() as console:
        for n in range(COUNTED + REVIEWED):
            prefix = "bench" if n < COUNTED else "reviewed"
            await console.send(StartTurn(session_id=f"{prefix}-{mint('ses')}", text="go"))

    async def waiting():
        found = await rows(deployment, ApprovalRequest, status="pending")
        return found if len(found) == COUNTED + REVIEWED else None

    found = await eventually(waiting, 60)
    return sorted(found, key=lambda r: (r.expires_at, r.created_at, r.id))


def shown(output: str) -> list[str]:
    return re.findall(r"request:\s+(apr_\w+)", output)


async def test_signoff_pending_shows_a_page_the_first_to_expire_first_and_says_how_many_more(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    deployment.start("approval-ledger", "publisher", "model-step")
    requests = await backlog(deployment)
    expiring = [r.id for r in requests]
    counted = [r.id for r in requests if r.tool == "count"]
    reviewed = [r.id for r in requests if r.tool == "post_reviewed"]

    first = await asyncio.to_thread(signoff_here, deployment, "pending")
    assert shown(first) == expiring[:20]
    assert "3 more; --all or --page 2" in first
    second = await asyncio.to_thread(signoff_here, deployment, "pending", "--page", "2")
    assert shown(second) == expiring[20:] and "more;" not in second
    small = await asyncio.to_thread(signoff_here, deployment, "pending", "--page-size", "5", "--page", "4")
    assert shown(small) == expiring[15:20] and "3 more; --all or --page 5" in small

    only = await asyncio.to_thread(signoff_here, deployment, "pending", "--tool", "post_reviewed")
    assert shown(only) == reviewed and "more;" not in only
    # mallory may approve `count` (anyone may), not `post_reviewed`.
    mallory = await asyncio.to_thread(signoff_here, deployment, "pending", "--approver", "mallory", "--all")
    assert shown(mallory) == counted
    beyond = await asyncio.to_thread(signoff_here, deployment, "pending", "--page", "9")
    assert shown(beyond) == [] and "no page 9: 23 pending, 20 a page" in beyond


async def test_the_gateway_lists_requests_a_page_at_a_time_and_each_once_by_its_next_cursor(deployment, sink):
    deployment.extra_env["SINK_URL"] = sink.url
    add_people(deployment)
    deployment.start("approval-ledger", "publisher", "model-step", "gateway")
    await backlog(deployment)
    every = sorted(await rows(deployment, ApprovalRequest, status="pending"), key=lambda r: (r.created_at, r.id))

    async with GatewayClient(url(deployment)) as ann, GatewayClient(url(deployment)) as mallory:
        assert (await ann.login("ann")).status_code == 200  # an operator: sees every card
        assert (await mallory.login("mallory")).status_code == 200  # may approve `count` alone

        async def pages(client: GatewayClient, limit: int, **params) -> list[list[str]]:
            found, cursor = [], None
            while True:
                query = {"status": "pending", "limit": limit, **params, **({"cursor": cursor} if cursor else {})}
                answer = await client.get("/v1/requests", params=query)
                assert answer.status_code == 200, answer.text
                body = answer.json()
                assert len(body["requests"]) <= limit
                found.append([card["id"] for card in body["requests"]])
                cursor = body["next"]
                if cursor is None:
                    return found

        operator = await pages(ann, 10)
        assert [len(page) for page in operator] == [10, 10, 3]
        assert [i for page in operator for i in page] == [r.id for r in every]
        theirs = await pages(mallory, 8)
        assert [i for page in theirs for i in page] == [r.id for r in every if r.tool == "count"]
        assert await pages(ann, 50, tool="post_reviewed") == [[r.id for r in every if r.tool == "post_reviewed"]]
        # Exactly a page's worth: no empty page after it.
        assert [len(page) for page in await pages(ann, COUNTED + REVIEWED)] == [COUNTED + REVIEWED]

        bad = await ann.get("/v1/requests", params={"cursor": "not-a-cursor"})
        assert bad.status_code == 400 and bad.json()["type"] == "urn:signoff:problem:bad-cursor"
