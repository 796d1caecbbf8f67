"""Can a model learn to look a step up in a route? The in-context retrieval that following a skill needs.

    python scripts/lookup_probe.py --model .cache/warmstart-sokoban-visual/model [--steps 800] [--lr 1e-3]

Trains a copy of the model (nothing is saved) on the warm start's lookup-pretraining documents
(seed_vl/toy/lookup_pretraining.py), half of each kind: lookups (a route skill "step 1 up, step 2 left, ...",
then lookups in the policy's answer format "<think>I push the box at step 2</think><action>left</action>")
and copies (a route as the analyzer prompt words it, then a skill quoting it), the loss on the moves only.
Prints each kind's move accuracy every 100 steps: 25% is chance (four moves); a model that has learned the
lookup approaches 100%. `--steps 0` only measures it, e.g. on a warm-started model:

    python scripts/lookup_probe.py --model runs/reproduce-quick/warmstart/model --steps 0
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from seed_vl.toy.lookup_pretraining import BATCH_SIZE, LR, MOVES, lookup_accuracy, train_lookup


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an HF image-text-to-text model directory")
    parser.add_argument("--steps", type=int, default=800, help="0: measure the accuracy only, no training")
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--batch", type=int, default=BATCH_SIZE)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 0:
        parser.error(f"--steps: must be >= 0, got {args.steps}")
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model: no model at {args.model} (run `seed-vl warmstart --config RECIPE` first)")

    tokenizer = AutoProcessor.from_pretrained(args.model).tokenizer
    for move in MOVES:
        if len(tokenizer.encode(move, add_special_tokens=False)) != 1:
            parser.error(f"--model: the tokenizer splits the move '{move}'; the probe needs one token per move")
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32)
    if args.steps == 0:
        print(f"move accuracy {_kinds(lookup_accuracy(model, tokenizer, seed=args.seed))} (chance 0.250), no training")
        return 0
    start = time.perf_counter()
    train_lookup(
        model, tokenizer, args.steps, seed=args.seed, lr=args.lr, batch_size=args.batch, show_progress=False,
        log=lambda step, accuracy: print(
            f"step {step:5d}  move accuracy {_kinds(accuracy)} (chance 0.250)  {time.perf_counter() - start:.0f}s",
            flush=True,
        ),
    )
    return 0


def _kinds(accuracy: dict[str, float]) -> str:
    return ", ".join(f"{kind} {value:.3f}" for kind, value in accuracy.items())


if __name__ == "__main__":
    raise SystemExit(main())
