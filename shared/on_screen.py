"""What a person sees of a text from outside: the one way such text reaches a terminal.

The model writes a call's arguments, a provider or a parked message's sender writes
reasons and headers, a tool writes its output. Printed raw, any of them can paint
over the approval card: a carriage return or a cursor move overwrites the line
that names the target, an erase or a screen clear removes it, conceal makes it
invisible, a bidi override shows its letters in another order, a zero-width
character splits a name unseen, a few thousand spaces push the rest off the
screen, a Cyrillic `а` makes `exаmple.com` read as `example.com`
(docs/design.md, "Trust boundaries", "The card shows exactly what runs").

So every such text is shown here as escapes a person can read:

- control characters (C0 with `\\r`, `\\n`, `\\b` and ESC, DEL, C1) as `\\r`,
  `\\n`, `\\t`, `\\xNN`: no escape sequence ever reaches the terminal, and a
  newline inside a value cannot fake a line of the card;
- bidi controls, zero-width and every other format character (Unicode category
  Cf), separators other than the plain space, surrogates, private-use and
  unassigned code points, and letters that render blank, as `\\uNNNN`;
- a backslash as `\\\\`, so an escape shown is never the value's own text;
- a run of spaces (8 or more) or of an escaped character (4 or more) as
  `[N spaces]` or `[N x \\u200b]`: padding cannot push the rest away;
- a host name with a letter outside ASCII (a look-alike, or mixed scripts) in
  its punycode (IDNA) form followed by a warning mark, and `host_warnings`
  says which scripts it mixes;
- a value longer than its limit cut, with `(N more characters)` after it, so
  the tool, the target, the digest and the question stay on screen.

Pure: text in, text out. `card_face` is the one place that turns a request's card into
what every channel shows of it (the console's frame, the inbox, Slack, email, the SDK's
`signoff.channel.describe`), and `card_rows` the one place that turns that into the
card's lines of text (the console, email, the SDK): each channel lays these out and
escapes them for its medium, none re-derives them.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import idna

from shared.redaction import redact_text, redact_value

# Code points that are letters (so no category catches them) yet render as blank space.
_BLANK_LETTERS = frozenset({"\u115f", "\u1160", "\u3164", "\uffa0", "\u2800"})
# Categories shown as an escape: controls, format (bidi, zero-width, soft hyphen, BOM),
# surrogates, private use, unassigned, line and paragraph separators.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Runs at least this long are shown by their count.
_SPACE_RUN = 8
_ESCAPE_RUN = 4
# A host name: labels of letters, digits and hyphens joined by a dot (or a dot IDNA
# treats as one), ending in a label that starts with a letter.
_DOTS = ".\u3002\uff0e\uff61"
_HOST = re.compile(rf"(?<![\w.-])(?:[^\W_](?:[\w-]{{0,62}}[^\W_])?[{_DOTS}])+[^\W\d_][\w-]{{0,62}}(?![\w-])")
HOST_MARK = " [!non-ASCII host]"

# The console's limits: a target, one string of a call's arguments, one line of
# transcript or of a parked message.
TARGET_CHARS = 300
VALUE_CHARS = 200
TEXT_CHARS = 1000
FIELD_CHARS = 120
ARGUMENT_LINES = 200


@dataclass(frozen=True)
class CardFace:
    """A request's card as a person is shown it, every value already through `visible`:
    what a channel lays out (and escapes for its medium), never the raw card."""

    request: str
    label: str
    tool: str
    effect: str
    target: str
    # Why it needs a person, and from how many (the tool's rule); "" on cards made before rules.
    reason: str
    warnings: list[str]
    # The (redacted) arguments laid out as `json.dumps(indent=2)` would, one line each.
    arguments: list[str]
    # The arguments withheld from everyone but the executor, each name shown.
    hidden: list[str]
    digest: str
    # Who filed the call, for whom, and what they said of it (a call filed through the
    # intake); "" for a call Signoff's own model made.
    filed: str = ""


def card_face(request_id: str, card: dict[str, Any], digest: str) -> CardFace:
    """What a person is shown of a card. Everything on it comes from outside (the model
    wrote the arguments, and so the target), so every value is shown by `visible`, the
    arguments and target redacted, and a look-alike host in them warned of."""
    target = visible(redact_text(str(card.get("target", ""))), TARGET_CHARS)
    arguments = redact_value(card.get("arguments", {}))
    warnings = host_warnings(redact_text(str(card.get("target", "")))) + [
        w for text in _strings(arguments) for w in host_warnings(text)
    ]
    return CardFace(
        request=visible(request_id, FIELD_CHARS),
        label=visible(card.get("label", ""), FIELD_CHARS),
        tool=visible(card.get("tool", ""), FIELD_CHARS),
        effect=visible(card.get("effect", ""), FIELD_CHARS),
        target=target,
        reason=visible(str(card["reason"]), TEXT_CHARS) if card.get("reason") else "",
        warnings=list(dict.fromkeys(warnings)),
        arguments=json_lines(arguments),
        hidden=[visible(h, FIELD_CHARS) for h in card.get("hidden") or []],
        digest=visible(digest, FIELD_CHARS),
        filed=filed_by(card.get("filed")),
    )


def filed_by(filed: dict[str, Any] | None) -> str:
    """Who filed a call and for whom (the program, the origin it speaks for), whether the
    tool is the caller's own word, and the caller's one-line summary."""
    if not filed:
        return ""
    by = f"{visible(filed.get('program', ''), 100)} for {visible(filed.get('origin', ''), 100)}"
    declared = " (a tool the caller declared)" if filed.get("declared_by_caller") else ""
    summary = f": {visible(filed['summary'], TARGET_CHARS)}" if filed.get("summary") else ""
    return by + declared + summary


def card_headline(face: CardFace) -> str:
    """The card's first line where it stands alone (an email, a chat message)."""
    return f"Approval needed: {face.label} ({face.tool}, effect: {face.effect})"


