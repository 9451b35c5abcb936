"""OpenID Connect logins at the gateway (authorization code + PKCE), a real gateway process
against a small OIDC provider on loopback (tests/oidc_provider.py: its own RSA key,
discovery, JWKS, authorize and token endpoints): a real HTTP exchange and a real
signature check. A login on both stores; what only the gateway checks (the token, where the
browser goes next) on SQLite alone, the store playing no part in it."""

from __future__ import annotations

import httpx
import pytest

from services.gateway import users
from shared.ledger.tables import Decision
from tests.gateway_client import GatewayClient
from tests.harness import free_port
from tests.integration.test_gateway import add_people, gateway_alone, pending_card, start, url
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, Provider

# The configured principal claim: not `preferred_username`, to show the setting is what counts.
CLAIM = "signoff_user"


@pytest.fixture
def provider():
    with Provider() as provider:
        yield provider


@pytest.fixture
def gateway(deployment, sink, provider):
    port = deployment.gateway_ports.setdefault("gateway", free_port())
    deployment.extra_env.update(
        SINK_URL=sink.url,
        SIGNOFF_GATEWAY_OIDC_ISSUER=provider.url,
        SIGNOFF_GATEWAY_OIDC_CLIENT_ID=CLIENT_ID,
        SIGNOFF_GATEWAY_OIDC_CLIENT_SECRET=CLIENT_SECRET,
        SIGNOFF_GATEWAY_OIDC_REDIRECT_URL=f"http://127.0.0.1:{port}/v1/login/oidc/callback",
        SIGNOFF_GATEWAY_OIDC_PRINCIPAL_CLAIM=CLAIM,
    )
    add_people(deployment)
    keys = deployment.data_dir / "keys"
    users.add(keys, keys / "gateway" / "users.yaml", "olivia", None, [], False)
    deployment.start()
    deployment.start("gateway")
    return deployment


def set_cookie(answer: httpx.Response, name: str) -> str | None:
    # The cookies are Secure; httpx's jar keeps them off plain http, so the test carries them.
    for header in answer.headers.get_list("set-cookie"):
        key, _, rest = header.partition("=")
        if key.strip() == name and not rest.startswith('""'):
            return rest.split(";", 1)[0]
    return None


async def oidc_login(gateway_url: str, state: str | None = None, next_path: str | None = None) -> httpx.Response:
    """A browser's walk: the gateway sends it to the issuer, the issuer back with a code."""
    async with httpx.AsyncClient(timeout=30, follow_redirects=False) as browser:
        params = {} if next_path is None else {"next": next_path}
        begun = await browser.get(gateway_url + "/v1/login/oidc", params=params)
        assert begun.status_code == 302, begun.text
        flow = set_cookie(begun, "signoff_oidc")
        assert flow and "code_challenge=" in begun.headers["location"]
        authorized = await browser.get(begun.headers["location"])
        assert authorized.status_code == 302, authorized.text
        callback = authorized.headers["location"]
        if state is not None:
            callback = callback.split("&state=")[0] + f"&state={state}"
        return await browser.get(callback, headers={"Cookie": f"signoff_oidc={flow}"})


async def test_an_oidc_login_works_and_the_principal_comes_from_the_configured_claim(gateway, provider, sink):
    provider.next_login = {"preferred_username": "alice", CLAIM: "olivia", "groups": ["finance"]}
    answer = await oidc_login(url(gateway))
    # The browser is sent on to a page (303), not shown JSON; the page names her.
    assert (answer.status_code, answer.headers["location"]) == (303, "/"), answer.text
    assert provider.token_requests == 1
    async with GatewayClient(url(gateway)) as olivia, GatewayClient(url(gateway)) as alice:
        olivia.cookie = set_cookie(answer, "signoff_session")
        page = await olivia.get("/")
        assert page.headers["content-type"].startswith("text/html") and "<b>olivia</b>" in page.text, page.text
        me = (await olivia.get("/v1/me")).json()
        olivia.csrf = me["csrf_token"]
        assert (me["principal"], me["groups"]) == ("olivia", ["finance"])
        # The gateway's channel may assert her: her approval counts, in her name.
        await alice.login("alice")
        card = await pending_card(alice, await start(alice, "separated"))
        decided = await olivia.decide(card["id"])
        assert decided.status_code == 200 and decided.json()["responder"] == "olivia", decided.text
    [decision] = await rows_of(gateway, card["id"])
    assert (decision.responder, decision.channel) == ("olivia", "gateway")


