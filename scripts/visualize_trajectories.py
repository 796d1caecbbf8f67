#!/usr/bin/env python
"""Write one self-contained HTML report (frames, actions, skills, per-token gates) of a run's trajectories.

python scripts/visualize_trajectories.py RUN_DIR [--step N] [--out FILE.html] [--max-episodes K] [--gif]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from seed_vl.config import ConfigError
from seed_vl.report import write_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run directory written by `seed-vl train`")
    parser.add_argument("--step", type=int, help="update step to show (default: the latest one saved)")
    parser.add_argument("--out", help="HTML file to write (default: RUN_DIR/report_step_N.html)")
    parser.add_argument("--max-episodes", type=int, default=16, help="episodes to show (default: 16)")
    parser.add_argument("--gif", action="store_true", help="also write one animated GIF per shown episode")
    args = parser.parse_args(argv)
    try:
        out = write_report(
            args.run_dir, step=args.step, out=args.out, max_episodes=args.max_episodes, gif=args.gif
        )
    except ConfigError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(f"report written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
