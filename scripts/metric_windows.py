#!/usr/bin/env python
"""Follow training metrics through a run: the mean of each named metric over each window of N updates, as a
markdown table (e.g. whether invalid actions or entropy rise: `--metric train/invalid_action_rate`).

python scripts/metric_windows.py RUN_DIR [RUN_DIR ...] --metric NAME [--metric NAME ...] [--window N]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from seed_vl.config import ConfigError
from seed_vl.tracking import read_metrics


def window_means(rows: list[dict[str, Any]], metrics: Sequence[str], window: int) -> list[tuple[str, list[float]]]:
    """(first-last update, the mean of each metric) per window of `window` update rows (those that log
    every metric; evaluation-only rows are skipped)."""
    updates = [row for row in rows if all(name in row for name in metrics)]
    if not updates:
        raise ValueError(f"no update logs all of {', '.join(metrics)}")
    blocks = [updates[i:i + window] for i in range(0, len(updates), window)]
    return [(f"{block[0]['step']}-{block[-1]['step']}", [sum(row[name] for row in block) / len(block)
                                                        for name in metrics]) for block in blocks]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories written by `seed-vl train`")
    parser.add_argument("--metric", action="append", required=True, help="a key of metrics.jsonl (repeatable)")
    parser.add_argument("--window", type=int, default=10, metavar="N", help="updates per window (default 10)")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error(f"--window must be at least 1 update, got {args.window}")
    print("| run | updates | " + " | ".join(args.metric) + " |")
    print("|---" * (len(args.metric) + 2) + "|")
    for run in args.runs:
        try:
            windows = window_means(read_metrics(run), args.metric, args.window)
        except (ConfigError, ValueError) as error:
            print(f"error: {run}: {error}", file=sys.stderr)
            return 2
        for steps, means in windows:
            print(f"| {run} | {steps} | " + " | ".join(f"{mean:.3f}" for mean in means) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
