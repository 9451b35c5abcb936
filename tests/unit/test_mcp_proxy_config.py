"""The MCP proxy's configuration and its call ids: pure rules, no server."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.mcp_proxy.config import ProxyConfig, call_id_for, load_config


def _config(**upstream: object) -> dict[str, object]:
    return {"upstreams": {"files": {"command": ["files-server"], **upstream}}}


def test_a_tool_the_file_does_not_name_asks_and_may_be_made_stricter_never_allowed() -> None:
    config = ProxyConfig.model_validate(_config(tools={"read_file": "allow", "wipe": "deny"}))
    upstream = config.upstreams["files"]
    assert [upstream.policy(t) for t in ("read_file", "wipe", "added_later")] == ["allow", "deny", "ask"]
    assert ProxyConfig.model_validate(_config(unnamed="deny")).upstreams["files"].policy("x") == "deny"
    with pytest.raises(ValueError):
        ProxyConfig.model_validate(_config(unnamed="allow"))


def test_credentials_written_as_values_are_refused_and_the_refusal_does_not_repeat_them(tmp_path: Path) -> None:
    for bad in (
        {"upstreams": {"t": {"url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer sk-live-123"}}}},
        {"upstreams": {"t": {"command": ["s"], "env": {"API_TOKEN": "sk-live-123"}}}},
        {
            "upstreams": {"t": {"command": ["s"]}},
            "signoff": {"gateway": "http://g", "token": "sk-live-123", "origin": "mcp:d"},
        },
    ):
        path = tmp_path / "proxy.yaml"
        path.write_text(yaml.safe_dump(bad))
        with pytest.raises(SystemExit) as refused:
            load_config(path)
        assert "never" in str(refused.value) and "sk-live-123" not in str(refused.value)


def test_references_are_taken_and_filled_from_the_environment_and_the_keys_folder(tmp_path: Path) -> None:
    (tmp_path / "mcp").mkdir()
    (tmp_path / "mcp" / "tickets").write_text("from-the-keys-folder\n")
    config = ProxyConfig.model_validate(
        {
            "upstreams": {
                "t": {
                    "url": "http://127.0.0.1:1/mcp",
                    "headers": {"Authorization": "Bearer ${key:tickets}", "X-Env": "${env:E}"},
                }
            }
        }
    )
    headers = config.upstreams["t"].filled_headers(tmp_path, {"E": "from-env"})
    assert headers == {"Authorization": "Bearer from-the-keys-folder", "X-Env": "from-env"}


def test_several_upstreams_get_their_names_as_prefixes_and_one_keeps_its_tools_names() -> None:
    one = ProxyConfig.model_validate(_config())
    assert one.upstreams["files"].prefix == ""
    two = ProxyConfig.model_validate(
        {"upstreams": {"files": {"command": ["a"]}, "tickets": {"url": "http://127.0.0.1:1/mcp"}}}
    )
    assert [u.prefix for u in two.upstreams.values()] == ["files__", "tickets__"]


def test_a_retry_of_the_same_call_has_the_same_call_id_and_any_difference_another() -> None:
    first = call_id_for("mcp:desktop", "delete_file", {"path": "a", "force": True}, None)
    # Key order is not a difference (canonical JSON).
    assert call_id_for("mcp:desktop", "delete_file", {"force": True, "path": "a"}, None) == first
    others = {
        call_id_for("mcp:desktop", "delete_file", {"path": "b", "force": True}, None),
        call_id_for("mcp:laptop", "delete_file", {"path": "a", "force": True}, None),
        call_id_for("mcp:desktop", "move_file", {"path": "a", "force": True}, None),
        call_id_for("mcp:desktop", "delete_file", {"path": "a", "force": True}, "tool-call-7"),
    }
    assert first not in others and len(others) == 4
    assert first.startswith("mcp-") and len(first) == 44
