"""Image preprocessing for Qwen-VL models: RGB, resized with Qwen's rule (both sides multiples of 28,
area within [min_pixels, max_pixels], aspect ratio kept) by qwen-vl-utils' `smart_resize`.

Resizing here, once per frame, keeps the pixels the vision cache hashes identical to the pixels the model
sees, and turns a bad image into a one-line `ImageError` instead of a crash deep inside the processor.
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image
from qwen_vl_utils import smart_resize

PATCH_FACTOR = 28  # Qwen2/2.5-VL: 14 px patches, 2x2 merged into one token
MAX_INPUT_PIXELS = 50_000_000
MAX_ASPECT_RATIO = 200  # qwen-vl-utils' own limit
BACKGROUND = (255, 255, 255)  # transparent pixels become white, as in qwen-vl-utils


class ImageError(ValueError):
    """An image the model cannot take; the message is one line saying why."""


@dataclass(frozen=True)
class ImageSettings:
    """The model's pixel budget per image (`model.min_pixels` / `model.max_pixels`)."""

    min_pixels: int
    max_pixels: int

    def __post_init__(self) -> None:
        _check_budget(self.min_pixels, self.max_pixels)


def prepare_image(image: Image.Image, min_pixels: int, max_pixels: int) -> Image.Image:
    """An RGB image whose sides are multiples of 28 and whose area lies within the pixel budget (the input
    itself when it already is one)."""
    _check_budget(min_pixels, max_pixels)
    if not isinstance(image, Image.Image):
        raise ImageError(f"expected a PIL.Image, got {type(image).__name__}")
    width, height = image.size
    if width == 0 or height == 0:
        raise ImageError(f"image has zero size ({width}x{height})")
    if width * height > MAX_INPUT_PIXELS:
        raise ImageError(f"image is too large ({width}x{height} > {MAX_INPUT_PIXELS:,} pixels)")
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise ImageError(f"image aspect ratio exceeds {MAX_ASPECT_RATIO}:1 ({width}x{height})")
    new_height, new_width = smart_resize(height, width, PATCH_FACTOR, min_pixels, max_pixels)
    if new_height == 0 or new_width == 0:
        raise ImageError(f"image {width}x{height} is too elongated to fit max_pixels={max_pixels}")
    if new_height * new_width > max_pixels:  # grown past max_pixels to reach min_pixels on the 28-px grid
        raise ImageError(
            f"model.min_pixels..max_pixels ({min_pixels}..{max_pixels}) is too narrow for a {width}x{height} "
            f"image: its nearest size on the {PATCH_FACTOR}-pixel grid is {new_width}x{new_height}; widen it"
        )
    rgb = to_rgb(image)
    if rgb.size == (new_width, new_height):
        return rgb
    return rgb.resize((new_width, new_height), Image.Resampling.BICUBIC)


def _check_budget(min_pixels: int, max_pixels: int) -> None:
    if not PATCH_FACTOR**2 <= min_pixels <= max_pixels:
        raise ImageError(
            f"image pixel budget: need {PATCH_FACTOR**2} <= min_pixels <= max_pixels, "
            f"got min_pixels={min_pixels}, max_pixels={max_pixels}"
        )


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB for any mode: transparency (RGBA, LA, palette with a transparent colour) over white."""
    if image.mode == "RGB":
        return image
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if not has_alpha:
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    canvas = Image.new("RGB", rgba.size, BACKGROUND)
    canvas.paste(rgba, mask=rgba.getchannel("A"))
    return canvas
