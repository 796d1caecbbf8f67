#!/usr/bin/env python
"""Which first move a run's training episodes open with, how often each one wins, and (SEED, SDAR) the gate
on its move tokens in won and lost episodes. A policy that opens every episode with one move, whatever the
observation, has collapsed onto a perception-free guess (EZPoints: '2' wins the deals of a 2 and a
10-valued card); the gate shows whether the distillation term could pull it out. With the run's config.yaml, also how often the
environment accepts the first move on the episode's own task and on the window's other tasks: where the two
are equal, the first move ignores the observation (EZPoints: a number not on the cards is refused).

python scripts/first_moves.py RUN_DIR [RUN_DIR ...] [--steps N | --last N] [--top K]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seed_vl.config import ConfigError, EnvConfig, load_config
from seed_vl.envs.registry import make_env
from seed_vl.report import move_gates, step_window_arguments, window_records


def first_move_stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Episodes, the first moves' (episodes, won) by move, and the first move's gates by outcome."""
    played: Counter[str] = Counter()
    won: Counter[str] = Counter()
    gates: dict[str, list[float]] = {"won": [], "lost": []}
    for record in records:
        if not record["turns"]:
            continue
        first = record["turns"][0]
        move = first["action"] if first["action"] is not None else "(none)"
        played[move] += 1
        won[move] += bool(record["won"])
        gates["won" if record["won"] else "lost"].extend(move_gates(first))
    return {
        "episodes": sum(played.values()),
        "moves": {move: (n, won[move]) for move, n in played.most_common()},
        "gates": gates,
    }


def first_move_acceptance(records: list[dict[str, Any]], env: EnvConfig) -> tuple[float, float]:
    """Shares of first moves the environment accepts on their own task and on every other task of `records`
    (the same move, another observation)."""
    game, accepted = make_env(env), {}

    def accepts(seed: int, move: str | None) -> bool:
        if (seed, move) not in accepted:
            game.reset(seed)
            accepted[seed, move] = bool(game.step(move)[4]["action_valid"])
        return accepted[seed, move]

    seeds = sorted({record["seed"] for record in records})
    own, other = [], []
    for record in records:
        if record["turns"]:
            move = record["turns"][0]["action"]
            own.append(accepts(record["seed"], move))
            other.extend(accepts(seed, move) for seed in seeds if seed != record["seed"])
    return sum(own) / max(len(own), 1), sum(other) / max(len(other), 1)


def _gate_text(gates: list[float]) -> str:
    if not gates:
        return "no gates"
    return f"mean {sum(gates) / len(gates):.3f}, open {sum(g > 0.5 for g in gates) / len(gates):.3f} ({len(gates)} tokens)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[step_window_arguments()])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories written by `seed-vl train`")
    parser.add_argument("--top", type=int, default=4, help="how many of the most frequent first moves to list")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top must be at least 1 (got {args.top})")
    try:
        for run_dir in args.run_dirs:
            num_steps, records = window_records(run_dir, args)
            stats = first_move_stats(records)
            moves = ", ".join(f"'{move}' {n} (won {w})" for move, (n, w) in list(stats["moves"].items())[: args.top])
            print(f"{run_dir}: update steps {num_steps}, episodes {stats['episodes']}, first moves: {moves}")
            for outcome, gates in stats["gates"].items():
                print(f"  first move's gate, {outcome}: {_gate_text(gates)}")
            if (run_dir / "config.yaml").is_file():
                own, other = first_move_acceptance(records, load_config(run_dir / "config.yaml").env)
                print(f"  first move accepted: {own:.1%} on its own task, {other:.1%} on the window's other tasks")
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
