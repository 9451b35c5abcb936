"""A provider reply of any shape is a reply or a ProviderError, never another
exception, and its usage is counted as far as it is readable (invariant 7): an
exception that escaped would have the step redelivered and the provider called,
and billed, again."""

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.model_step import anthropic_messages, openai_compatible
from services.model_step.replies import MAX_TOKENS, ProviderError, ProviderReply, tokens
from shared.messages import ModelStepCompleted, ProviderAttempt

PARSERS = {"openai": openai_compatible.parse_reply, "anthropic": anthropic_messages.parse_reply}
both = pytest.mark.parametrize("kind", list(PARSERS))
# A multiple of the profile's examples: 300 and 200 in full, a quarter under `make test` (tests/conftest.py).
EXAMPLES = settings.default.max_examples


def parse(kind, answer):
    """The reply, or the ProviderError: anything else raised fails the test."""
    try:
        return PARSERS[kind](answer)
    except ProviderError as failure:
        return failure


def openai_answer(message, usage=None):
    return {"choices": [{"index": 0, "message": message}], "usage": usage if usage is not None else {}}


def openai_call(function, **rest):
    return {"id": "call_1", "type": "function", "function": function, **rest}


def anthropic_answer(content, usage=None):
    return {"type": "message", "content": content, "usage": usage if usage is not None else {}}


# --- token counts --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "counted"),
    [
        (12, 12), (0, 0), (12.9, 12), ("12", 12), (" 7 ", 7), ("1e3", 1000),
        (-1, 0), (-0.5, 0), ("-3", 0), ("x", 0), ("", 0), (None, 0), (True, 0), (False, 0),
        ([], 0), ({}, 0), ([5], 0), ({"n": 5}, 0), (math.nan, 0), (math.inf, 0), (-math.inf, 0), ("nan", 0),
        ("inf", 0), (10**12, MAX_TOKENS), (1e300, MAX_TOKENS), (10**400, MAX_TOKENS), (MAX_TOKENS, MAX_TOKENS),
    ],
)
def test_a_token_count_of_any_shape_counts_as_far_as_it_is_readable(value, counted):
    assert tokens(value) == counted


# --- garbage, shape by shape -------------------------------------------------------------

GARBAGE = {
    "openai": [
        None, [], "reply", 42, {}, {"choices": None}, {"choices": []}, {"choices": "abc"}, {"choices": [None]},
        {"choices": ["message"]}, {"choices": [{}]}, {"choices": [{"message": None}]},
        {"choices": [{"message": "I am a string"}]}, {"choices": [{"message": ["content"]}]},
        openai_answer({"content": 42}), openai_answer({"content": {"text": "hi"}}),
        openai_answer({"tool_calls": {"id": "c1"}}), openai_answer({"tool_calls": "call it"}),
        openai_answer({"tool_calls": 7}), openai_answer({"tool_calls": ["post_to_sink"]}),
        openai_answer({"tool_calls": [None]}), openai_answer({"tool_calls": [openai_call("post_to_sink")]}),
        openai_answer({"tool_calls": [openai_call(None)]}), openai_answer({"tool_calls": [openai_call(["f"])]}),
        openai_answer({"tool_calls": [openai_call({"arguments": "{}"})]}),
        openai_answer({"tool_calls": [openai_call({"name": 7, "arguments": "{}"})]}),
        openai_answer({"tool_calls": [openai_call({"name": "", "arguments": "{}"})]}),
        openai_answer({"tool_calls": [openai_call({"name": "n" * 300, "arguments": "{}"})]}),
        openai_answer({"tool_calls": [openai_call({"name": "f", "arguments": "{not json"})]}),
        openai_answer({"tool_calls": [openai_call({"name": "f", "arguments": "[1, 2]"})]}),
        openai_answer({"tool_calls": [openai_call({"name": "f", "arguments": 12})]}),
        openai_answer({"tool_calls": [openai_call({"name": "f", "arguments": ["a"]})]}),
        openai_answer({"tool_calls": [openai_call({"name": "f", "arguments": "[" * 100_000})]}),
    ],
    "anthropic": [
        None, [], "reply", 42, {}, {"content": None}, {"content": "text"}, {"content": {"type": "text"}},
        anthropic_answer([None]), anthropic_answer(["text"]), anthropic_answer([{}]), anthropic_answer([{"type": 7}]),
        anthropic_answer([{"type": "text"}]), anthropic_answer([{"type": "text", "text": 42}]),
        anthropic_answer([{"type": "text", "text": ["a"]}]),
        anthropic_answer([{"type": "tool_use", "id": "t1", "name": "f"}]),
        anthropic_answer([{"type": "tool_use", "id": "t1", "name": "f", "input": "{}"}]),
        anthropic_answer([{"type": "tool_use", "id": "t1", "name": "f", "input": [1]}]),
        anthropic_answer([{"type": "tool_use", "id": "t1", "input": {}}]),
        anthropic_answer([{"type": "tool_use", "id": "t1", "name": 7, "input": {}}]),
        anthropic_answer([{"type": "tool_use", "id": "t1", "name": "n" * 300, "input": {}}]),
    ],
}


