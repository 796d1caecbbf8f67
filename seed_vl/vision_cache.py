"""Image-embedding cache: each unique frame goes through the vision encoder once per update step.

One update step scores the same frames many times: the old-policy, skill-teacher, reference and student
passes all see the same observations, and history windows repeat each frame in several later contexts.
Vision-encoder outputs are keyed by a hash of the image content and the image-processor settings, so
every repeat is a dictionary lookup. Entries depend on the vision weights: clear the cache whenever they
may have changed (`Policy.on_weights_updated`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from PIL import Image
from transformers.utils import ModelOutput


def image_key(image: Image.Image, settings: str) -> str:
    """Content hash of one image (mode, size, pixels) under one set of image-processor settings."""
    digest = hashlib.sha1(settings.encode())
    digest.update(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class ImageEncoding:
    """The vision encoder's output for one image: its merged patch embeddings, plus the per-layer
    deepstack features that Qwen3-VL injects into the first decoder layers (empty otherwise)."""

    embeds: torch.Tensor
    deepstack: tuple[torch.Tensor, ...] = ()


@dataclass
class ImageFeatures(ModelOutput):
    """Precomputed image features in the layout Qwen-VL `forward`/`generate` accept as
    `mm_encoder_outputs["image"]`: one tensor per image, and per deepstack layer one tensor per image."""

    pooler_output: tuple[torch.Tensor, ...] | None = None
    deepstack_features: list[tuple[torch.Tensor, ...]] | None = None

    @classmethod
    def from_encodings(cls, encodings: Sequence[ImageEncoding]) -> ImageFeatures:
        layers = len(encodings[0].deepstack)
        return cls(
            pooler_output=tuple(e.embeds for e in encodings),
            deepstack_features=[tuple(e.deepstack[i] for e in encodings) for i in range(layers)]
            if layers
            else None,
        )


Encoder = Callable[[list[int]], list[ImageEncoding]]


class VisionCache:
    """LRU map from `image_key` to `ImageEncoding`, with counters since the last `clear()`.

    `images_seen` counts every image occurrence requested, `encoder_calls` the images that went through
    the encoder, `hits` the occurrences served from an existing encoding (always seen = calls + hits).
    """

    def __init__(self, max_entries: int = 4096) -> None:
        if max_entries < 0:
            raise ValueError(f"vision_cache_max_entries must be >= 0, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[str, ImageEncoding] = OrderedDict()
        self.images_seen = self.encoder_calls = self.hits = 0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, int]:
        return {"images_seen": self.images_seen, "encoder_calls": self.encoder_calls, "hits": self.hits}

    def clear(self) -> None:
        """Drop every entry and restart the counters (call when the vision weights may have changed)."""
        self._entries.clear()
        self.images_seen = self.encoder_calls = self.hits = 0

    def count_uncached(self, n_images: int) -> None:
        """Record `n_images` images that the model encodes itself (plain `pixel_values` forward)."""
        self.images_seen += n_images
        self.encoder_calls += n_images

    def fetch(self, keys: Sequence[str], encode: Encoder, store: bool = True) -> list[ImageEncoding]:
        """Encodings for `keys`, in order. `encode(positions)` runs the encoder on the images at those
        positions of `keys`, once per unique key not in the cache. With `store=False` (a gradient pass
        through a trainable tower) the cache is neither read nor written; repeats still share one encoding."""
        found = {key: self._entries[key] for key in keys if store and key in self._entries}
        missing: dict[str, int] = {}
        for position, key in enumerate(keys):
            if key not in found:
                missing.setdefault(key, position)
        if missing:
            found.update(zip(missing, encode(list(missing.values())), strict=True))
        self.images_seen += len(keys)
        self.encoder_calls += len(missing)
        self.hits += len(keys) - len(missing)
        if store:
            for key in keys:
                self._entries[key] = found[key]
                self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return [found[key] for key in keys]
