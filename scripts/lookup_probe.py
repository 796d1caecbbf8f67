"""Can a model learn to look a step up in a route? The in-context retrieval that following a skill needs.

    python scripts/lookup_probe.py --model .cache/warmstart-sokoban-visual/model [--steps 800] [--lr 1e-3]

Trains a copy of the model (nothing is saved) by plain language modelling on synthetic documents: a route in
the skills' format ("step 1 up, step 2 left, ...") followed by lookups in the policy's answer format
("<think>I push the box at step 2</think><action>left</action>"), the loss on the looked-up move only.
Prints the move accuracy every 100 steps: 25% is chance (four moves); a model that has learned the lookup
approaches 100%. The toy's warm start can follow a skill only once its model can do this.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from seed_vl.envs.base import step_route

MOVES = ("up", "down", "left", "right")


def document(tokenizer, rng: random.Random, lookups: int) -> tuple[list[int], list[int]]:
    """(token ids, labels): a random route, then `lookups` of its steps in random order."""
    route = [rng.choice(MOVES) for _ in range(rng.randint(3, 12))]
    ids = tokenizer.encode(f"[Winning order: {step_route(route)}.]\n", add_special_tokens=False)
    labels = [-100] * len(ids)
    steps = rng.sample(range(1, len(route) + 1), min(lookups, len(route)))
    for k in steps:
        query = tokenizer.encode(f"<think>I push the box at step {k}</think><action>", add_special_tokens=False)
        move = tokenizer.encode(route[k - 1], add_special_tokens=False)
        close = tokenizer.encode("</action>\n", add_special_tokens=False)
        ids += query + move + close
        labels += [-100] * len(query) + move + [-100] * len(close)
    return ids, labels


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an HF image-text-to-text model directory")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lookups", type=int, default=6, help="looked-up steps per document")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model: no model at {args.model} (run `seed-vl warmstart --config RECIPE` first)")

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = AutoProcessor.from_pretrained(args.model).tokenizer
    for move in MOVES:
        if len(tokenizer.encode(move, add_special_tokens=False)) != 1:
            parser.error(f"--model: the tokenizer splits the move '{move}'; the probe needs one token per move")
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=True)
    pad = tokenizer.pad_token_id
    start, correct, total = time.perf_counter(), 0, 0
    for step in range(1, args.steps + 1):
        docs = [document(tokenizer, rng, args.lookups) for _ in range(args.batch)]
        width = max(len(ids) for ids, _ in docs)
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in docs])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in docs])
        attention_mask = (torch.arange(width)[None] < torch.tensor([len(ids) for ids, _ in docs])[:, None]).long()
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            targets, mask = labels[:, 1:], labels[:, 1:] != -100
            correct += (out.logits[:, :-1].argmax(-1)[mask] == targets[mask]).sum().item()
            total += mask.sum().item()
        if step % 100 == 0 or step == args.steps:
            print(f"step {step:5d}  loss {out.loss.item():.3f}  move accuracy {correct / total:.3f} "
                  f"(chance 0.250)  {time.perf_counter() - start:.0f}s", flush=True)
            correct = total = 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
