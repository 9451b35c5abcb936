"""API tokens for programs (services/gateway/programs.py) and the ledger's rule that a
program approves only where a tool's approvers name it: pure parts, no services."""

from __future__ import annotations

from services.approval_ledger import domain
from services.gateway import programs
from services.gateway.app import create_app
from tests.unit.test_ledger_rules import answer, pending


def test_a_program_approves_and_denies_only_a_tool_whose_approvers_name_it():
    def refused(policy, decision="approve"):
        verdict = domain.judge_approver(policy, pending(), answer(responder="bot:ci-bot", decision=decision))
        return verdict.reason_code if verdict else None

    assert refused(domain.ApprovalPolicy()) == "not_an_approver"
    assert refused(domain.ApprovalPolicy(frozenset({"ann"}))) == "not_an_approver"
    assert refused(domain.ApprovalPolicy(frozenset({"ann", "bot:ci-bot"}))) is None
    assert refused(domain.ApprovalPolicy(), decision="deny") == "not_an_approver"
    assert refused(domain.ApprovalPolicy(frozenset({"ann", "bot:ci-bot"})), decision="deny") is None
    # A person is still anyone's "anyone".
    assert domain.judge_approver(domain.ApprovalPolicy(), pending(), answer(responder="zed")) is None


def every_route(routes):
    """The app's routes, those of the routers it includes too (FastAPI keeps those apart)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        yield from every_route(included.routes) if included is not None else [route]


def test_every_route_a_token_may_use_is_named_with_its_scope_and_the_rest_are_closed():
    routes = {
        (m, r.path) for r in every_route(create_app().routes) for m in getattr(r, "methods", ()) if r.path.startswith("/v1/")
    }
    assert set(programs.SCOPE_OF) <= routes
    # Closed to tokens: the logins (a token is a login already) and logout; the OpenAPI
    # document is public and asks nobody.
    closed = routes - set(programs.SCOPE_OF) - {("GET", "/v1/openapi.json"), ("HEAD", "/v1/openapi.json")}
    assert closed == {("POST", "/v1/login"), ("POST", "/v1/logout"), ("GET", "/v1/login/oidc"),
                      ("GET", "/v1/login/oidc/callback")}
    assert programs.scope_needed("POST", "/v1/requests/{request_id}/decision") == (True, "requests:decide")
    assert programs.scope_needed("POST", "/v1/login") == (False, None)


def test_a_bearer_header_is_read_and_anything_else_is_no_token():
    token = programs.TOKEN_PREFIX + "a" * 43
    assert programs.bearer(f"Bearer {token}") == token
    assert programs.bearer(f"bearer  {token} ") == token
    assert programs.bearer("Basic dXNlcjpwYXNz") == ""
    assert programs.bearer(None) is None


def test_the_tokens_file_keeps_only_hashes_and_a_revoked_token_stops_working_at_once(tmp_path):
    keys = tmp_path / "keys"
    users_path = keys / "gateway" / "users.yaml"
    token, _ = programs.create(keys, users_path, "ci-bot", programs.parse_scopes("sessions:start,requests:read"))
    path = programs.tokens_path(users_path)
    assert token not in path.read_text() and programs.lookup_hash(token) in path.read_text()
    assert path.stat().st_mode & 0o077 == 0
    live = programs.LiveTokens(path)
    found = live.find(token)
    assert found is not None and found.principal == "bot:ci-bot"
    assert found.scopes == {"sessions:start", "requests:read"}
    assert live.find(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert "bot:ci-bot" in (keys / "channels.yaml").read_text()
    programs.revoke(keys, users_path, "ci-bot")
    assert live.find(token) is None
    assert "bot:ci-bot" not in (keys / "channels.yaml").read_text()
