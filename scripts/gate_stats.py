#!/usr/bin/env python
"""Print the OPD gates of SEED/SDAR runs as a markdown table: move tokens (inside <action>) vs the rest, the
move tokens of won vs lost episodes, and every token by the probability the sampler gave it, with the
teacher-student log-prob gap the gates imply.

python scripts/gate_stats.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from seed_vl.config import ConfigError, load_config
from seed_vl.report import gate_statistics

GATED_PRESETS = ("seed", "sdar")  # grpo has no distillation term, opsd fixes every gate at 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", help="run directories written by `seed-vl train`")
    args = parser.parse_args(argv)
    print("| Run | Tokens | n | Gate mean | Gate > 0.5 | Gap (nats) |")
    print("|---|---|---|---|---|---|")
    try:
        for run_dir in map(Path, args.run_dirs):
            algorithm = load_config(run_dir / "config.yaml", []).algorithm
            if algorithm.preset not in GATED_PRESETS:
                print(f"| {run_dir.name} | preset {algorithm.preset}: no learned gate | | | | |")
                continue
            for name, s in gate_statistics(run_dir, algorithm.gate_beta).items():
                print(f"| {run_dir.name} | {name} | {s['tokens']} | {s['gate_mean']:.3f} | {s['open_frac']:.3f} "
                      f"| {s['gap_nats']:+.3f} |")
    except ConfigError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