@pytest.mark.parametrize(("kind", "answer"), [(k, a) for k, answers in GARBAGE.items() for a in answers])
def test_a_reply_of_the_wrong_shape_is_a_retryable_provider_error(kind, answer):
    failure = parse(kind, answer)
    assert isinstance(failure, ProviderError), failure
    assert failure.retryable and str(failure).startswith(f"{kind}: unusable reply")


GARBAGE_USAGE = [
    ({"prompt_tokens": -1, "completion_tokens": "x"}, {"input_tokens": -1, "output_tokens": "x"}, (0, 0)),
    ({"prompt_tokens": "12", "completion_tokens": 3.7}, {"input_tokens": "12", "output_tokens": 3.7}, (12, 3)),
    ({"prompt_tokens": None, "completion_tokens": [4]}, {"input_tokens": None, "output_tokens": {"n": 4}}, (0, 0)),
    ({"prompt_tokens": 10**12, "completion_tokens": True}, {"input_tokens": 10**12, "output_tokens": False},
     (MAX_TOKENS, 0)),
    ("lots", "lots", (0, 0)),
    ([1, 2], [1, 2], (0, 0)),
    (-5, -5, (0, 0)),
]


@pytest.mark.parametrize(("openai_usage", "anthropic_usage", "expected"), GARBAGE_USAGE)
def test_garbage_usage_never_fails_a_usable_reply_and_counts_as_far_as_it_is_readable(
    openai_usage, anthropic_usage, expected
):
    for kind, answer in (
        ("openai", openai_answer({"content": "Hello."}, openai_usage)),
        ("anthropic", anthropic_answer([{"type": "text", "text": "Hello."}], anthropic_usage)),
    ):
        reply = parse(kind, answer)
        assert isinstance(reply, ProviderReply), reply
        assert reply.text == "Hello."
        assert (reply.usage.input_tokens, reply.usage.output_tokens) == expected


@pytest.mark.parametrize(("openai_usage", "anthropic_usage", "expected"), GARBAGE_USAGE)
def test_garbage_usage_beside_an_unusable_reply_is_counted_as_far_as_it_is_readable(
    openai_usage, anthropic_usage, expected
):
    for kind, answer in (
        ("openai", openai_answer("a string, not a message", openai_usage)),
        ("anthropic", anthropic_answer("a string, not blocks", anthropic_usage)),
    ):
        failure = parse(kind, answer)
        assert isinstance(failure, ProviderError) and failure.retryable
        assert (failure.usage.input_tokens, failure.usage.output_tokens) == expected


def test_anthropic_cached_tokens_are_counted_and_a_garbage_one_counts_as_nothing():
    usage = {"input_tokens": 10, "cache_creation_input_tokens": "x", "cache_read_input_tokens": 5, "output_tokens": 2}
    reply = parse("anthropic", anthropic_answer([{"type": "text", "text": "hi"}], usage))
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (15, 2)
    huge = {"input_tokens": MAX_TOKENS, "cache_read_input_tokens": MAX_TOKENS}
    assert parse("anthropic", anthropic_answer([], huge)).usage.input_tokens == MAX_TOKENS