async def rows_of(deployment, request_id):
    from tests.harness import rows

    return await rows(deployment, Decision, request_id=request_id)


@pytest.mark.parametrize("tamper", ["expired", "audience", "signature"])
@gateway_alone
async def test_an_expired_id_token_a_wrong_audience_and_a_bad_signature_are_refused_and_log_nobody_in(
        gateway, provider, tamper):
    provider.next_login = {CLAIM: "olivia"}
    provider.tamper = tamper
    answer = await oidc_login(url(gateway))
    assert answer.status_code == 401, answer.text
    assert answer.json()["type"] == "urn:signoff:problem:oidc-refused" and provider.token_requests == 1
    assert set_cookie(answer, "signoff_session") is None
    log = (gateway.data_dir / "logs" / "gateway.log").read_text()
    expected = {"expired": "ExpiredTokenError", "audience": "InvalidClaimError", "signature": "BadSignatureError"}
    assert "OpenID Connect login refused" in log and expected[tamper] in log, log[-2000:]
    assert "logged in through OpenID Connect" not in log


async def test_an_oidc_login_refuses_a_wrong_state_and_a_claim_naming_a_password_user(gateway, provider):
    provider.next_login = {CLAIM: "olivia"}
    answer = await oidc_login(url(gateway), state="not-the-state")
    assert answer.status_code == 401 and set_cookie(answer, "signoff_session") is None, answer.text
    # alice logs in with a password; an issuer's claim cannot make someone alice.
    provider.next_login = {CLAIM: "alice"}
    answer = await oidc_login(url(gateway))
    assert answer.status_code == 401 and set_cookie(answer, "signoff_session") is None, answer.text
    # Nor may olivia (an OIDC-only user) log in with a password.
    async with GatewayClient(url(gateway)) as client:
        assert (await client.login("olivia", "any password at all")).status_code == 401


@pytest.mark.parametrize("asked", ["/v1/requests?status=pending", "//evil.example/x", "https://evil.example/",
                                   "/\\evil.example", "javascript:alert(1)"])
@gateway_alone
async def test_an_oidc_login_sends_the_browser_on_to_a_page_of_this_gateway_and_never_to_another_site(
        gateway, provider, asked):
    provider.next_login = {CLAIM: "olivia"}
    answer = await oidc_login(url(gateway), next_path=asked)
    assert answer.status_code == 303 and set_cookie(answer, "signoff_session"), answer.text
    expected = asked if asked.startswith("/v1/") else "/"
    assert answer.headers["location"] == expected


async def test_logging_out_ends_an_oidc_session_on_every_replica(gateway, provider):
    gateway.start("gateway#2")
    provider.next_login = {CLAIM: "olivia"}
    answer = await oidc_login(url(gateway))
    cookie = set_cookie(answer, "signoff_session")
    async with GatewayClient(url(gateway)) as olivia, GatewayClient(url(gateway, "gateway#2")) as other:
        olivia.cookie = other.cookie = cookie
        olivia.csrf = (await olivia.get("/v1/me")).json()["csrf_token"]
        assert (await other.get("/v1/me")).status_code == 200
        out = await olivia.post("/v1/logout", {})
        assert out.status_code == 204, out.text
        assert set_cookie(out, "signoff_session") is None  # the cookie is cleared in the browser
        assert 'signoff_session=""' in out.headers["set-cookie"] or "Max-Age=0" in out.headers["set-cookie"]
        # The same cookie, kept by someone, is refused by both replicas, and the page says so.
        for client in (olivia, other):
            assert (await client.get("/v1/me")).status_code == 401
            assert "Not logged in" in (await client.get("/")).text