def card_rows(
    face: CardFace, *, details: Sequence[tuple[str, str]] = (), notes: Sequence[tuple[str, str]] = ()
) -> list[str]:
    """The card's lines of text below its headline, the same in every text medium (the
    console's frame, an email, `signoff.channel.describe`): the request, the target, why
    it needs a person, who filed it, the warnings, the arguments as `json_lines` lays
    them out, the hidden ones, the digest last. `details`: a medium's own labelled lines
    after those that say what the call is (an email's expiry); `notes`: before the digest
    (the console's escalation)."""
    lines = [_row("request", face.request), _row("target", face.target)]
    if face.reason:
        # Why it needs approval, and from how many: the tool's rule over these arguments.
        lines.append(_row("why", face.reason))
    if face.filed:
        lines.append(_row("filed by", face.filed))
    lines += [_row(label, value) for label, value in details]
    lines += [_row("WARNING", w) for w in face.warnings]
    lines += face.arguments
    if face.hidden:
        lines.append(_row("hidden", f"{', '.join(face.hidden)} (secret: withheld from everyone but the executor)"))
    lines += [_row(label, value) for label, value in notes]
    lines.append(_row("digest", face.digest))
    return lines


def _row(label: str, value: str) -> str:
    return f"{label + ':':<10} {value}"


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (str(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


@dataclass(frozen=True)
class _Piece:
    consumed: int  # characters of the original text it shows
    shown: str


def visible(value: Any, limit: int | None = None, *, quoted: bool = False, json_text: bool = False) -> str:
    """`value` as one line a person can trust: nothing in it acts on the terminal.

    `quoted`: the text goes between double quotes (a JSON-like string), so `"` is
    escaped too. `json_text`: the text is already JSON, whose own escapes
    (backslashes) are kept as they are. `limit`: the most characters shown."""
    shown, rest = _shown_and_rest(value if isinstance(value, str) else str(value), limit, quoted, json_text)
    return shown + _more(rest)


def _shown_and_rest(text: str, limit: int | None, quoted: bool, json_text: bool) -> tuple[str, int]:
    """What is shown of the text, and how many of its characters are not."""
    shown: list[str] = []
    length = consumed = 0
    for piece in _pieces(text, quoted=quoted, json_text=json_text):
        if limit is not None and length + len(piece.shown) > limit:
            return "".join(shown), len(text) - consumed
        shown.append(piece.shown)
        length += len(piece.shown)
        consumed += piece.consumed
    return "".join(shown), 0


def _more(rest: int) -> str:
    return f" … ({rest} more characters)" if rest else ""


def host_warnings(value: Any) -> list[str]:
    """One sentence per look-alike host in the text: its punycode form and the scripts of its letters."""
    text = value if isinstance(value, str) else str(value)
    found = []
    for match in _HOST.finditer(text):
        host = match.group(0)
        if host.isascii():
            continue
        scripts = sorted({_script(c) for c in host if not c.isascii() and c.isalpha()}) or ["non-ASCII dots"]
        found.append(
            f"the host {punycode(host)} is written with letters that are not ASCII "
            f"({', '.join(scripts)}): it may imitate another name"
        )
    return list(dict.fromkeys(found))


def punycode(host: str) -> str:
    """The ASCII (IDNA) form of a host name, label by label; a label IDNA refuses is
    still shown by its raw punycode, never as written."""
    labels = re.split(f"[{_DOTS}]", host)
    shown = []
    for label in labels:
        if label.isascii():
            shown.append(label)
            continue
        try:
            shown.append(idna.encode(label).decode("ascii"))
        except (idna.IDNAError, UnicodeError):
            shown.append("xn--" + label.encode("punycode").decode("ascii"))
    return ".".join(shown)


def json_lines(value: Any, limit: int = VALUE_CHARS, max_lines: int = ARGUMENT_LINES) -> list[str]:
    """A JSON value laid out as `json.dumps(indent=2)` does, each string shown by
    `visible` (cut at `limit`), at most `max_lines` lines."""
    lines: list[str] = []
    _layout(value, limit, "", lines, max_lines + 1, depth=0)
    if len(lines) > max_lines:
        lines[max_lines:] = [f"… ({_count_lines(value) - max_lines} more lines)"]
    return lines


def json_inline(value: Any, limit: int = VALUE_CHARS) -> str:
    """A JSON value on one line, each string shown by `visible` (cut at `limit`)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_string(k, limit)}: {json_inline(v, limit)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(json_inline(v, limit) for v in value) + "]"
    return _scalar(value, limit)


def _layout(value: Any, limit: int, indent: str, lines: list[str], room: int, depth: int, head: str = "") -> None:
    if len(lines) >= room:
        return
    inner = indent + "  "
    if depth > 32 and isinstance(value, dict | list) and value:
        lines.append(f"{indent}{head}… (nested deeper than 32 levels, not shown)")
        return
    if isinstance(value, dict) and value:
        lines.append(f"{indent}{head}{{")
        items = list(value.items())
        for n, (key, item) in enumerate(items):
            _layout(item, limit, inner, lines, room, depth + 1, f"{_string(key, limit)}: ")
            if n < len(items) - 1 and len(lines) < room:
                lines[-1] += ","
        lines.append(f"{indent}}}")
    elif isinstance(value, list) and value:
        lines.append(f"{indent}{head}[")
        for n, item in enumerate(value):
            _layout(item, limit, inner, lines, room, depth + 1)
            if n < len(value) - 1 and len(lines) < room:
                lines[-1] += ","
        lines.append(f"{indent}]")
    else:
        lines.append(f"{indent}{head}{_scalar(value, limit)}")


def _count_lines(value: Any) -> int:
    if isinstance(value, dict) and value:
        return 2 + sum(_count_lines(v) for v in value.values())
    if isinstance(value, list) and value:
        return 2 + sum(_count_lines(v) for v in value)
    return 1


def _scalar(value: Any, limit: int) -> str:
    if isinstance(value, str):
        return _string(value, limit)
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    try:
        return visible(json.dumps(value), limit, json_text=True)
    except (TypeError, ValueError):
        return visible(repr(value), limit)


def _string(text: Any, limit: int) -> str:
    """A string between quotes; what is cut is said after the closing quote."""
    shown, rest = _shown_and_rest(str(text), limit, True, False)
    return f'"{shown}"' + _more(rest)


def _pieces(text: str, *, quoted: bool, json_text: bool):
    hosts = {m.start(): m.group(0) for m in _HOST.finditer(text) if not m.group(0).isascii()}
    n = 0
    while n < len(text):
        host = hosts.get(n)
        if host is not None:
            yield _Piece(len(host), punycode(host) + HOST_MARK)
            n += len(host)
            continue
        char = text[n]
        run = 1
        while n + run < len(text) and text[n + run] == char:
            run += 1
        escaped = _escape(char, quoted=quoted, json_text=json_text)
        if char == " " and run >= _SPACE_RUN:
            yield _Piece(run, f"[{run} spaces]")
        elif escaped != char and char not in '\\"' and run >= _ESCAPE_RUN:
            yield _Piece(run, f"[{run} x {escaped}]")
        else:
            for _ in range(run):
                yield _Piece(1, escaped)
        n += run


def _escape(char: str, *, quoted: bool, json_text: bool) -> str:
    if char == "\\":
        return char if json_text else "\\\\"
    if char == '"' and quoted:
        return '\\"'
    if char.isascii() and char.isprintable():
        return char
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    category = unicodedata.category(char)
    if category in _ESCAPED_CATEGORIES or (category == "Zs" and char != " ") or char in _BLANK_LETTERS:
        if code < 0x100:
            return f"\\x{code:02x}"
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return char


def _script(char: str) -> str:
    name = unicodedata.name(char, "")
    return name.split(" ")[0].capitalize() if name else f"U+{ord(char):04X}"
