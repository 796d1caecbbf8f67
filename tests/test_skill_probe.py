"""The skill-following probe: correct skills from the solver, one real run on the tiny model."""

from __future__ import annotations

import math

from seed_vl.config import EnvConfig, load_config
from seed_vl.envs import sokoban
from seed_vl.envs.base import step_route
from seed_vl.policy import Policy
from seed_vl.toy.skill_probe import correct_skills, measure_skill_following


def test_correct_skills_name_the_solver_route_of_their_own_task():
    env = EnvConfig(name="sokoban_text")
    seeds = [1000, 1001, 1002]
    skills = correct_skills(env, seeds)
    for seed in seeds:
        assert step_route(sokoban.solve(sokoban.generate_room(seed))) in skills[seed]
    assert len(set(skills.values())) == 3


def test_probe_reports_every_condition_on_the_tiny_model(tiny_vl_path):
    config = load_config(None, [
        f"model.path={tiny_vl_path}", "model.device=cpu", "env.name=sokoban_visual", "env.cell_px=28",
        "env.max_steps=3", "rollout.max_new_tokens=6", "logging.progress=false",
    ])
    policy = Policy.from_config(config.model, trainable=False)
    metrics = measure_skill_following(policy, config, config.env, num_tasks=3)
    assert {f"success/{c}" for c in ("none", "correct", "wrong")} <= set(metrics)
    assert all(0.0 <= metrics[f"success/{c}"] <= 1.0 for c in ("none", "correct", "wrong"))
    for outcome in ("won", "lost"):
        gate = metrics[f"gate/{outcome}"]
        assert math.isnan(gate) == (metrics[f"move_tokens/{outcome}"] == 0)
        assert math.isnan(gate) or 0.0 < gate < 1.0
