"""TextWorld on freshly generated games: the protocol, the engine's won/lost, the cached pool, hindsight."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from seed_vl.config import EnvConfig
from seed_vl.envs.base import EpisodeOver

pytest.importorskip("textworld", reason="TextWorld is the optional extra seed-vl[textworld]")

from seed_vl.envs.text.textworld import (  # noqa: E402
    INVALID_ACTION_REWARD,
    WIN_BONUS,
    TextWorldEnv,
    game_pool,
    make_textworld_env,
)
from seed_vl.processors.messages import build_messages  # noqa: E402
from seed_vl.processors.parsing import parse_action  # noqa: E402
from seed_vl.processors.prompts import TASK_PREFIX  # noqa: E402

# The module's own filter is reset by pytest's per-test warning capture.
pytestmark = pytest.mark.filterwarnings("ignore:Game .* is not fully supported")

LEVEL = 1  # 5 rooms; take the named object, taking the decoy loses
CONFIG = EnvConfig(name="textworld", textworld_level=LEVEL, textworld_pool_size=2)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    cache = tmp_path_factory.mktemp("textworld")
    game_pool(LEVEL, CONFIG.textworld_pool_size, cache)  # generated once for the module
    return cache


@pytest.fixture
def env(cache_dir):
    env = make_textworld_env(CONFIG, cache_dir)
    yield env
    env.close()


def walkthrough(env: TextWorldEnv, seed: int) -> list[str]:
    env.reset(seed)
    return env.walkthrough


def test_walkthrough_wins_with_the_engine_score(env):
    obs, info = env.reset(0)
    assert obs["images"] == [] and obs["text"]
    assert info["won"] is False and info["action_valid"] is True
    assert info["task"] and "\n" not in info["task"]
    total = 0.0
    for command in walkthrough(env, 0):
        assert command in info["admissible_actions"]
        obs, reward, terminated, truncated, info = env.step(command)
        total += reward
    assert terminated and not truncated
    assert info["won"] and not info["lost"]
    assert total == info["max_score"] + WIN_BONUS


def test_invalid_commands_cost_and_leave_the_game_unchanged(env):
    obs, info = env.reset(1)
    room = obs["text"]
    for action in (None, "xyzzy", "take the moon"):
        obs, reward, terminated, truncated, info = env.step(action)
        assert reward == INVALID_ACTION_REWARD
        assert info["action_valid"] is False and not terminated
        assert obs["text"].splitlines()[0].startswith("Feedback: That is not an admissible command")
        assert obs["text"].splitlines()[1:] == room.splitlines()
    assert info["step"] == 3 and info["score"] == 0


def test_losing_is_decided_by_the_engine(env):
    """Wander with a seeded policy that never takes the named object: sooner or later it takes the decoy."""
    target = walkthrough(env, 0)[-1]
    env = TextWorldEnv(env.game_files, max_steps=500)
    obs, info = env.reset(0)
    policy = random.Random(0)
    actions = []
    for _ in range(500):
        admissible = info["admissible_actions"]
        actions.append(policy.choice([a for a in admissible if a != target]))
        obs, reward, terminated, truncated, info = env.step(actions[-1])
        if terminated:
            break
    assert info["lost"] and not info["won"]
    assert actions[-1].startswith("take ") and reward == 0.0

    hindsight = env.hindsight(0, actions, random.Random(0))
    assert hindsight["episode_summary"].startswith(f"Lost at step {len(actions)} by '{actions[-1]}'")
    fatal, needed = re.findall(r"'([^']+)'", hindsight["episode_skill"])
    assert fatal == actions[-1]
    assert needed in admissible and needed != fatal  # what the engine's plan wanted at that point
    env.close()


def test_truncation_at_max_steps(cache_dir):
    env = make_textworld_env(CONFIG.model_copy(update={"max_steps": 3}), cache_dir)
    env.reset(0)
    results = [env.step("look") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    with pytest.raises(EpisodeOver):
        env.step("look")
    env.close()


def test_default_step_budget_follows_the_walkthrough(env):
    env.reset(0)
    assert env.max_steps == max(8, 2 * len(walkthrough(env, 0)))


def test_same_seed_same_episode_and_global_rngs_untouched(cache_dir):
    random.seed(123)
    np.random.seed(123)
    py_state, np_state = random.getstate(), np.random.get_state()

    def episode(env):
        obs, info = env.reset(7)
        texts = [obs["text"]]
        for command in info["admissible_actions"][:3]:
            texts.append(env.step(command)[0]["text"])
        return texts, info["game"]

    first, second = make_textworld_env(CONFIG, cache_dir), make_textworld_env(CONFIG, cache_dir)
    assert episode(first) == episode(second)
    assert random.getstate() == py_state
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_state, strict=True))
    first.close()
    second.close()


def test_seeds_spread_over_the_pool(env):
    games = {env.reset(seed)[1]["game"] for seed in range(20)}
    assert games == {"game-0", "game-1"}


def test_pool_is_cached_and_grows_by_the_missing_games(cache_dir):
    before = {p: p.stat().st_mtime_ns for p in game_pool(LEVEL, 2, cache_dir)}
    py_state, np_state = random.getstate(), np.random.get_state()
    grown = game_pool(LEVEL, 3, cache_dir)
    assert random.getstate() == py_state  # generation draws from its own seeded generators too
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_state, strict=True))
    assert {p: p.stat().st_mtime_ns for p in grown[:2]} == before  # not regenerated
    assert grown[2].is_file() and grown[2].with_suffix(".json").is_file()
    assert sorted(p.name for p in (cache_dir / f"level-{LEVEL}").iterdir()) == ["game-0", "game-1", "game-2"]


def test_a_game_published_meanwhile_by_another_process_wins_the_race(tmp_path, monkeypatch):
    """Both builders generate game 0; the other one renames its directory into place first."""
    from seed_vl.envs.text import textworld as module

    real_compile = module.compile_game

    def compile_while_another_process_publishes(game, options):
        monkeypatch.setattr(module, "compile_game", real_compile)  # the other process compiles normally
        other = tmp_path / "other-process"
        game_pool(LEVEL, 1, other)
        (tmp_path / f"level-{LEVEL}").mkdir(exist_ok=True)
        (other / f"level-{LEVEL}" / "game-0").rename(tmp_path / f"level-{LEVEL}" / "game-0")
        return real_compile(game, options)

    monkeypatch.setattr(module, "compile_game", compile_while_another_process_publishes)
    (game,) = game_pool(LEVEL, 1, tmp_path)
    assert game.is_file() and game.with_suffix(".json").is_file()
    assert [p.name for p in (tmp_path / f"level-{LEVEL}").iterdir()] == ["game-0"]  # our copy was dropped


def test_prompt_lists_admissible_commands_and_parsed_actions_play(env):
    obs, info = env.reset(0)
    user = build_messages("textworld", obs, info, [], history_window=2)[1]["content"]
    assert f"{TASK_PREFIX} {info['task']}" in user
    assert f"Admissible actions: {', '.join(info['admissible_actions'])}" in user

    command = walkthrough(env, 0)[0]
    action, valid = parse_action(
        f"<think>follow the objective</think><action>{command.upper()}</action>", info["admissible_actions"]
    )
    assert (action, valid) == (command, True)
    assert env.step(action)[4]["action_valid"]


def test_hindsight_for_a_win_and_for_a_stall(env):
    route = walkthrough(env, 0)
    won = env.hindsight(0, route, random.Random(0))
    assert won["episode_summary"].startswith(f"Won in {len(route)} steps")

    stalled = [env.hindsight(0, ["look"] * 20, random.Random(k)) for k in range(12)]
    assert all(f"'{route[0]}'" in h["episode_skill"] for h in stalled)  # the missing sub-goal
    assert len({h["episode_skill"] for h in stalled}) > 1  # several phrasings

    invalid = env.hindsight(0, [None, "xyzzy"] * 10, random.Random(0))
    assert "admissible" in invalid["episode_skill"] and f"'{route[0]}'" in invalid["episode_skill"]

    for hindsight in [won, invalid, *stalled]:
        assert set(hindsight) == {"episode_summary", "episode_skill"}
        assert len(hindsight["episode_skill"].split()) >= 5


def test_missing_extra_is_a_one_line_error():
    script = textwrap.dedent("""
        import sys
        sys.modules["textworld"] = None  # as if the extra were not installed
        from seed_vl.config import EnvConfig
        from seed_vl.envs.text.textworld import make_textworld_env
        try:
            make_textworld_env(EnvConfig(name="textworld"))
        except ImportError as err:
            print(type(err).__name__, err)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == (
        "MissingExtraError TextWorld needs the optional extra: pip install 'seed-vl[textworld]'"
    )
