"""One full update step with `seed` and with `grpo` on the same batch of tiny-model rollouts.

    python benchmarks/bench_step.py [--json] [--tasks 8] [--group 4]
    python benchmarks/bench_step.py --model runs/reproduce/warmstart/model --max-new-tokens 32 \
        --analyzer-max-new-tokens 160     # a warm-started model: real answers and real skills

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
from seed_vl.tiny_model import build_tiny_model
from seed_vl.trainer import Trainer

PHASES = ("time/rollout", "time/analysis", "time/scoring", "time/update")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--model", help="model directory (default: build the tiny model in a temp dir)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--analyzer-max-new-tokens", type=int, default=48,
                        help="160 for a warm-started model, whose analyzer JSON is 65-125 tokens")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(build_tiny_model(os.path.join(tmp, "tiny"), seed=0))
        overrides = [
            f"model.path={model}", "model.device=cpu", "env.name=sokoban_visual", "env.cell_px=28",
            f"rollout.num_tasks={args.tasks}", f"rollout.group_size={args.group}",
            f"rollout.max_new_tokens={args.max_new_tokens}", "analyzer.backend=self",
            f"analyzer.max_new_tokens={args.analyzer_max_new_tokens}",
            "train.steps=1", "eval.num_tasks=1", "logging.progress=false", f"train.output_dir={tmp}/runs",
            "train.mini_batch_size=64", "train.micro_batch_size=16",
        ]
        results = {}
        trajectories = None
        for preset in ("grpo", "seed"):
            trainer = Trainer(load_config(None, [*overrides, f"algorithm.preset={preset}", f"train.run_name={preset}"]))
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
