"""EnvGroup and the registry: identical starts within a group, disjoint train/eval seeds, parallel stepping
equal to sequential, and no environment touching Python's or NumPy's global generators."""

from __future__ import annotations

import random

import numpy as np
import pytest

from seed_vl.config import ConfigError, EnvConfig
from seed_vl.envs.group import EnvGroup
from seed_vl.envs.registry import make_env
from seed_vl.envs.sokoban import generate_room

OWN_ENVS = ["sokoban_visual", "sokoban_text", "ezpoints_visual", "ezpoints_text"]


def fingerprint(obs) -> tuple:
    return obs["text"], tuple(img.tobytes() for img in obs["images"])


def play(group: EnvGroup, seed: int) -> list:
    """Random admissible (and some invalid) actions until every episode ends; returns everything seen."""
    rng = random.Random(seed)
    resets = group.reset()
    log = [fingerprint(obs) for obs, _ in resets]
    vocabulary = resets[0][1]["admissible_actions"]
    live = set(range(len(group)))
    while live:
        actions = {i: rng.choice([*vocabulary, None]) for i in sorted(live)}
        for i, (obs, reward, terminated, truncated, info) in group.step(actions).items():
            log.append((i, fingerprint(obs), reward, terminated, truncated, info))
            if terminated or truncated:
                live.discard(i)
    return log


@pytest.mark.parametrize("name", OWN_ENVS)
def test_group_members_start_identically_and_tasks_differ(name):
    group = EnvGroup(EnvConfig(name=name), num_tasks=3, group_size=4, split="train", step=2)
    starts = [fingerprint(obs) for obs, _ in group.reset()]
    assert group.group_ids == [0] * 4 + [1] * 4 + [2] * 4
    for task in range(3):
        assert len(set(starts[task * 4 : task * 4 + 4])) == 1  # byte for byte, frames included
    assert len({starts[0], starts[4], starts[8]}) > 1
    again = EnvGroup(EnvConfig(name=name), num_tasks=3, group_size=4, split="train", step=2)
    assert [fingerprint(obs) for obs, _ in again.reset()] == starts


def test_train_and_eval_seeds_come_from_disjoint_ranges():
    cfg = EnvConfig(name="ezpoints_text", train_seed_start=10, eval_seed_start=100)
    step0 = EnvGroup(cfg, num_tasks=4, group_size=2, step=0)
    step3 = EnvGroup(cfg, num_tasks=4, group_size=2, step=3)
    assert step0.seeds == [10, 10, 11, 11, 12, 12, 13, 13]
    assert step3.seeds[::2] == [22, 23, 24, 25]
    evals = [EnvGroup(cfg, num_tasks=5, group_size=1, split="eval", step=s).seeds for s in (0, 7)]
    assert evals[0] == evals[1] == [100, 101, 102, 103, 104]  # the same evaluation tasks every time
    with pytest.raises(ConfigError, match="env.eval_seed_start"):
        EnvGroup(cfg, num_tasks=4, group_size=2, step=23)  # 10 + 23 * 4 reaches 100


def test_task_indices_select_a_share_of_the_tasks():
    cfg = EnvConfig(name="sokoban_text")
    full = EnvGroup(cfg, num_tasks=4, group_size=2, step=1)
    share = EnvGroup(cfg, num_tasks=4, group_size=2, step=1, task_indices=[1, 3])
    assert share.group_ids == [1, 1, 3, 3]
    assert share.seeds == [s for s, g in zip(full.seeds, full.group_ids, strict=True) if g in (1, 3)]
    with pytest.raises(ValueError, match="task_indices"):
        EnvGroup(cfg, num_tasks=4, group_size=2, task_indices=[4])


@pytest.mark.parametrize("name", ["sokoban_visual", "ezpoints_visual"])
def test_parallel_stepping_matches_sequential(name):
    sequential = play(EnvGroup(EnvConfig(name=name), num_tasks=3, group_size=2), seed=1)
    parallel = play(EnvGroup(EnvConfig(name=name, parallel_workers=2), num_tasks=3, group_size=2), seed=1)
    assert parallel == sequential


def test_step_only_touches_the_named_environments():
    group = EnvGroup(EnvConfig(name="ezpoints_text"), num_tasks=2, group_size=2)
    group.reset()
    results = group.step({1: "=", 3: None})
    assert sorted(results) == [1, 3] and results[1][2] and not results[3][2]
    assert group.envs[0].step("=")[4]["step"] == 1  # env 0 was not stepped by the group


@pytest.mark.parametrize("name", OWN_ENVS)
def test_reset_and_step_leave_the_global_generators_alone(name):
    random.seed(123)
    np.random.seed(123)
    py_state, np_state = random.getstate(), np.random.get_state()
    generate_room.cache_clear()  # generate the rooms here, not in an earlier test
    env = make_env(EnvConfig(name=name))
    for seed in (0, 1, 2):
        _, info = env.reset(seed)
        for action in info["admissible_actions"][:3]:
            env.step(action)
    assert random.getstate() == py_state
    after = np.random.get_state()
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1]) and after[2:] == np_state[2:]


def test_registry_builds_each_env_from_its_config():
    env = make_env(EnvConfig(name="sokoban_visual", dim_room=(7, 7), num_boxes=2, cell_px=8, max_steps=20))
    obs, info = env.reset(0)
    assert env.name == "sokoban_visual" and env.max_steps == 20 and obs["images"][0].size == (56, 56)
    assert "2 boxes" in info["task"]
    env = make_env(EnvConfig(name="ezpoints_visual", image_size=112))
    assert env.reset(0)[0]["images"][0].size == (112, 112) and env.max_steps == 8
    assert make_env(EnvConfig(name="sokoban_text")).max_steps == 15
