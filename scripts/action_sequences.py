#!/usr/bin/env python
"""Which whole action sequences a run's training episodes play (EZPoints: the formulas), how often each
wins, its mean return and (SEED, SDAR) the mean gate on each turn's move. Actions the environment rejected
are shown in brackets and unparsed ones as '[?]', so '[2] + + =' is a formula whose '2' was refused: where two
policies win the same deals, this shows what they do on the others and which moves the teacher turns down.

python scripts/action_sequences.py RUN_DIR [RUN_DIR ...] [--steps N | --last N] [--top K]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seed_vl.config import ConfigError
from seed_vl.report import move_gates, step_window_arguments, window_records


def action_sequence(record: dict[str, Any]) -> str:
    """The episode's actions joined by spaces: rejected ones in brackets, an unparsed one as '[?]'."""
    moves = []
    for turn in record["turns"]:
        move = "?" if turn["action"] is None else turn["action"]
        moves.append(move if turn["action_valid"] else f"[{move}]")
    return " ".join(moves)


def sequence_stats(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per action sequence, most played first: episodes, wins, mean return and each turn's mean move gate
    (None for a turn scored without a skill)."""
    episodes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        episodes[action_sequence(record)].append(record)
    stats = {}
    for sequence, group in sorted(episodes.items(), key=lambda item: -len(item[1])):
        gates: list[list[float]] = [[] for _ in group[0]["turns"]]
        for record in group:
            for position, turn in enumerate(record["turns"]):
                gates[position].extend(move_gates(turn))
        stats[sequence] = {
            "episodes": len(group),
            "won": sum(bool(r["won"]) for r in group),
            "return": sum(r["episode_return"] for r in group) / len(group),
            "gates": [sum(g) / len(g) if g else None for g in gates],
        }
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[step_window_arguments()])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories written by `seed-vl train`")
    parser.add_argument("--top", type=int, default=5, help="how many of the most played sequences to list")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top must be at least 1 (got {args.top})")
    try:
        for run_dir in args.run_dirs:
            num_steps, records = window_records(run_dir, args)
            print(f"{run_dir}: update steps {num_steps}, episodes {len(records)}")
            for sequence, row in list(sequence_stats(records).items())[: args.top]:
                gates = " ".join("—" if g is None else f"{g:.3f}" for g in row["gates"])
                print(f"  '{sequence}': {row['episodes']} episodes, won {row['won']}, "
                      f"mean return {row['return']:.2f}, move gates {gates}")
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
