"""Evaluation on held-out seeds: one episode per task, no skill in context (as deployed)."""

from __future__ import annotations

from collections.abc import Callable

from seed_vl.envs.group import EnvGroup
from seed_vl.policy import Policy
from seed_vl.rollout import SamplingSettings, collect_rollouts
from seed_vl.trajectory import Trajectory

EVAL_STEP = -1  # sampling seeds of evaluations are the same at every evaluation: runs compare like for like


def episode_stats(trajectories: list[Trajectory], prefix: str) -> dict[str, tuple[float, float]]:
    """(sum, count) per metric, so that processes can add theirs before dividing."""
    n = len(trajectories)
    turns = [t for traj in trajectories for t in traj.turns]
    return {
        f"{prefix}/success_rate": (sum(t.won for t in trajectories), n),
        f"{prefix}/return": (sum(t.episode_return for t in trajectories), n),
        f"{prefix}/episode_length": (sum(t.length for t in trajectories), n),
        f"{prefix}/invalid_action_rate": (sum(not t.action_valid for t in turns), len(turns)),
    }


def _local_mean(pairs: dict[str, tuple[float, float]]) -> dict[str, float]:
    return {k: (s / n if n else 0.0) for k, (s, n) in pairs.items()}


def evaluate(
    policy: Policy,
    group: EnvGroup,
    sampling: SamplingSettings,
    *,
    seed: int,
    prefix: str = "eval",
    reduce: Callable[[dict[str, tuple[float, float]]], dict[str, float]] = _local_mean,
) -> dict[str, float]:
    trajectories = collect_rollouts(policy, group, sampling, seed=seed, step=EVAL_STEP)
    return reduce(episode_stats(trajectories, prefix))


def run_evaluation(config) -> dict[str, float]:
    """`seed-vl eval`: evaluate `config.model.path` on `config.eval.num_tasks` held-out tasks."""
    policy = Policy.from_config(
        config.model, trainable=False, seed=config.train.seed, generation=config.generation
    )
    group = EnvGroup(config.env, num_tasks=config.eval.num_tasks, group_size=1, split="eval")
    sampling = SamplingSettings.from_config(config.rollout, temperature=config.eval.temperature)
    return evaluate(policy, group, sampling, seed=config.train.seed)
