"""Image preprocessing: Qwen's resize rule, mode conversion, clear errors for images a model cannot take."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from qwen_vl_utils import smart_resize

from seed_vl.config import ModelConfig
from seed_vl.processors.images import ImageError, ImageSettings, prepare_image

DEFAULTS = ModelConfig()
MIN, MAX = DEFAULTS.min_pixels, DEFAULTS.max_pixels


@pytest.mark.parametrize(
    ("size", "min_pixels", "max_pixels", "expected"),
    [
        ((96, 96), MIN, MAX, (84, 84)),  # the 6x6 Sokoban frame: 96 rounds to 3 patches of 28
        ((300, 300), MIN, MAX, (308, 308)),  # the EZPoints table
        ((300, 300), MIN, 60 * 28 * 28, (196, 196)),  # over budget: scaled down, sides floored to 28
        ((10, 10), 16 * 28 * 28, MAX, (112, 112)),  # under budget: scaled up, sides ceiled to 28
        ((28, 28), MIN, MAX, (28, 28)),
    ],
)
def test_qwen_resize_rule(size, min_pixels, max_pixels, expected):
    out = prepare_image(Image.new("RGB", size, (10, 20, 30)), min_pixels, max_pixels)
    assert out.size == expected
    assert out.mode == "RGB"
    assert out.getpixel((0, 0)) == (10, 20, 30)


@settings(max_examples=150, deadline=None)
@given(
    width=st.integers(1, 2000),
    height=st.integers(1, 2000),
    min_tokens=st.integers(1, 64),
    extra_tokens=st.integers(0, 2000),
)
def test_any_size_fits_the_budget_or_fails_clearly(width, height, min_tokens, extra_tokens):
    min_pixels, max_pixels = min_tokens * 28 * 28, (min_tokens + extra_tokens) * 28 * 28
    ratio = max(width, height) / min(width, height)
    try:
        out = prepare_image(Image.new("L", (width, height)), min_pixels, max_pixels)
    except ImageError as err:
        # Only a shape too elongated for the budget (its short side would round to 0), or a budget too
        # narrow for the shape (Qwen's rounding grows it past max_pixels to reach min_pixels), cannot fit.
        if ratio <= 200 and ratio <= max_pixels / (28 * 28):
            grid_height, grid_width = smart_resize(height, width, 28, min_pixels, max_pixels)
            assert grid_height * grid_width > max_pixels
        assert "\n" not in str(err)
        return
    new_w, new_h = out.size
    assert new_w % 28 == 0 and new_h % 28 == 0 and new_w > 0 and new_h > 0
    assert (new_w >= new_h) == (width >= height) or new_w == new_h  # orientation is kept
    if width * height >= max_pixels:
        assert new_w * new_h <= max_pixels


def test_modes_are_converted_to_rgb():
    rgba = Image.new("RGBA", (56, 56), (255, 0, 0, 0))  # fully transparent red -> white
    rgba.putpixel((0, 0), (255, 0, 0, 255))
    out = prepare_image(rgba, MIN, MAX)
    assert out.mode == "RGB"
    assert out.getpixel((40, 40)) == (255, 255, 255)

    gray = prepare_image(Image.new("L", (56, 56), 128), MIN, MAX)
    assert gray.mode == "RGB" and gray.getpixel((5, 5)) == (128, 128, 128)

    palette = Image.new("P", (56, 56), 1)
    palette.putpalette([0, 0, 0, 0, 200, 0] + [0] * 762)
    assert prepare_image(palette, MIN, MAX).getpixel((5, 5)) == (0, 200, 0)

    transparent_palette = palette.copy()
    transparent_palette.info["transparency"] = 1
    assert prepare_image(transparent_palette, MIN, MAX).getpixel((5, 5)) == (255, 255, 255)

    assert prepare_image(Image.new("LA", (56, 56), (0, 0)), MIN, MAX).getpixel((5, 5)) == (255, 255, 255)


def test_input_is_not_modified():
    frame = Image.new("RGBA", (96, 96), (1, 2, 3, 255))
    prepare_image(frame, MIN, MAX)
    assert frame.mode == "RGBA" and frame.size == (96, 96)


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (Image.new("RGB", (0, 10)), "zero size"),
        (Image.new("RGB", (10, 0)), "zero size"),
        (Image.new("1", (10_000, 6_000)), "too large"),
        (Image.new("RGB", (5000, 20)), "aspect ratio"),
        ("frame.png", "expected a PIL.Image"),
    ],
)
def test_bad_images_raise_one_line_errors(image, message):
    with pytest.raises(ImageError, match=message) as err:
        prepare_image(image, MIN, MAX)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


def test_bad_pixel_budget_is_rejected():
    with pytest.raises(ImageError, match="min_pixels <= max_pixels"):
        ImageSettings(min_pixels=10_000, max_pixels=1_000)
    with pytest.raises(ImageError, match="min_pixels"):
        prepare_image(Image.new("RGB", (28, 28)), 10, MAX)
