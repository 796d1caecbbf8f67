#!/usr/bin/env python
"""Print the OPD gates of SEED/SDAR runs as a markdown table: move tokens (inside <action>) vs the rest, the
move tokens of won vs lost episodes, the token after the move (the closing tag or not), and every token by the
probability the sampler gave it, with the teacher-student log-prob gap the gates imply; over the whole run, or
per window of `--window` updates to follow the gates through training.

python scripts/gate_stats.py RUN_DIR [RUN_DIR ...] [--window N]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from seed_vl.config import ConfigError, load_config
from seed_vl.report import gate_statistics, trajectory_steps

GATED_PRESETS = ("seed", "sdar")  # grpo has no distillation term, opsd fixes every gate at 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", help="run directories written by `seed-vl train`")
    parser.add_argument("--window", type=int, default=0, metavar="N",
                        help="one block of rows per N updates (default 0: the whole run)")
    args = parser.parse_args(argv)
    if args.window < 0:
        parser.error(f"--window must be a number of updates (0: the whole run), got {args.window}")
    print("| Run | Updates | Tokens | n | Gate mean | Gate > 0.5 | Gap (nats) |")
    print("|---|---|---|---|---|---|---|")
    try:
        for run_dir in map(Path, args.run_dirs):
            algorithm = load_config(run_dir / "config.yaml", []).algorithm
            if algorithm.preset not in GATED_PRESETS:
                print(f"| {run_dir.name} | preset {algorithm.preset}: no learned gate | | | | | |")
                continue
            saved = sorted(trajectory_steps(run_dir))
            width = args.window or saved[-1] - saved[0] + 1
            for first in range(saved[0], saved[-1] + 1, width):
                steps = range(first, first + width)
                for name, s in gate_statistics(run_dir, algorithm.gate_beta, steps).items():
                    print(f"| {run_dir.name} | {first}-{steps[-1]} | {name} | {s['tokens']} | {s['gate_mean']:.3f} "
                          f"| {s['open_frac']:.3f} | {s['gap_nats']:+.3f} |")
    except ConfigError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
