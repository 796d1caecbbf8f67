#!/usr/bin/env python
"""Plot success rate and return against environment steps for one or more runs (one line per label).

    python scripts/plot_runs.py RUN_DIR [RUN_DIR ...] --out FILE.png [--label NAME ...] [--metric KEY ...]

Runs that share a label (by default `<algorithm.preset> / <env.name>` from each run's config.yaml) are
drawn as their mean with a min-max band: give seeds of one recipe the same label.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from seed_vl.config import ConfigError
from seed_vl.plots import DEFAULT_METRICS, plot_runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by `seed-vl train`"
    )
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument(
        "--label", action="append", dest="labels", help="label of each run, in order (repeat)"
    )
    parser.add_argument(
        "--metric",
        action="append",
        dest="metrics",
        help=f"metric panel, e.g. success_rate (repeat; default: {' '.join(DEFAULT_METRICS)})",
    )
    args = parser.parse_args(argv)
    try:
        out = plot_runs(
            args.run_dirs, args.out, labels=args.labels, metric_keys=args.metrics or DEFAULT_METRICS
        )
    except ConfigError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(f"plot written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
