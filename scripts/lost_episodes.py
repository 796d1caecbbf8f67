#!/usr/bin/env python
"""Where a Sokoban run's lost episodes were lost: replays each saved lost trajectory from its seed and counts
those whose room became unsolvable (a box pushed where no move sequence brings it to a target), at which
move, and how many turns were then spent in a room that could no longer be won. Those turns carry the
episode's negative advantage in a GRPO update although nothing they do matters (`env.end_on_deadlock`).
It also reports success by the room's shortest solution length: rooms always won or never won give GRPO
groups of equal returns, so the rooms in between are where its learning signal lies.

python scripts/lost_episodes.py RUN_DIR [RUN_DIR ...] [--steps N | --last N]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from seed_vl.config import ConfigError, load_config
from seed_vl.envs.registry import make_env
from seed_vl.envs.sokoban import SokobanEnv, is_deadlocked, solve
from seed_vl.report import step_window_arguments, window_records


def _sokoban_env(run_dir: Path) -> SokobanEnv:
    env = make_env(load_config(run_dir / "config.yaml", []).env)
    if not isinstance(env, SokobanEnv):
        raise ConfigError(f"{run_dir}: not a Sokoban run ({env.name})")
    return env


def lost_episode_stats(env: SokobanEnv, records: list[dict]) -> dict[str, float]:
    lost = turns_lost = turns_after = 0
    unsolvable_at: Counter[int] = Counter()
    for record in records:
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
        "episodes": len(records),
        "lost": lost,
        "lost, room made unsolvable": unsolvable,
        "share of lost": unsolvable / max(lost, 1),
        "mean move that made it unsolvable": sum(k * n for k, n in unsolvable_at.items()) / max(unsolvable, 1),
        "made unsolvable by move 2": sum(n for k, n in unsolvable_at.items() if k <= 2) / max(unsolvable, 1),
        "lost turns after it": turns_after / max(turns_lost, 1),
    }


def success_by_solution_length(env: SokobanEnv, records: list[dict]) -> dict[int, tuple[int, int]]:
    """Shortest solution length of the room -> (episodes won, episodes)."""
    shortest: dict[int, int] = {}  # seed -> length: a group's episodes share their room
    won: Counter[int] = Counter()
    played: Counter[int] = Counter()
    for record in records:
        if record["seed"] not in shortest:
            env.reset(record["seed"])
            shortest[record["seed"]] = len(solve(env.state) or [])
        played[shortest[record["seed"]]] += 1
        won[shortest[record["seed"]]] += bool(record["won"])
    return {length: (won[length], played[length]) for length in sorted(played)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[step_window_arguments()])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="Sokoban run directories written by `seed-vl train`")
    args = parser.parse_args(argv)
    try:
        for run_dir in args.run_dirs:
            env = _sokoban_env(run_dir)
            num_steps, records = window_records(run_dir, args)
            stats = {"update steps": num_steps, **lost_episode_stats(env, records)}
            print(f"{run_dir}: " + ", ".join(f"{k} {v:.3g}" for k, v in stats.items()))
            by_length = success_by_solution_length(env, records)
            print("  won by shortest solution: " + ", ".join(
                f"{k} moves {won}/{total}" for k, (won, total) in by_length.items()))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
