"""Paired scoring with the image-embedding cache against the plain `pixel_values` forward.

    python benchmarks/bench_scoring.py [--json] [--models tiny scaled] [--repeats 5] [--frame-size 96]

One update step's scoring: 8 consecutive turns of one episode, each context holding the current frame and
2 history frames (10 unique frames), scored as 16 contexts (8 ordinary + the same 8 with a skill) by the
old policy / teacher, then the 8 ordinary ones by the reference and by the student gradient pass
(backward included); responses are 32 tokens. Each run starts from an empty cache. Two models:
(a) the tiny model, (b) a scaled random Qwen2.5-VL whose vision-tower / LM compute per token is close to
Qwen2.5-VL-3B's (about 1 : 4 per patch against per LM token; 4 patches merge into each LM token).

Printed per model: encoder calls (images through the vision tower), the seconds the uncached run spent in
the vision tower, total seconds with and without the cache, and the speedup. Targets: encoder calls with
the cache = unique frames; time saved >= 80% of the vision-tower time the uncached run spent on repeated
encodings. Times are the fastest of `--repeats` runs, cached and uncached runs alternating.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from seed_vl.policy import Policy
from seed_vl.toy.tiny_model import build_tiny_model

TURNS, HISTORY, RESPONSE_TOKENS, MICRO_BATCH = 8, 2, 32, 8
# Qwen2.5-VL-3B: ViT 32 x (1280 wide, MLP 3420) ~ 0.63B per patch; LM 36 x (2048 wide, MLP 11008, 2 KV heads)
# ~ 2.8B per token: ratio 0.23. Scaled: ViT 8 x (160, 428) ~ 2.5M; LM 8 x (256, 1376, 1 KV head) ~ 9.8M: 0.25.
SCALED_TEXT = dict(
    hidden_size=256, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=1
)
SCALED_VISION = dict(
    hidden_size=160, intermediate_size=428, depth=8, num_heads=5, fullatt_block_indexes=[3, 7]
)
TASK = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
    "When you are right next to a box, you can push it by moving in the same direction. You cannot push a "
    "box through a wall, and you cannot pull a box. Your available actions are up, down, left, right."
)
SKILL = (
    "**Episode-Level Skill**\nRefer to this episode-level skill when deciding what action to take in the "
    "current episode:\n[Line up behind the box before pushing it toward the target; avoid corners.]"
)


class EncoderTimer:
    """Seconds spent inside the vision tower, from forward hooks (synchronised on CUDA)."""

    def __init__(self, tower: torch.nn.Module, device: torch.device) -> None:
        self.device, self.seconds, self._start = device, 0.0, 0.0
        tower.register_forward_pre_hook(self._enter)
        tower.register_forward_hook(self._exit)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _enter(self, *_) -> None:
        self._sync()
        self._start = time.perf_counter()

    def _exit(self, *_) -> None:
        self._sync()
        self.seconds += time.perf_counter() - self._start


def make_step_inputs(frame_size: int) -> tuple[list, list, list[list[int]], int]:
    """Ordinary and skill-augmented contexts of one episode, their responses, and the unique frame count."""
    rng = np.random.default_rng(0)
    frames = [
        Image.fromarray(rng.integers(0, 256, (frame_size, frame_size, 3), dtype=np.uint8))
        for _ in range(TURNS + HISTORY)
    ]

    def context(turn: int, skill: bool) -> list[dict]:
        content = [{"type": "text", "text": TASK + ("\n" + SKILL if skill else "")}]
        for k, frame in enumerate(frames[turn : turn + HISTORY + 1]):
            label = "Current observation:" if k == HISTORY else f"Observation {turn + k}, action: left."
            content += [{"type": "text", "text": f"\n{label}\n"}, {"type": "image", "image": frame}]
        content.append({"type": "text", "text": "\nAnswer as <think>...</think><action>...</action>."})
        return [{"role": "user", "content": content}]

    ordinary = [context(t, skill=False) for t in range(TURNS)]
    augmented = [context(t, skill=True) for t in range(TURNS)]
    responses = rng.integers(10, 2000, (TURNS, RESPONSE_TOKENS)).tolist()
    return ordinary, augmented, responses, len(frames)


def score_step(policy: Policy, reference: Policy, ordinary, augmented, responses) -> None:
    policy.score(ordinary + augmented, responses + responses, micro_batch_size=MICRO_BATCH)  # old + teacher
    reference.score(ordinary, responses, micro_batch_size=MICRO_BATCH, return_entropy=False)
    for _, logprobs, entropies in policy.score_batches(ordinary, responses, MICRO_BATCH, with_grad=True):
        loss = sum(-lp.mean() - 1e-3 * e.mean() for lp, e in zip(logprobs, entropies, strict=True))
        loss.backward()
    policy.model.zero_grad(set_to_none=True)


def timed_step(policy: Policy, reference: Policy, timer: EncoderTimer, inputs) -> dict[str, float]:
    policy.on_weights_updated()
    timer.seconds = 0.0
    start = time.perf_counter()
    score_step(policy, reference, *inputs)
    return {"total_s": time.perf_counter() - start, "vision_s": timer.seconds, **policy.cache.stats()}


def bench_model(path: Path, frame_size: int, repeats: int) -> dict[str, float | bool]:
    cached = Policy.from_pretrained(path)
    model, processor = cached.model, cached.processor
    cached_ref = Policy(model, processor, vision_cache=cached.cache)  # frozen tower: one cache for both
    plain = Policy(model, processor, vision_cache_max_entries=0)
    timer = EncoderTimer(model.get_encoder(modality="image"), model.device)
    ordinary, augmented, responses, unique = make_step_inputs(frame_size)
    inputs = (ordinary, augmented, responses)
    timed_step(plain, plain, timer, inputs)  # warm-up
    runs = {"cached": [], "uncached": []}
    for _ in range(repeats):
        runs["uncached"].append(timed_step(plain, plain, timer, inputs))
        runs["cached"].append(timed_step(cached, cached_ref, timer, inputs))
    best = {name: min(r, key=lambda run: run["total_s"]) for name, r in runs.items()}
    uncached_calls = best["uncached"]["encoder_calls"]
    vision_uncached = best["uncached"]["vision_s"]
    repeated_vision = vision_uncached * (uncached_calls - unique) / uncached_calls
    saved = best["uncached"]["total_s"] - best["cached"]["total_s"]
    return {
        "unique_frames": unique,
        "encoder_calls_cached": best["cached"]["encoder_calls"],
        "encoder_calls_uncached": uncached_calls,
        "vision_s_uncached": vision_uncached,
        "vision_s_repeated_encodings": repeated_vision,
        "total_s_cached": best["cached"]["total_s"],
        "total_s_uncached": best["uncached"]["total_s"],
        "speedup": best["uncached"]["total_s"] / best["cached"]["total_s"],
        "saved_over_repeated_vision": saved / repeated_vision,
        "target_encoder_calls": best["cached"]["encoder_calls"] == unique,
        "target_time_saved": saved >= 0.8 * repeated_vision,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--models", nargs="+", choices=["tiny", "scaled"], default=["tiny", "scaled"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--frame-size", type=int, default=96, help="square frame side (Sokoban 6x6: 96)")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    dims = {"tiny": {}, "scaled": {"text_dims": SCALED_TEXT, "vision_dims": SCALED_VISION}}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = build_tiny_model(Path(tmp) / name, seed=0, **dims[name])
            results[name] = bench_model(path, args.frame_size, args.repeats)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, r in results.items():
        print(
            f"{name:>6}: encoder calls {r['encoder_calls_cached']} cached / {r['encoder_calls_uncached']} uncached "
            f"({r['unique_frames']} unique frames) | uncached vision tower {r['vision_s_uncached']:.3f}s "
            f"({r['vision_s_repeated_encodings']:.3f}s on repeats) | total {r['total_s_cached']:.3f}s cached, "
            f"{r['total_s_uncached']:.3f}s uncached, speedup {r['speedup']:.2f}x | saved "
            f"{100 * r['saved_over_repeated_vision']:.0f}% of the repeated-encoding time | targets "
            f"{'met' if r['target_encoder_calls'] and r['target_time_saved'] else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
