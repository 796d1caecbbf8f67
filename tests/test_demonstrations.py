"""The toy's solver and random demonstrations, played through the rollout's episode loop."""

from __future__ import annotations

import random

import pytest

from seed_vl.config import EnvConfig
from seed_vl.envs import ezpoints, sokoban
from seed_vl.envs.base import step_route
from seed_vl.envs.registry import make_env
from seed_vl.processors.images import ImageSettings
from seed_vl.processors.parsing import parse_action
from seed_vl.processors.prompts import outcome_line
from seed_vl.sft import SFTExample
from seed_vl.skills import SKILL_HEADER
from seed_vl.toy.demonstrations import (
    demonstration_examples,
    play_demonstrations,
    play_random_episodes,
    terse_response,
)

TINY_IMAGES = ImageSettings(min_pixels=4 * 28 * 28, max_pixels=256 * 28 * 28)


def user_text(context: list[dict]) -> str:
    content = context[-1]["content"]
    return content if isinstance(content, str) else "".join(i.get("text", "") for i in content)


@pytest.mark.parametrize("env_name", ["sokoban_visual", "sokoban_text", "ezpoints_text", "ezpoints_visual"])
def test_demonstrations_replay_to_a_win(env_name):
    env_config = EnvConfig(name=env_name)
    images = TINY_IMAGES if env_name.endswith("visual") else None
    episodes = play_demonstrations(
        env_config, 6, seed=100, history_window=2, image_settings=images, rng=random.Random(0)
    )
    assert len(episodes) == 6 and len({e.seed for e in episodes}) == 6
    env = make_env(env_config)
    for episode in episodes:
        _, info = env.reset(episode.seed)
        for k, turn in enumerate(episode.turns):
            action, valid = parse_action(turn.response_text, info["admissible_actions"])
            assert valid and action == turn.action
            _, reward, terminated, _, info = env.step(action)
            assert info["action_valid"] and reward == turn.reward
            if k + 1 < episode.length:  # the next context shows this turn, as a rollout's would
                assert outcome_line(k + 1, action, True, reward) in user_text(episode.turns[k + 1].context)
        assert terminated and info["won"] and episode.won
        if env_name.startswith("sokoban"):  # BFS: the shortest solution, and the skill quotes it
            assert episode.length == len(sokoban.solve(sokoban.generate_room(episode.seed)))
            assert step_route(episode.actions) in episode.skill


def test_skill_episodes_follow_a_varied_plan_that_their_skill_names():
    """Without a skill: the solver's canonical plan. With one: another winning plan (another shortest
    order, or a detour first) that the skill quotes, so only the skill tells the moves apart."""
    env = EnvConfig(name="sokoban_text")
    kwargs = dict(history_window=2, image_settings=None)
    canonical = play_demonstrations(env, 12, seed=0, rng=random.Random(1), **kwargs)
    varied = play_demonstrations(env, 12, seed=0, rng=random.Random(1), varied=True, **kwargs)
    for episode in canonical:
        assert episode.actions == sokoban.solve(sokoban.generate_room(episode.seed))
    for episode in varied:
        assert episode.won and step_route(episode.actions) in episode.skill
    solutions = {e.seed: sokoban.solve(sokoban.generate_room(e.seed)) for e in varied}
    assert sum(e.actions != solutions[e.seed] for e in varied) >= 6
    assert sum(e.length > len(solutions[e.seed]) for e in varied) >= 3  # detours

    def with_skill(example: SFTExample) -> bool:
        return SKILL_HEADER in user_text(example.context)

    def examples(fraction: float) -> list[SFTExample]:
        return demonstration_examples(env, 4, seed=0, skill_fraction=fraction, rng=random.Random(1), **kwargs)

    always, never, half = examples(1.0), examples(0.0), examples(0.5)
    assert all(map(with_skill, always)) and not any(map(with_skill, never))
    assert not any(e.end_of_turn for e in always + never)
    assert 0 < sum(map(with_skill, half)) < len(half)


def test_ezpoints_skill_episodes_type_the_formula_their_skill_names():
    env = EnvConfig(name="ezpoints_text")
    episodes = play_demonstrations(
        env, 16, seed=0, history_window=2, image_settings=None, rng=random.Random(2), varied=True
    )
    for episode in episodes:
        assert " ".join(episode.actions[:-1]) in episode.skill and episode.actions[-1] == "="
    canonical = play_demonstrations(env, 16, seed=0, history_window=2, image_settings=None, rng=random.Random(2))
    for episode in canonical:
        values = make_env(env).reset(episode.seed)[1]["card_values"]
        assert tuple(episode.actions[:-1]) == ezpoints.solve(values)[0]


def test_textworld_demonstrations_follow_the_walkthrough(tmp_path, monkeypatch):
    pytest.importorskip("textworld", reason="TextWorld is the optional extra seed-vl[textworld]")
    monkeypatch.chdir(tmp_path)  # the game pool is generated under ./.cache
    env_config = EnvConfig(name="textworld", textworld_level=1, textworld_pool_size=1)
    (episode,) = play_demonstrations(
        env_config, 1, seed=0, history_window=2, image_settings=None, rng=random.Random(0)
    )
    env = make_env(env_config)
    env.reset(episode.seed)
    assert episode.won and episode.actions == env.walkthrough


def test_random_episodes_are_real_episodes_of_admissible_actions():
    env_config = EnvConfig(name="ezpoints_text")
    episodes = play_random_episodes(
        env_config, [3, 4], history_window=2, image_settings=None, rng=random.Random(0)
    )
    assert [e.seed for e in episodes] == [3, 4]
    env = make_env(env_config)
    for episode in episodes:
        assert 1 <= episode.length <= env.max_steps
        _, info = env.reset(episode.seed)
        for turn in episode.turns:
            assert parse_action(turn.response_text, info["admissible_actions"]) == (turn.action, True)
            _, reward, _, _, info = env.step(turn.action)
            assert reward == turn.reward


@pytest.mark.parametrize("env_name", ["sokoban_text", "ezpoints_text"])
def test_terse_answers_name_the_step_and_leave_the_move_to_the_action(env_name):
    """What the warm start trains on: the think text ends on the step's number and never states the move,
    so the move token inside `<action>` is where the frame (or a skill) decides."""
    episodes = play_demonstrations(
        EnvConfig(name=env_name), 6, seed=0, history_window=2, image_settings=None, rng=random.Random(0)
    )
    for episode in episodes:
        for k, turn in enumerate(episode.turns, 1):
            think, action = terse_response(turn.response_text).removeprefix("<think>").split("</think>")
            assert think.endswith(f"at step {k}") and action == f"<action>{turn.action}</action>"
            words = think.removesuffix(f"at step {k}").split()
            assert turn.action not in words and not any(m in words for m in sokoban.ACTIONS)
