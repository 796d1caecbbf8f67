"""Prompt-encoding cache: each context goes through the chat template, tokenizer and image processor once.

One update step encodes every context several times (generation, then the old-policy, reference and student
passes), and the processor's templating, tokenizing and image preprocessing run on the CPU whatever the
accelerator: for a small model they cost as much as the forward itself. A context's encoding (token ids,
modality types, its images' content keys and patch grids) is keyed by its content, so a repeat is a
dictionary lookup. Pixels are not kept: an image needs them only when the vision cache misses it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class EncodedPrompt:
    input_ids: list[int]
    mm_token_type_ids: list[int] | None  # modality of each token (multimodal processors only)
    image_keys: tuple[str, ...]  # `vision_cache.image_key` of each image, in order
    image_grid_thw: torch.Tensor | None  # [images, 3] patch grid of each image


class PromptCache:
    """LRU map from a context's content (its texts and image keys) to its `EncodedPrompt`."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, EncodedPrompt] = OrderedDict()

    def encode(
        self, texts: list[str], image_keys: list[str], process: Callable[[], dict[str, Any]]
    ) -> tuple[EncodedPrompt, dict[str, torch.Tensor]]:
        """The encoding of a context and the pixel patches computed for it now, by image key (empty when
        the encoding was cached). `process()` is the processor's output for this context alone:
        `input_ids` [1, L], optional `mm_token_type_ids`, `pixel_values` and `image_grid_thw`."""
        key = _digest(*texts, *image_keys)
        prompt, pixels = self._entries.get(key), {}
        if prompt is None:
            output = process()
            grids = output.get("image_grid_thw")
            types = output.get("mm_token_type_ids")
            prompt = EncodedPrompt(
                input_ids=output["input_ids"][0].tolist(),
                mm_token_type_ids=types[0].tolist() if types is not None else None,
                image_keys=tuple(image_keys),
                image_grid_thw=grids,
            )
            if image_keys:
                patches = output["pixel_values"].split(grids.prod(-1).tolist())
                pixels = dict(zip(image_keys, patches, strict=True))
        self._entries[key] = prompt
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return prompt, pixels

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


def _digest(*parts: str) -> str:
    h = hashlib.sha1()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()