def test_tolerated_shapes_still_read_as_before():
    # No id, an id that is not a string, empty arguments, content parts: all usable.
    reply = parse("openai", openai_answer({
        "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo."}, {"type": "image"}, "junk"],
        "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": ""}},
            {"id": 5, "type": "function", "function": {"name": "g", "arguments": {"a": 1}}},
        ],
    }))
    assert reply.text == "Hello."
    assert [(c.provider_call_id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_0", "f", {}), ("call_1", "g", {"a": 1})]
    reply = parse("anthropic", anthropic_answer([
        {"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "On it."},
        {"type": "tool_use", "name": "f", "input": {}}, {"type": "tool_use", "id": "", "name": "g", "input": {}},
    ]))
    assert reply.text == "On it."
    assert [c.provider_call_id for c in reply.tool_calls] == ["toolu_2", "toolu_3"]


@both
def test_a_provider_id_past_the_limit_is_cut_to_it_rather_than_failing_the_reply(kind):
    long_id = "id_" + "x" * 400
    if kind == "openai":
        answer = openai_answer({"tool_calls": [{"id": long_id, "type": "function",
                                                "function": {"name": "f", "arguments": "{}"}}]})
    else:
        answer = anthropic_answer([{"type": "tool_use", "id": long_id, "name": "f", "input": {}}])
    [call] = parse(kind, answer).tool_calls
    assert call.provider_call_id == long_id[:256]


# --- any shape at all (hypothesis) ----------------------------------------------------

json_leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


def maybe(strategy):
    """Mostly the right thing, sometimes any JSON value in its place."""
    return st.sampled_from(range(8)).flatmap(lambda n: json_values if n == 7 else strategy)


token_counts = st.integers(min_value=-(2**40), max_value=2**40) | json_values
names = st.sampled_from(["post_to_sink", "f"])

openai_function = st.fixed_dictionaries(
    {"name": maybe(names)},
    optional={"arguments": maybe(st.sampled_from(['{"message": "hi"}', "{}", "", "{bad"]))},
)
openai_tool_call = st.fixed_dictionaries(
    {"function": maybe(openai_function)},
    optional={"id": maybe(st.text(max_size=300)), "type": maybe(st.just("function"))},
)
openai_message = st.fixed_dictionaries(
    {},
    optional={
        "content": maybe(st.none() | st.text(max_size=20)),
        "tool_calls": maybe(st.lists(maybe(openai_tool_call), min_size=1, max_size=3)),
    },
)
openai_usage = st.fixed_dictionaries({}, optional={"prompt_tokens": token_counts, "completion_tokens": token_counts})
openai_choice = st.fixed_dictionaries({"message": maybe(openai_message)})
openai_replies = st.fixed_dictionaries(
    {"choices": maybe(st.lists(maybe(openai_choice), min_size=1, max_size=2))},
    optional={"usage": maybe(openai_usage)},
)

anthropic_text = st.fixed_dictionaries({"type": maybe(st.just("text")), "text": maybe(st.text(max_size=20))})
anthropic_tool_use = st.fixed_dictionaries(
    {"type": maybe(st.just("tool_use")), "name": maybe(names), "input": maybe(st.just({"message": "hi"}))},
    optional={"id": maybe(st.text(max_size=300))},
)
anthropic_usage = st.fixed_dictionaries(
    {}, optional={"input_tokens": token_counts, "cache_read_input_tokens": token_counts, "output_tokens": token_counts}
)
anthropic_replies = st.fixed_dictionaries(
    {"content": maybe(st.lists(maybe(anthropic_text | anthropic_tool_use), max_size=4))},
    optional={"usage": maybe(anthropic_usage)},
)


def check_any_outcome(kind, answer):
    outcome = parse(kind, answer)
    usage = outcome.usage
    assert 0 <= usage.input_tokens <= MAX_TOKENS and 0 <= usage.output_tokens <= MAX_TOKENS
    if isinstance(outcome, ProviderError):
        assert outcome.retryable
        return
    # A usable reply makes a report its consumer accepts.
    report = ModelStepCompleted(
        session_id="ses_1", step_id="stp_1", text=outcome.text, tool_calls=outcome.tool_calls,
        attempts=[ProviderAttempt(number=1, status="completed", provider=kind, usage=usage)],
    )
    assert ModelStepCompleted.model_validate_json(report.model_dump_json()) == report


@settings(max_examples=3 * EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=openai_replies)
def test_any_openai_shaped_reply_is_a_reply_or_a_provider_error(answer):
    check_any_outcome("openai", answer)


@settings(max_examples=3 * EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=anthropic_replies)
def test_any_anthropic_shaped_reply_is_a_reply_or_a_provider_error(answer):
    check_any_outcome("anthropic", answer)


@settings(max_examples=2 * EXAMPLES, deadline=None)
@given(answer=json_values, kind=st.sampled_from(list(PARSERS)))
def test_any_json_value_at_all_is_a_reply_or_a_provider_error(answer, kind):
    check_any_outcome(kind, answer)


def test_the_parsers_accept_what_json_loads_gives_them():
    # NaN and infinities are what Python's json module reads for the bare words.
    answer = json.loads('{"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": NaN, '
                        '"completion_tokens": Infinity}}')
    reply = parse("openai", answer)
    assert reply.text == "hi" and (reply.usage.input_tokens, reply.usage.output_tokens) == (0, 0)
