"""Visual EZPoints: a green table (#35654d) with the two cards drawn by PIL (rank and suit, legible at
300x300) and a "Formula: ..." line. Fonts are DejaVu Sans from matplotlib's data (a declared dependency),
so frames are identical on every machine."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from seed_vl.envs.base import Observation
from seed_vl.envs.ezpoints import Card, Deal, EZPointsEnv, Formula, show_formula

TABLE_GREEN = "#35654d"
SUIT_GLYPHS = {"hearts": "\u2665", "spades": "\u2660", "diamonds": "\u2666", "clubs": "\u2663"}
RED, BLACK = "#c8102e", "#111111"
DEFAULT_SIZE = 300
LEGEND = "The image shows your two cards on the table and, below them, the formula typed so far."


@functools.lru_cache(maxsize=32)
def _font(px: int) -> ImageFont.FreeTypeFont:
    spec = importlib.util.find_spec("matplotlib")  # located, not imported
    path = Path(spec.origin).parent / "mpl-data" / "fonts" / "ttf" / "DejaVuSans-Bold.ttf"
    return ImageFont.truetype(str(path), px)


@functools.lru_cache(maxsize=256)
def _card_image(card: Card, width: int) -> Image.Image:
    """A white card: rank and suit in the top-left corner, a large rank and suit in the middle."""
    height = round(width * 1.4)
    img = Image.new("RGB", (width, height), TABLE_GREEN)
    draw = ImageDraw.Draw(img)
    border = max(1, width // 60)
    draw.rounded_rectangle((0, 0, width - 1, height - 1), radius=width // 10, fill="white", outline=BLACK,
                           width=border)
    color = RED if card.suit in ("hearts", "diamonds") else BLACK
    glyph = SUIT_GLYPHS[card.suit]
    corner = _font(max(8, width // 6))
    pad = width // 14
    draw.text((pad, pad), card.label, fill=color, font=corner)
    draw.text((pad, pad + corner.size), glyph, fill=color, font=corner)
    center_font = _font(max(10, width * 2 // 5))
    draw.text((width / 2, height * 0.45), card.label, fill=color, font=center_font, anchor="mm")
    draw.text((width / 2, height * 0.75), glyph, fill=color, font=_font(max(10, width // 3)), anchor="mm")
    return img


@functools.lru_cache(maxsize=256)
def _table(cards: tuple[Card, Card], size: int) -> Image.Image:
    table = Image.new("RGB", (size, size), TABLE_GREEN)
    width = round(size * 0.4)
    gap = round(size * 0.06)
    left = (size - 2 * width - gap) // 2
    for i, card in enumerate(cards):
        table.paste(_card_image(card, width), (left + i * (width + gap), round(size * 0.05)))
    return table


def render_table(cards: tuple[Card, Card], formula: Formula, size: int = DEFAULT_SIZE) -> Image.Image:
    frame = _table(cards, size).copy()
    text = "Formula: " + show_formula(formula)
    ImageDraw.Draw(frame).text((size * 0.05, size * 0.84), text, fill="white", font=_font(max(8, size // 14)))
    return frame


class EZPointsVisualEnv(EZPointsEnv):
    name = "ezpoints_visual"

    def __init__(self, max_steps: int | None = None, image_size: int = DEFAULT_SIZE, deal: Deal = "gym_cards") -> None:
        super().__init__(max_steps, deal)
        self.image_size = image_size

    def _observe(self) -> Observation:
        return Observation(text=LEGEND, images=[render_table(self.cards, self.formula, self.image_size)])
