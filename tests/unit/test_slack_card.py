"""The Slack card (signoff/adapters/slack.py): drawn from the one card face
(shared/on_screen.py `card_face`), every outside text in Slack's escaping."""

import json
from datetime import UTC, datetime

from shared.on_screen import card_face
from signoff.adapters.slack import CardState, card_blocks, click_response_id, code, escaped

CARD = {
    "tool": "post_to_sink",
    "label": "Post <!channel> & friends",
    "description": "",
    "effect": "outward",
    "target": "POST https://exаmple.com/<@U1>",
    "arguments": {
        "message": "hi `rm -rf` \u202eevil\u202c <https://x.test|click>",
        "api_token": "sk-secret-1234567890",
    },
    "reason": "amount > 1,000: two approvers",
    "hidden": [],
}


def blocks(state: CardState) -> str:
    return json.dumps(
        card_blocks(card_face("apr_1", CARD, "hmac-sha256:ab"), state, "https://s.example/inbox/requests/apr_1")
    )


def test_outside_text_on_the_slack_card_can_make_no_mention_link_or_hidden_character():
    shown = blocks(CardState(required=2, approvers=["alice"], expires_at=datetime(2030, 1, 2, 3, 4, tzinfo=UTC)))
    assert "<!channel>" not in shown and "&lt;!channel&gt; &amp; friends" in shown
    assert "<@U1>" not in shown and "<https://x.test|click>" not in shown
    assert "\u202e" not in shown and "\\\\u202e" in shown  # the bidi override shown as its escape
    assert "rm -rf" in shown and "`rm -rf`" not in shown  # a backtick cannot end the code block
    assert "xn--" in shown  # the look-alike host in its punycode form, and a warning
    assert "WARNING" in shown
    assert "sk-secret-1234567890" not in shown  # redacted as on every card
    assert "amount &gt; 1,000: two approvers" in shown
    assert "1 of 2 (alice)" in shown and "<!date^1893553440^" in shown
    assert '"action_id": "signoff_approve"' in shown and '"url": "https://s.example/inbox/requests/apr_1"' in shown


def test_a_closed_card_says_its_outcome_and_has_no_buttons():
    shown = blocks(CardState(outcome="Denied by bob: <not> today"))
    assert '"type": "actions"' not in shown
    assert "Denied by bob: &lt;not&gt; today" in shown


def test_slack_escaping_and_a_clicks_response_id():
    assert escaped("a & <b>") == "a &amp; &lt;b&gt;"
    assert code("`x`") == "\\u0060x\\u0060"
    one = click_response_id("T", "U", "apr_1", "approve", "1.2")
    assert one == click_response_id("T", "U", "apr_1", "approve", "1.2")
    assert one != click_response_id("T", "U", "apr_1", "approve", "1.3")
    assert len(one) <= 64


def test_running_the_slack_channel_without_its_extra_says_which_extra_to_install(monkeypatch):
    import asyncio
    import sys

    import pytest

    from shared.settings import Settings
    from signoff.adapters import slack

    monkeypatch.setitem(sys.modules, "slack_bolt", None)  # as if `signoff[slack]` were not installed
    with pytest.raises(SystemExit, match=r"pip install 'signoff\[slack\]'"):
        asyncio.run(slack.run(Settings(), slack.SlackSettings()))
