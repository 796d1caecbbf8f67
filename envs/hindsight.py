"""The scripted hindsight analyzer: the offline stand-in for an external analyzer (DESIGN §1 stage 1).

It replays a finished trajectory from its seed with the environment's own rules and solver and writes the
analyzer's JSON, `{"episode_summary", "episode_skill"}`: a workflow skill for a success, an avoidance rule
naming the concrete mistake for a failure. Each environment implements `Env.hindsight`; this module only
dispatches (TextWorld included: its environment brings its own `hindsight`).
"""

from __future__ import annotations

import random

from seed_vl.config import EnvConfig
from seed_vl.envs.base import Hindsight
from seed_vl.envs.registry import make_env
from seed_vl.trajectory import Trajectory


def scripted_hindsight(trajectory: Trajectory, rng: random.Random, env_config: EnvConfig) -> Hindsight:
    """`rng` picks among several phrasings, so a model trained on the output learns no single template."""
    if trajectory.env_name != env_config.name:
        raise ValueError(
            f"a '{trajectory.env_name}' trajectory cannot be analyzed with env.name='{env_config.name}'"
        )
    return make_env(env_config).hindsight(trajectory.seed, trajectory.actions, rng)
