"""One full update step with `seed` and with `grpo` on the same batch of tiny-model rollouts.

    python benchmarks/bench_step.py [--json] [--tasks 8] [--group 4]
    python benchmarks/bench_step.py --config configs/tiny/sokoban_visual.yaml   # the demo's warm-started model:
                                                                              # real answers and real skills
    python benchmarks/bench_step.py --config configs/tiny/sokoban_visual.yaml --model DIR \
        rollout.history_window=episode                                        # key=value overrides

Visual Sokoban, 8 tasks x group 4 by default. Both presets start from the same weights and learn from the
same trajectories (collected once); each phase's seconds are reported and the SEED/GRPO step-time ratio,
where a step = rollout + analysis + scoring + update (target: at most 1.3 with the self analyzer).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile

import torch

from seed_vl.config import load_config
from seed_vl.toy.tiny_model import build_tiny_model
from seed_vl.trainer import Trainer

PHASES = ("time/rollout", "time/analysis", "time/scoring", "time/update")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--config", help="a recipe whose environment, rollout and analyzer settings to use "
                        "(e.g. configs/tiny/sokoban_visual.yaml, with its warm-started model)")
    parser.add_argument("--model", help="model directory (default: the recipe's, else the untrained tiny model)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides, applied last")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            "model.device=cpu", f"rollout.num_tasks={args.tasks}", f"rollout.group_size={args.group}",
            "analyzer.backend=self", "train.steps=1", "eval.num_tasks=1", "logging.progress=false",
            f"train.output_dir={tmp}/runs", "train.mini_batch_size=64", "train.micro_batch_size=16",
        ]
        if args.config is None:  # the untrained tiny model: short generations, as nothing it writes parses
            overrides += ["env.name=sokoban_visual", "env.cell_px=28", "rollout.max_new_tokens=24",
                          "analyzer.max_new_tokens=48"]
        if args.model or args.config is None:
            model = args.model or str(build_tiny_model(os.path.join(tmp, "tiny"), seed=0))
            overrides.append(f"model.path={model}")
        results = {}
        trajectories = None
        for preset in ("grpo", "seed"):
            config = load_config(
                args.config, [*overrides, *args.overrides, f"algorithm.preset={preset}", f"train.run_name={preset}"]
            )
            trainer = Trainer(config)
            if trajectories is None:
                trajectories = trainer.rollout(step=1)
                rollout_seconds = trainer._timings["time/rollout"]
            metrics = trainer.learn(1, copy.deepcopy(trajectories))
            phases = {k: metrics.get(k, 0.0) for k in PHASES}
            phases["time/rollout"] = rollout_seconds
            phases["total"] = sum(phases.values())
            phases["cache/encoder_calls"] = metrics.get("cache/encoder_calls", 0.0)
            phases["cache/hits"] = metrics.get("cache/hits", 0.0)
            results[preset] = phases
    results["seed_over_grpo"] = results["seed"]["total"] / results["grpo"]["total"]
    results["setup"] = {"tasks": args.tasks, "group": args.group, "episodes": len(trajectories),
                        "turns": sum(t.length for t in trajectories), "threads": torch.get_num_threads()}
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return
    print(f"{'phase':16s} {'grpo':>9s} {'seed':>9s}")
    for key in (*PHASES, "total"):
        print(f"{key:16s} {results['grpo'][key]:9.2f} {results['seed'][key]:9.2f}")
    print(f"SEED / GRPO step time: {results['seed_over_grpo']:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
