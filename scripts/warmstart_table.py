"""Compare warm starts: the skill and analyzer preconditions each `warmstart.json` (or base record) measured.

    python scripts/warmstart_table.py DIR/warmstart.json docs/runs/toy/base.json ...

Prints a Markdown row per file and environment: success with no, the correct and a wrong skill, the gap on
won correct-skill episodes, and the self-analyzer's valid and agreeing (won episodes) skills, in % unless
marked. A variant is built with `seed-vl warmstart --config configs/tiny/sokoban_visual.yaml` plus
`configs/reproduce/toy.yaml`'s overrides, `"warmstart.envs=[sokoban_visual, ezpoints_visual]"`,
`warmstart.out_dir=DIR` and the settings tried.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLUMNS = [  # (heading, measure, a share in % or nats)
    ("none", "skills/success/none", "%"),
    ("correct", "skills/success/correct", "%"),
    ("wrong", "skills/success/wrong", "%"),
    ("gap, won with correct skill", "skills/gap_correct/won", "nats"),
    ("skill valid", "analyzer/valid", "%"),
    ("agrees, won", "analyzer/agree_won", "%"),
]


def rows(path: Path) -> list[str]:
    base = json.loads(path.read_text())["base"]
    return [
        f"| {path} | {env} | "
        + " | ".join(f"{100 * m[key]:.1f}" if kind == "%" else f"{m[key]:+.2f}" for _, key, kind in COLUMNS)
        + " |"
        for env, m in base.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summaries", nargs="+", type=Path, metavar="JSON")
    args = parser.parse_args()
    print("| warm start | environment | " + " | ".join(heading for heading, _, _ in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for path in args.summaries:
        print("\n".join(rows(path)))


if __name__ == "__main__":
    main()
