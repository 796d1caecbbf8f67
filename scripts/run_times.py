#!/usr/bin/env python
"""Where a run's time went: per run, its updates and environment steps, the mean seconds per update of each
phase (the trainer's `time/*` metrics), the seconds per environment step, and its held-out success curve.
Runs trained side by side on one machine compare fairly (e.g. one setting against another); runs of
different machines or loads do not.

python scripts/run_times.py RUN_DIR [...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from seed_vl.config import ConfigError
from seed_vl.tracking import read_metrics

PHASES = ("rollout", "analysis", "scoring", "update")


def run_times(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of one run's metrics rows (one per update, plus evaluation rows)."""
    updates = [r for r in rows if "time/update" in r and "env_steps" in r]
    if not updates:
        raise ValueError("no update rows (no 'time/update' and 'env_steps' metrics)")
    phases = {p: sum(r.get(f"time/{p}", 0.0) for r in updates) / len(updates) for p in PHASES}
    seconds = sum(sum(r.get(f"time/{p}", 0.0) for p in PHASES) for r in updates)
    env_steps = updates[-1]["env_steps"]
    return {
        "updates": len(updates),
        "env_steps": env_steps,
        "phases": phases,
        "seconds_per_env_step": seconds / env_steps,
        "success": [(r["step"], r["eval/success_rate"]) for r in rows if "eval/success_rate" in r],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories written by `seed-vl train`")
    args = parser.parse_args(argv)
    summaries = {}
    for run in args.runs:
        try:
            summaries[run] = run_times(read_metrics(run))
        except (ConfigError, ValueError) as error:
            print(f"error: {run}: {error}", file=sys.stderr)
            return 2
    print("| run | updates | env steps | " + " | ".join(f"{p}, s" for p in PHASES)
          + " | s per env step | held-out success, % (update) |")
    print("|---" * (len(PHASES) + 5) + "|")
    for run, summary in summaries.items():
        phases = " | ".join(f"{summary['phases'][p]:.1f}" for p in PHASES)
        curve = ", ".join(f"{100 * s:.1f} ({step})" for step, s in summary["success"])
        print(f"| {run} | {summary['updates']} | {summary['env_steps']} | {phases} | "
              f"{summary['seconds_per_env_step']:.3f} | {curve} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
