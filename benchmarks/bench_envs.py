"""Environment throughput, and Sokoban frame rendering with cached sprites against gym-sokoban's renderer.

    python benchmarks/bench_envs.py [--json] [--envs sokoban_visual ezpoints_text ...]

For each environment: resets/s on fresh seeds (for Sokoban this includes generating the room, with its
cache cleared) and steps/s with random actions, invalid ones included. Rendering compares, on the same
rooms in the same run, `render_frame` (sprites read once, tiled with NumPy) with gym-sokoban's
`room_to_rgb` (re-reads seven PNGs per frame); target: ratio >= 10.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import warnings

import numpy as np

from seed_vl.config import EnvConfig
from seed_vl.envs.registry import make_env
from seed_vl.envs.sokoban import generate_room, task_room
from seed_vl.envs.visual.sokoban import render_frame

DEFAULT_ENVS = ["sokoban_visual", "sokoban_text", "ezpoints_visual", "ezpoints_text"]


def rate(fn, count: int) -> float:
    """Calls per second of `fn(i)` over `count` calls."""
    start = time.perf_counter()
    for i in range(count):
        fn(i)
    return count / (time.perf_counter() - start)


def bench_env(name: str, resets: int, steps: int) -> dict[str, float]:
    env = make_env(EnvConfig(name=name))
    generate_room.cache_clear()
    task_room.cache_clear()
    resets_per_s = rate(lambda i: env.reset(10_000 + i), resets)

    rng = random.Random(0)
    _, info = env.reset(0)
    actions = [*info["admissible_actions"], None]
    episode = [0]

    def one_step(_: int) -> None:
        _, _, terminated, truncated, _ = env.step(rng.choice(actions))
        if terminated or truncated:
            episode[0] += 1
            env.reset(episode[0] % 64)  # a small seed pool: steps/s, not generation, is measured here

    for seed in range(64):  # warm the room cache for the pool
        env.reset(seed)
    env.reset(0)
    return {"resets_per_s": resets_per_s, "steps_per_s": rate(one_step, steps)}


def bench_render(rooms: int, frames: int) -> dict[str, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from gym_sokoban.envs.render_utils import room_to_rgb

    states = [generate_room(seed) for seed in range(rooms)]
    codes = [s.tile_codes() for s in states]
    for s, c in zip(states, codes, strict=True):  # same pixels, or the comparison means nothing
        assert np.array_equal(np.asarray(render_frame(s)), room_to_rgb(c))
    cached = rate(lambda i: render_frame(states[i % rooms]), frames)
    gym = rate(lambda i: room_to_rgb(codes[i % rooms]), frames)
    return {"cached_frames_per_s": cached, "gym_sokoban_frames_per_s": gym, "speedup": cached / gym}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--envs", nargs="+", default=DEFAULT_ENVS, help="environment names to measure")
    parser.add_argument("--resets", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--frames", type=int, default=1000)
    args = parser.parse_args()

    results = {"envs": {name: bench_env(name, args.resets, args.steps) for name in args.envs}}
    results["sokoban_render"] = bench_render(rooms=32, frames=args.frames)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, r in results["envs"].items():
        print(f"{name:16s} resets/s {r['resets_per_s']:10.1f}   steps/s {r['steps_per_s']:10.1f}")
    r = results["sokoban_render"]
    verdict = "ok" if r["speedup"] >= 10 else "below target"
    print(
        f"sokoban frames/s: cached sprites {r['cached_frames_per_s']:.0f}, gym-sokoban "
        f"{r['gym_sokoban_frames_per_s']:.0f}, speedup {r['speedup']:.1f}x (target >= 10x: {verdict})"
    )


if __name__ == "__main__":
    main()
