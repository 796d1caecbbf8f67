"""EZPoints: the deal and the rules of DESIGN §4, the exhaustive solver against plain arithmetic, frames."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from seed_vl.envs.base import EpisodeOver
from seed_vl.envs.ezpoints import SUITS, Card, deal, evaluate, solve
from seed_vl.envs.text.ezpoints import EZPointsTextEnv
from seed_vl.envs.visual.ezpoints import TABLE_GREEN, EZPointsVisualEnv, render_table


def seed_with(values: tuple[int, int]) -> int:
    """The first seed whose deal has exactly these card values, in this order."""
    return next(s for s in range(10_000) if tuple(c.value for c in deal(random.Random(s))) == values)


def arithmetic_solutions(values: tuple[int, int]) -> set[tuple[str, ...]]:
    """Independent oracle: number-operator-number with both cards, judged by Python's arithmetic."""
    return {
        (str(x), op, str(y))
        for x, y in itertools.permutations(values)
        for op in "+*"
        if (x + y if op == "+" else x * y) == 12
    }


def test_every_deal_over_thousands_of_seeds_follows_the_spec_and_is_solvable():
    seen_ranks, sum_deals, product_deals = set(), 0, 0
    for seed in range(3000):
        cards = deal(random.Random(seed))
        values = tuple(c.value for c in cards)
        assert all(2 <= c.rank <= 13 and c.suit in SUITS for c in cards)
        seen_ranks.update(c.rank for c in cards)
        sum_deals += sum(values) == 12
        product_deals += values[0] * values[1] == 12 and sum(values) != 12
        assert set(solve(values)) == arithmetic_solutions(values) != set(), f"seed {seed}: {cards}"
    assert seen_ranks == set(range(2, 14))  # J, Q, K do occur (and count 10)
    assert sum_deals > product_deals > 300  # 12 - c1 always possible, 12 // c1 half the time for 2, 3, 4, 6


def test_deal_is_a_function_of_the_seed_and_both_orders_occur():
    assert deal(random.Random(7)) == deal(random.Random(7))
    firsts = {deal(random.Random(s))[0].value for s in range(200)}
    assert 2 in firsts and 10 in firsts  # (10, 2) and (2, 10) both appear: the order is shuffled


def test_winning_formula_earns_ten_and_ends_the_episode():
    env = EZPointsTextEnv()
    env.reset(seed_with((3, 4)))
    for token in ("3", "*", "4"):
        _, reward, terminated, truncated, info = env.step(token)
        assert (reward, terminated, truncated, info["action_valid"]) == (0.0, False, False, True)
    _, reward, terminated, truncated, info = env.step("=")
    assert (reward, terminated, truncated, info["won"]) == (10.0, True, False, True)
    assert info["formula"] == ["3", "*", "4"]
    with pytest.raises(EpisodeOver):
        env.step("=")


@pytest.mark.parametrize(
    "tokens",
    [["3", "+", "4", "="], ["3", "="], ["="], ["4", "*", "="]],
    ids=["wrong", "one-card", "empty", "dangling"],
)
def test_any_other_submission_earns_nothing(tokens):
    env = EZPointsTextEnv()
    env.reset(seed_with((3, 4)))
    results = [env.step(t) for t in tokens]
    assert [r[1] for r in results] == [0.0] * len(tokens)
    assert results[-1][2] and not results[-1][4]["won"]


@pytest.mark.parametrize(
    ("prefix", "bad"),
    [
        ([], "5"),  # not a card value
        ([], "+"),  # an operator before any number
        (["3"], "4"),  # two numbers in a row
        (["3"], "3"),  # only one 3 on the table
        (["3", "*", "4"], "+"),  # no card left to follow the operator
        ([], None),  # the model output did not parse
        ([], "twelve"),  # outside the vocabulary
    ],
)
def test_invalid_tokens_change_nothing_and_cost_a_step(prefix, bad):
    env = EZPointsTextEnv()
    env.reset(seed_with((3, 4)))
    for token in prefix:
        assert env.step(token)[4]["action_valid"]
    obs, reward, terminated, truncated, info = env.step(bad)
    assert not info["action_valid"] and reward == 0.0 and not terminated and not truncated
    assert info["formula"] == prefix and info["step"] == len(prefix) + 1


def test_truncated_after_eight_steps():
    env = EZPointsVisualEnv()
    env.reset(0)
    results = [env.step(None) for _ in range(8)]
    assert [r[3] for r in results] == [False] * 7 + [True] and not any(r[2] for r in results)


def test_evaluate_respects_precedence():
    assert evaluate(("2", "+", "3", "*", "4")) == 14
    assert evaluate(("2", "*", "3", "+", "4")) == 10
    assert evaluate(("2", "+")) is None and evaluate(()) is None


def test_frame_is_a_green_table_with_two_distinct_legible_cards():
    env = EZPointsVisualEnv()
    obs, info = env.reset(seed_with((3, 4)))
    frame = obs["images"][0]
    assert frame.size == (300, 300) and frame.mode == "RGB"
    green = tuple(int(TABLE_GREEN[i : i + 2], 16) for i in (1, 3, 5))
    assert frame.getpixel((2, 2)) == green and frame.getpixel((150, 298)) == green
    after = env.step("3")[0]["images"][0]
    assert after.tobytes() != frame.tobytes()  # the formula line changed
    assert len(info["cards"]) == 2 and all(" of " in c for c in info["cards"])


def test_every_card_renders_differently_and_red_suits_are_red():
    frames = {}
    for rank, suit in itertools.product(range(2, 14), SUITS):
        frame = np.asarray(render_table((Card(rank, suit), Card(rank, suit)), ()))
        frames[frame.tobytes()] = (rank, suit)
        reddish = ((frame[..., 0] > 150) & (frame[..., 1] < 80) & (frame[..., 2] < 80)).sum()
        assert (reddish > 50) == (suit in ("hearts", "diamonds")), (rank, suit)
    assert len(frames) == 12 * 4


def test_text_observation_names_cards_and_formula():
    env = EZPointsTextEnv()
    obs, info = env.reset(seed_with((3, 4)))
    assert obs["images"] == [] and "Formula: (empty)" in obs["text"]
    assert all(card in obs["text"] for card in info["cards"])
    assert env.step("3")[0]["text"].endswith("Formula: 3")
    assert info["admissible_actions"] == [str(n) for n in range(1, 11)] + ["+", "*", "="]
