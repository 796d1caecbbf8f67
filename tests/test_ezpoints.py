"""EZPoints: the deal and the rules of DESIGN §4, the exhaustive solver against plain arithmetic, frames."""

from __future__ import annotations

import collections
import itertools
import random

import numpy as np
import pytest

from seed_vl.config import EnvConfig
from seed_vl.envs.base import EpisodeOver
from seed_vl.envs.ezpoints import SOLVABLE_PAIRS, SUITS, Card, deal, evaluate, solve
from seed_vl.envs.registry import make_env
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


def test_the_uniform_pair_deal_flattens_the_pairs_and_keeps_every_deal_solvable():
    def pair_shares(kind: str) -> dict[tuple[int, ...], float]:
        pairs = collections.Counter(tuple(sorted(c.value for c in deal(random.Random(s), kind))) for s in range(9000))
        return {pair: n / 9000 for pair, n in pairs.items()}

    gym, flat = pair_shares("gym_cards"), pair_shares("uniform_pair")
    # gym_cards: a 10-valued card 4 times in 12, so "2 + 10 =" wins 37.5% of deals; here each pair 1/7.
    assert 0.35 < gym[(2, 10)] < 0.40 and max(gym.values()) == gym[(2, 10)]
    assert set(flat) == set(gym) == set(SOLVABLE_PAIRS)  # the same deals, only their frequencies differ
    assert all(0.12 < share < 0.165 for share in flat.values())
    dealt = [deal(random.Random(s), "uniform_pair") for s in range(2000)]
    assert {c.rank for cards in dealt for c in cards} == set(range(2, 14))  # faces still dealt, worth 10
    assert all(solve([c.value for c in cards]) for cards in dealt)


def test_the_environment_deals_as_configured():
    for kind in ("gym_cards", "uniform_pair"):
        env = make_env(EnvConfig(name="ezpoints_text", ezpoints_deal=kind))
        env.reset(11)
        assert env.cards == deal(random.Random(11), kind)
    assert deal(random.Random(11)) != deal(random.Random(11), "uniform_pair")


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
    [["3", "+", "4", "="], ["3", "="], ["="], ["4", "*", "="], ["3", "*", "4", "+", "="], ["3", "4", "="]],
    ids=["wrong", "one-card", "empty", "dangling", "trailing-operator", "digits-joined"],
)
def test_any_other_submission_costs_one_and_ends_the_episode(tokens):
    """gym_cards: '=' on a formula that is not 12 with both cards scores -1 ("3" "4" joins to 34)."""
    env = EZPointsTextEnv()
    env.reset(seed_with((3, 4)))
    results = [env.step(t) for t in tokens]
    assert [r[1] for r in results] == [0.0] * (len(tokens) - 1) + [-1.0]
    assert results[-1][2] and not results[-1][4]["won"]
    assert all(r[4]["action_valid"] for r in results)  # every token was accepted: the formula is what failed


def test_a_formula_with_a_stray_operator_is_not_silently_repaired():
    """"6 * 2 +" then '=' loses in gym_cards; the earlier rules dropped the '+' and paid +10."""
    env = EZPointsTextEnv()
    env.reset(seed_with((6, 2)))
    rewards = [env.step(t)[1] for t in ("6", "*", "2", "+", "=")]
    assert rewards == [0.0, 0.0, 0.0, 0.0, -1.0]


def test_operators_in_odd_places_are_accepted_and_a_unary_plus_evaluates_as_python_does():
    env = EZPointsTextEnv()
    env.reset(seed_with((3, 4)))
    rewards = [env.step(t)[1] for t in ("+", "3", "*", "4", "=")]
    assert rewards == [0.0, 0.0, 0.0, 0.0, 10.0]  # "+3*4" is 12 with both cards


@pytest.mark.parametrize(
    ("prefix", "bad"),
    [
        ([], "5"),  # not a card value
        (["3"], "3"),  # only one 3 on the table
        (["3", "*", "4"], "4"),  # both cards used already
        ([], None),  # the model output did not parse
        ([], "twelve"),  # outside the vocabulary
    ],
)
def test_invalid_tokens_cost_one_and_leave_a_blank(prefix, bad):
    env = EZPointsTextEnv()
    env.reset(seed_with((3, 4)))
    for token in prefix:
        assert env.step(token)[4]["action_valid"]
    obs, reward, terminated, truncated, info = env.step(bad)
    assert not info["action_valid"] and reward == -1.0 and not terminated and not truncated
    assert info["formula"] == [*prefix, " "] and info["step"] == len(prefix) + 1
    assert obs["text"].endswith(" ".join([*prefix, "_"]))


def test_a_blank_breaks_the_formula_it_lands_in():
    env = EZPointsTextEnv()
    env.reset(seed_with((3, 4)))
    rewards = [env.step(t)[1] for t in ("3", "9", "*", "4", "=")]  # "3 *4" still evaluates: +10
    assert rewards == [0.0, -1.0, 0.0, 0.0, 10.0]
    env.reset(seed_with((3, 4)))
    rewards = [env.step(t)[1] for t in ("3", "*", "9", "4", "=")]  # "3* 4" too
    assert rewards[-1] == 10.0
    env.reset(seed_with((10, 2)))
    rewards = [env.step(t)[1] for t in ("1", "10", "+", "2", "=")]  # " 10+2": the leading blank is ignored
    assert rewards == [-1.0, 0.0, 0.0, 0.0, 10.0]


def test_a_formula_longer_than_five_tokens_ends_the_episode_with_minus_one():
    env = EZPointsTextEnv()
    env.reset(seed_with((3, 4)))
    results = [env.step(None) for _ in range(7)]
    assert [r[1] for r in results] == [-1.0] * 7
    assert [r[3] for r in results] == [False] * 6 + [True] and not any(r[2] for r in results)
    assert results[-1][4]["formula"] == [" "] * 6  # the seventh token was never applied
    env.reset(seed_with((3, 4)))
    results = [env.step(t) for t in ("3", "+", "+", "+", "*", "4", "=")]  # '=' comes too late
    assert [r[1] for r in results] == [0.0] * 6 + [-1.0] and results[-1][3] and not results[-1][2]


def test_the_step_cap_truncates_without_a_reward():
    env = EZPointsTextEnv(max_steps=2)
    env.reset(seed_with((3, 4)))
    results = [env.step(t) for t in ("3", "*")]
    assert [r[1] for r in results] == [0.0, 0.0] and [r[3] for r in results] == [False, True]


def test_evaluate_respects_precedence():
    assert evaluate(("2", "+", "3", "*", "4")) == 14
    assert evaluate(("2", "*", "3", "+", "4")) == 10
    assert evaluate(("2", "+")) is None and evaluate(()) is None
    assert evaluate(("3", "4")) == 34 and evaluate(("+", "3")) == 3 and evaluate(("3", " ", "4")) is None
    assert evaluate(("3", "*", "*", "4")) is None  # no powers: '**' is not an operator of the game


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
