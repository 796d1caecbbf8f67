"""Can a freshly initialised tiny VL model learn to see a one-push room? Its multimodal RoPE layout decides.

    python scripts/rope_probe.py --model .cache/tiny-vl                          # the builder's layout
    python scripts/rope_probe.py --model .cache/tiny-vl --section 4,6,6          # Qwen2.5-VL's split
    python scripts/rope_probe.py --model .cache/tiny-vl --section 0,8,8 --theta 10

Trains new random weights in `--model`'s architecture (its tokenizer and processor; nothing is saved) on the
barest form of the policy's decision: a frame of a training room whose solver plan is one push, then
"<action>", the loss on the move only. Prints the share of `--held-out` held-out one-push rooms answered
right every 100 steps (25% is chance). The rotary-layout comment in seed_vl/toy/tiny_model.py quotes it.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from seed_vl.envs.sokoban import ACTIONS, SEARCH_DEPTH, generate_room, solve
from seed_vl.envs.visual.sokoban import render_frame

PROMPT = (
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Which move wins?<|im_end|>\n"
    "<|im_start|>assistant\n<action>"
)


def one_push_rooms(first_seed: int, count: int, cell_px: int) -> list[tuple[object, int]]:
    """(frame, index of the winning move) of the first `count` rooms from `first_seed` that one push solves."""
    rooms, seed = [], first_seed
    while len(rooms) < count:
        state = generate_room(seed, (6, 6), 1, SEARCH_DEPTH)
        plan = solve(state)
        if plan is not None and len(plan) == 1:
            rooms.append((render_frame(state, cell_px), ACTIONS.index(plan[0])))
        seed += 1
    return rooms


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a tiny image-text-to-text model directory")
    parser.add_argument("--section", help="mrope_section, e.g. 4,6,6 (default: the model's)")
    parser.add_argument("--theta", type=float, help="rope_theta (default: the model's)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--train-rooms", type=int, default=1500)
    parser.add_argument("--held-out", type=int, default=256, help="held-out rooms measured")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--cell-px", type=int, default=28, help="28: one cell per merged 14-px patch pair")
    args = parser.parse_args(argv)
    for name in ("steps", "train_rooms", "held_out"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model: no model at {args.model} (build one with seed_vl.toy.tiny_model.build_tiny_model)")
    config = AutoConfig.from_pretrained(args.model)
    rope = config.get_text_config().rope_parameters
    try:
        if args.section:
            rope["mrope_section"] = [int(part) for part in args.section.split(",")]
    except ValueError:
        parser.error(f"--section: comma-separated integers, got {args.section!r}")
    if args.theta is not None:
        if args.theta <= 0:
            parser.error(f"--theta: must be > 0, got {args.theta}")
        rope["rope_theta"] = args.theta
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    model.model.visual.requires_grad_(False)  # as RL and the warm start's pretraining keep it
    processor = AutoProcessor.from_pretrained(args.model)
    moves = [processor.tokenizer.convert_tokens_to_ids(move) for move in ACTIONS]

    start = time.perf_counter()
    train = one_push_rooms(0, args.train_rooms, args.cell_px)
    held_out = one_push_rooms(1_000_000, args.held_out, args.cell_px)
    print(f"mrope {rope}; {len(train)} training rooms", flush=True)

    def logits(rooms: list) -> torch.Tensor:
        inputs = processor(images=[frame for frame, _ in rooms], text=[PROMPT] * len(rooms), return_tensors="pt")
        return model(**inputs).logits[:, -1, moves]

    @torch.no_grad()
    def accuracy() -> float:
        model.eval()
        right = sum(
            int((logits(held_out[k : k + 64]).argmax(-1) == torch.tensor([m for _, m in held_out[k : k + 64]])).sum())
            for k in range(0, len(held_out), 64)
        )
        model.train()
        return right / len(held_out)

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    rng = random.Random(0)
    print(f"step     0  held-out one-push rooms right {accuracy():.3f} (chance 0.250)", flush=True)
    for step in range(1, args.steps + 1):
        batch = rng.sample(train, 32)
        loss = torch.nn.functional.cross_entropy(logits(batch), torch.tensor([m for _, m in batch]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == args.steps:
            print(f"step {step:5d}  held-out one-push rooms right {accuracy():.3f} (chance 0.250)  "
                  f"{time.perf_counter() - start:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
