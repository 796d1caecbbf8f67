"""Small builders shared by the policy and image-cache tests."""

from __future__ import annotations

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
