"""Compare warm starts: the skill and analyzer preconditions each `warmstart.json` (or base record) measured.

    python scripts/warmstart_table.py DIR/warmstart.json docs/runs/toy/base.json ...
    python scripts/warmstart_table.py --measure MODEL_DIR --config RECIPE [KEY=VALUE ...] --out OUT.json

Prints a Markdown row per file and environment: success with no, the correct and a wrong skill, the gap on
won correct-skill episodes, and the self-analyzer's valid and agreeing (won episodes) skills, in % unless
marked. A variant is built with `seed-vl warmstart --config configs/tiny/sokoban_visual.yaml` plus
`configs/reproduce/toy.yaml`'s overrides, `"warmstart.envs=[sokoban_visual, ezpoints_visual]"`,
`warmstart.out_dir=DIR` and the settings tried. `--measure` measures a model as the warm start does, on the
recipe's environment and held-out tasks with its overrides (e.g. `env.min_solution_moves=3`: rooms of 3+
moves only), writes OUT.json and prints its row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from seed_vl.config import ConfigError, load_config
from seed_vl.io import atomic_write_text
from seed_vl.policy import Policy
from seed_vl.toy.warmstart import measure_base_policy

COLUMNS = [  # (heading, measure, a share in % or nats)
    ("none", "skills/success/none", "%"),
    ("correct", "skills/success/correct", "%"),
    ("wrong", "skills/success/wrong", "%"),
    ("gap, won with correct skill", "skills/gap_correct/won", "nats"),
    ("skill valid", "analyzer/valid", "%"),
    ("agrees, won", "analyzer/agree_won", "%"),
]


def rows(path: Path) -> list[str]:
    try:
        base = json.loads(path.read_text())["base"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ConfigError(f"{path}: not a warm-start summary or base record (no 'base' measures)") from None
    return [
        f"| {path} | {env} | "
        + " | ".join(f"{100 * m[key]:.1f}" if kind == "%" else f"{m[key]:+.2f}" for _, key, kind in COLUMNS)
        + " |"
        for env, m in base.items()
    ]


def measure(model_dir: str, recipe: str, overrides: list[str], out: Path) -> None:
    """Measure the model at `model_dir` as the warm start measures its base, on the recipe's environment."""
    config = load_config(recipe, overrides)
    policy = Policy.from_config(config.model, path=model_dir, seed=config.warmstart.seed)
    measures = {config.env.name: measure_base_policy(policy, config, config.env)}
    summary = {"model": model_dir, "config": recipe, "overrides": overrides, "base": measures}
    atomic_write_text(out, json.dumps(summary, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("items", nargs="*", metavar="JSON | KEY=VALUE",
                        help="summaries to compare; with --measure, overrides of the recipe")
    parser.add_argument("--measure", metavar="MODEL_DIR", help="measure this model instead of reading summaries")
    parser.add_argument("--config", help="with --measure: the recipe whose environment and evaluation to use")
    parser.add_argument("--out", type=Path, help="with --measure: where to write the measures")
    args = parser.parse_args(argv)
    try:
        if args.measure:
            if not (args.config and args.out):
                parser.error("--measure needs --config and --out")
            if not (Path(args.measure) / "config.json").is_file():
                raise ConfigError(f"--measure {args.measure}: not a model directory (no config.json)")
            measure(args.measure, args.config, args.items, args.out)
            summaries = [args.out]
        else:
            summaries = [Path(item) for item in args.items]
        table = [rows(path) for path in summaries]
    except (ConfigError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("| warm start | environment | " + " | ".join(heading for heading, _, _ in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for lines in table:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
