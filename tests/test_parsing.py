"""Action parsing: any string -> (action, valid); never raises, bounded time on huge input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seed_vl.processors.parsing import MAX_RESPONSE_CHARS, parse_action

SOKOBAN = ["up", "down", "left", "right"]
EZPOINTS = [*map(str, range(1, 11)), "+", "*", "="]
TEXTWORLD = ["go north", "take passkey from bench", "open wooden door", "look"]


def answer(action: str, think: str = "the box is above me") -> str:
    return f"<think>{think}</think><action>{action}</action>"


@pytest.mark.parametrize(
    ("text", "admissible", "expected"),
    [
        (answer("up"), SOKOBAN, ("up", True)),
        (answer("  Up \n"), SOKOBAN, ("up", True)),  # whitespace and case are normalized
        (f"\n {answer('left')} \n", SOKOBAN, ("left", True)),
        ("<think>a\nb</think>\n<action>right</action>", SOKOBAN, ("right", True)),
        (answer("10"), EZPOINTS, ("10", True)),
        (answer("*"), EZPOINTS, ("*", True)),
        (answer("Take  Passkey\tfrom bench"), TEXTWORLD, ("take passkey from bench", True)),
        (answer("up", think=""), SOKOBAN, ("up", True)),
        (answer("jump"), SOKOBAN, ("jump", False)),  # well formed, not admissible: kept for the record
        (answer("11"), EZPOINTS, ("11", False)),
        (answer("up"), None, ("up", True)),  # no action list: only the format is checked
    ],
)
def test_well_formed_answers(text, admissible, expected):
    assert parse_action(text, admissible) == expected


def test_action_is_spelled_as_in_the_admissible_list():
    assert parse_action(answer("go NORTH"), ["Go North", "look"]) == ("Go North", True)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "up",
        "<action>up</action>",  # the think block is part of the format
        "<think>push</think>up",
        "<think>push</think><action></action>",
        "<think>push</think><action>   </action>",
        "<think>push</think><action>up",
        "<think>push<action>up</action>",
        "<action>up</action><think>push</think>",  # wrong order
        "<think>a</think><action>up</action><action>down</action>",  # several actions
        "<think>a</think><think>b</think><action>up</action>",
        "<think>a</think>so: <action>up</action>",  # text between the blocks
        "<think>a</think><action>up</action> and then left",  # text after the action
        "I think <think>a</think><action>up</action>",
        "<think>a</think><action>up<br></action>",
        "<THINK>a</THINK><ACTION>up</ACTION>",
        "<think>a</think><action>up\u200b</action>",  # zero-width space
        "<think>a</think><action>\x00up</action>",
        "<think>a</think><action>" + "u" * 300 + "</action>",
    ],
)
def test_malformed_answers_are_invalid(text):
    assert parse_action(text, SOKOBAN) == (None, False)
    assert parse_action(text) == (None, False)


@pytest.mark.parametrize("noise", ["ｕｐ", "úp", "u\u0301p", "uр"])  # fullwidth, accents, Cyrillic 'р'
def test_unicode_lookalikes_are_not_admissible(noise):
    assert parse_action(answer(noise), SOKOBAN)[1] is False


def test_huge_output_is_invalid():
    for text in [
        answer("up", think="x" * 10_000_000),
        "<think>" * 1_000_000,
        answer("up", think="x" * MAX_RESPONSE_CHARS),
    ]:
        assert parse_action(text, SOKOBAN) == (None, False)
    assert parse_action(answer("up", think="x" * (MAX_RESPONSE_CHARS - 100)), SOKOBAN) == ("up", True)


def test_non_string_input_is_invalid():
    assert parse_action(None, SOKOBAN) == (None, False)  # type: ignore[arg-type]
    assert parse_action(b"<think>a</think><action>up</action>") == (None, False)  # type: ignore[arg-type]


PIECES = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<action>",
        "</action>",
        "up",
        "Left",
        " ",
        "\n",
        "\u200b",
        "<",
        ">",
        "go north",
        "é",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300), st.lists(st.one_of(PIECES, st.text(max_size=5)), max_size=25).map("".join)
    )
)
def test_fuzz_never_raises_and_valid_means_admissible(text):
    for admissible in (SOKOBAN, TEXTWORLD, None):
        action, valid = parse_action(text, admissible)
        assert isinstance(valid, bool)
        if valid:
            assert action is not None
            assert admissible is None or action in admissible
            assert text.count("<action>") == 1 and text.count("<think>") == 1
        if action is None:
            assert not valid


@settings(max_examples=200, deadline=None)
@given(
    think=st.text(max_size=200).filter(lambda t: "<" not in t),
    action=st.sampled_from(TEXTWORLD),
    pad=st.sampled_from(["", " ", "\n", "\t \n"]),
    upper=st.booleans(),
)
def test_fuzz_well_formed_answers_round_trip(think, action, pad, upper):
    shown = action.upper() if upper else action
    text = f"{pad}<think>{think}</think>{pad}<action>{pad}{shown}{pad}</action>{pad}"
    assert parse_action(text, TEXTWORLD) == (action, True)
