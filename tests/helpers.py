"""Small builders shared by the tests: frames, chat contexts, and run directories of hand-built trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image


def noise_frame(seed: int, size: int = 84) -> Image.Image:
    """A seeded random RGB frame: distinct seeds give distinct cache keys."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def user_context(text: str, *images: Image.Image, system: str | None = None) -> list[dict]:
    """A chat context: an optional system message, then the images and the text in one user message."""
    content = [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": text}]
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]


def write_trajectory_step(run_dir: Path, step: int, records: list[dict]) -> None:
    """Write records as the trainer lays out one update step: `trajectories/step_NNNNNN/trajectories.jsonl`."""
    step_dir = run_dir / "trajectories" / f"step_{step:06d}"
    step_dir.mkdir(parents=True)
    (step_dir / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
