"""`seed-vl demo`: SEED end to end on the CPU with the tiny model, in one command.

Warm start (or reuse it: `seed_vl.toy.warmstart`, a stand-in for pretraining), then SEED RL with the self
analyzer on the recipe's environment (default: visual Sokoban 6x6 / 1 box). The run directory holds the
trainer's metrics.jsonl, checkpoints and trajectories, plus an HTML trajectory report of the last step and
the learning curve; the success rate before and after RL on the held-out evaluation seeds is printed.
"""

from __future__ import annotations

import time
from pathlib import Path

from seed_vl.config import Config, load_config
from seed_vl.plots import plot_runs
from seed_vl.report import write_report
from seed_vl.toy.warmstart import run_warmstart
from seed_vl.trainer import run_dir_for, train

DEFAULT_RECIPE = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "sokoban_visual.yaml"
SUCCESS = "eval/success_rate"
CURVES = ("success_rate", "return", "invalid_action_rate")


def run_demo(config_path: str | None, overrides: list[str]) -> Path:
    """Run the demo recipe (`config_path`, default `configs/tiny/sokoban_visual.yaml`) with `overrides`;
    returns the run directory."""
    start = time.perf_counter()
    config = load_config(config_path or DEFAULT_RECIPE, overrides)
    config.model.path = str(run_warmstart(config))
    warmed = time.perf_counter()
    config.train.run_name = fresh_run_name(config)
    run_dir = run_dir_for(config)

    metrics = train(config)
    report = write_report(run_dir)
    curve = plot_runs([run_dir], run_dir / "learning_curve.png", metric_keys=CURVES)

    before, after = metrics[0], metrics[-1]
    minutes = (time.perf_counter() - start) / 60
    print(
        f"\n{config.algorithm.preset.upper()} demo on {config.env.name}: {after['step']} RL steps, {minutes:.1f} min "
        f"(warm start {(warmed - start) / 60:.1f} min)\n"
        f"success rate on {config.eval.num_tasks} held-out tasks (temperature {config.eval.temperature:g}):\n"
        f"  before RL (step {before['step']}): {before[SUCCESS]:6.1%}\n"
        f"  after RL  (step {after['step']}): {after[SUCCESS]:6.1%}\n"
        f"outputs in {run_dir}/:\n"
        f"  metrics.jsonl, checkpoints/, trajectories/, {report.name}, {curve.name}"
    )
    return run_dir


def fresh_run_name(config: Config) -> str:
    """The recipe's run name, suffixed -2, -3, ... when that directory exists: a demo never appends to
    an earlier run's metrics."""
    base = run_dir_for(config)
    name, n = base.name, 1
    while (base.parent / name).exists():
        n += 1
        name = f"{base.name}-{n}"
    return name
