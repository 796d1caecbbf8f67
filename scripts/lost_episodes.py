#!/usr/bin/env python
"""Where a Sokoban run's lost episodes were lost: replays each saved lost trajectory from its seed and counts
those whose room became unsolvable (a box pushed where no move sequence brings it to a target), at which
move, and how many turns were then spent in a room that could no longer be won. Those turns carry the
episode's negative advantage in a GRPO update although nothing they do matters (`env.end_on_deadlock`).

python scripts/lost_episodes.py RUN_DIR [RUN_DIR ...] [--steps N]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from seed_vl.config import ConfigError, load_config
from seed_vl.envs.registry import make_env
from seed_vl.envs.sokoban import SokobanEnv, is_deadlocked
from seed_vl.report import read_trajectories, trajectory_steps


def lost_episode_stats(run_dir: Path, max_steps: int | None = None) -> dict[str, float]:
    env = make_env(load_config(run_dir / "config.yaml", []).env)
    if not isinstance(env, SokobanEnv):
        raise ConfigError(f"{run_dir}: not a Sokoban run ({env.name})")
    episodes = lost = 0
    turns_lost = turns_after = 0
    unsolvable_at: Counter[int] = Counter()
    steps = sorted(trajectory_steps(run_dir).items())[:max_steps]
    for _, step_dir in steps:
        for record in read_trajectories(step_dir / "trajectories.jsonl"):
            episodes += 1
            if record["won"]:
                continue
            lost += 1
            env.reset(record["seed"])
            state, turns = env.state, record["turns"]
            turns_lost += len(turns)
            for move, turn in enumerate(turns, 1):
                if turn["action_valid"]:
                    state = state.move(turn["action"])[0]
                if is_deadlocked(state):
                    unsolvable_at[move] += 1
                    turns_after += len(turns) - move
                    break
    unsolvable = sum(unsolvable_at.values())
    return {
        "update steps": len(steps),
        "episodes": episodes,
        "lost": lost,
        "lost, room made unsolvable": unsolvable,
        "share of lost": unsolvable / max(lost, 1),
        "mean move that made it unsolvable": sum(k * n for k, n in unsolvable_at.items()) / max(unsolvable, 1),
        "made unsolvable by move 2": sum(n for k, n in unsolvable_at.items() if k <= 2) / max(unsolvable, 1),
        "lost turns after it": turns_after / max(turns_lost, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="Sokoban run directories written by `seed-vl train`")
    parser.add_argument("--steps", type=int, default=None, help="only the first N update steps")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1 (got {args.steps})")
    try:
        for run_dir in args.run_dirs:
            stats = lost_episode_stats(run_dir, args.steps)
            print(f"{run_dir}: " + ", ".join(f"{k} {v:.3g}" for k, v in stats.items()))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
