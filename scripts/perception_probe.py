"""Does a model see the frame, and can it learn to? The precondition any RL from a warm start rests on.

    python scripts/perception_probe.py --model runs/reproduce-quick/warmstart/model --steps 0
    python scripts/perception_probe.py --model .cache/tiny-vl-lookup [--steps 1000] [--lr 1e-3] [key=value ...]
    python scripts/perception_probe.py --model runs/reproduce-card-sight/warmstart/model --steps 0 \
        --config configs/tiny/ezpoints_visual.yaml --tasks 128

First the floor: how many of the first `--random-tasks` held-out tasks a uniformly random policy wins within
the step budget. Then `seed_vl.toy.perception_probe` on held-out one-move tasks (played as the recipe's
evaluation plays them, no skill): the share whose first move wins (25% is chance) and the share of the most
frequent first move (a blind policy answers one move whatever it sees); on EZPoints, the share of held-out
deals of one solvable pair whose first number it ranks first as the solver answers (the smaller card), and
the share of its most frequent first number. With `--steps`, a copy of the model
(nothing is saved) is then trained on the recipe's canonical solver demonstrations, frame -> winning move,
no skill, and measured every `--every` steps, to tell a model that cannot learn to see from one that was not
trained long enough.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path

from seed_vl.config import ConfigError, load_config
from seed_vl.envs.registry import make_env
from seed_vl.policy import Policy
from seed_vl.sft import SFTSettings, train_sft
from seed_vl.toy.demonstrations import demonstration_examples, play_random_episodes, solver_plan
from seed_vl.toy.perception_probe import BLIND_FIRST_NUMBER, measure_perception


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an HF image-text-to-text model directory")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. rollout.history_window=0")
    parser.add_argument("--config", default="configs/tiny/sokoban_visual.yaml", help="the recipe (env, sampling)")
    parser.add_argument("--steps", type=int, default=1000, help="0: measure only, no training")
    parser.add_argument("--every", type=int, default=250, help="measure every this many steps")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--demonstrations", type=int, default=2000, help="solver episodes to train on")
    parser.add_argument("--train-vision-tower", action="store_true", help="train the tower too (RL freezes it)")
    parser.add_argument("--tasks", type=int, default=96, help="held-out one-move tasks measured")
    parser.add_argument("--random-tasks", type=int, default=400, help="held-out tasks a random policy plays")
    args = parser.parse_args(argv)
    for name in ("steps", "every", "batch", "demonstrations", "tasks", "random_tasks"):
        if getattr(args, name) < (0 if name == "steps" else 1):
            bound = ">= 0" if name == "steps" else ">= 1"
            parser.error(f"--{name.replace('_', '-')}: must be {bound}, got {getattr(args, name)}")
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model: no model at {args.model} (run `seed-vl warmstart --config RECIPE` first)")

    try:
        config = load_config(args.config, [
            f"model.path={args.model}", "model.device=cpu", "logging.progress=false",
            f"model.freeze_vision_tower={not args.train_vision_tower}", *args.overrides,
        ])
    except ConfigError as error:
        parser.error(str(error))
    policy = Policy.from_config(config.model, trainable=args.steps > 0, seed=0)

    def report(step: int) -> None:
        measured = measure_perception(policy, config, config.env, num_tasks=args.tasks)
        if not measured:
            raise SystemExit(f"--config: {config.env.name} has no one-move tasks to measure perception on")
        if "first_number/solver" in measured:  # EZPoints
            found = (f"first number as the solver's {measured['first_number/solver']:.3f} (one answer for every "
                     f"deal: {BLIND_FIRST_NUMBER:.3f})  most frequent first number "
                     f"{measured['first_number/top_answer']:.3f}")
        else:
            found = (f"first move wins {measured['one_action/solved']:.3f} (chance 0.250)  "
                     f"most frequent first move {measured['one_action/top_move']:.3f}")
        print(f"step {step:5d}  {found}  {time.perf_counter() - start:.0f}s", flush=True)

    start = time.perf_counter()
    seeds = [config.env.eval_seed_start + k for k in range(args.random_tasks)]
    random_play = play_random_episodes(
        config.env, seeds, history_window=config.rollout.history_window, image_settings=None, rng=random.Random(0)
    )
    game, rng = make_env(config.env), random.Random(0)
    one_move = sum(len(solver_plan(game, seed, rng) or ()) == 1 for seed in seeds)
    print(
        f"a uniformly random policy wins {sum(e.won for e in random_play)} of the first {len(seeds)} held-out "
        f"tasks; {one_move} of them are won by one move",
        flush=True,
    )
    report(0)
    if args.steps == 0:
        return 0
    examples = demonstration_examples(
        config.env, args.demonstrations, seed=config.env.train_seed_start,
        history_window=config.rollout.history_window, image_settings=policy.image_settings,
        skill_fraction=0.0, rng=random.Random(0),
    )
    random.Random(0).shuffle(examples)
    for done in range(0, args.steps, args.every):
        steps = min(args.every, args.steps - done)
        chunk = [examples[(done * args.batch + k) % len(examples)] for k in range(steps * args.batch)]
        settings = SFTSettings(epochs=1, lr=args.lr, batch_size=args.batch, micro_batch_size=args.batch, seed=done)
        train_sft(policy, chunk, settings, show_progress=False)  # a fresh AdamW per chunk: a probe, not a recipe
        report(done + steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
