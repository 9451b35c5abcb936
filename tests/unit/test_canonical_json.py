"""`shared.signatures.canonical` takes the standard library's JSON for the values seals and
the audit chain hold, and `rfc8785` for the rest: the bytes must be RFC 8785's either way,
or a seal made by one process would not verify in another."""

from datetime import UTC, datetime

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.signatures import canonical

# Thirty times the profile's examples: 3,000 in full (plain pytest, `make test-long`), 750 under
# `make test`'s quick profile (tests/conftest.py).
EXAMPLES = 30 * settings.default.max_examples

# Every JSON value, with the corners that differ between the two writers: floats, integers
# past 2^53, keys beyond ASCII (astral and private-use characters sort differently by UTF-16),
# control characters, U+2028, lone surrogates.
text = st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
    | st.sampled_from(["\u2028", "\x7f", "\x00", "\ue000", "\U0001f600", "\ud800", "é", "/", '"\\'])
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4), max_leaves=20
)


def rfc8785_or_error(value):
    try:
        return rfc8785.dumps(value)
    except Exception as error:  # the same refusal either way
        return type(error)


def canonical_or_error(value):
    try:
        return canonical(value)
    except Exception as error:
        return type(error)


@settings(max_examples=EXAMPLES, deadline=None)
@given(values)
def test_canonical_bytes_are_rfc_8785s_for_every_json_value(value):
    assert canonical_or_error(value) == rfc8785_or_error(value)


def test_a_seals_usual_values_take_the_fast_writer_and_match_rfc_8785():
    value = {
        "call_id": "call_1",
        "arguments": {"title": "Release notes for version 1.2", "n": 3, "ok": True, "none": None, "é": "ü\u2028"},
        "at": datetime(2026, 12, 3, tzinfo=UTC),
        "list": [1, "two", {"b": 2, "a": 1}],
    }
    assert canonical(value) == rfc8785.dumps({**value, "at": value["at"].isoformat()})
