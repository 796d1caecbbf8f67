"""Visual Sokoban: the frame is tiled from gym-sokoban's sprites, read from disk once per process (its own
renderer re-reads every PNG on every frame) and tiled with one NumPy gather."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
from PIL import Image

from seed_vl.envs.base import Observation
from seed_vl.envs.sokoban import SEARCH_DEPTH, SokobanEnv, SokobanState

# In gym-sokoban's room-code order (see `SokobanState.tile_codes`).
SPRITE_NAMES = ("wall", "floor", "box_target", "box_on_target", "box", "player", "player_on_target")
SPRITE_PX = 16

LEGEND = (
    "The image shows the room from above: brick tiles are walls, black tiles are floor, a red outlined "
    "square is a target, the yellow crate is a box (red-framed once it is on a target) and the green "
    "alien is you."
)


@functools.cache
def _sprites_16px() -> np.ndarray:
    """(7, 16, 16, 3) uint8, read from the installed gym_sokoban package without importing it (its import
    pulls in gym)."""
    spec = importlib.util.find_spec("gym_sokoban")
    surface = Path(spec.submodule_search_locations[0]) / "envs" / "surface"
    return np.stack([np.asarray(Image.open(surface / f"{name}.png").convert("RGB")) for name in SPRITE_NAMES])


@functools.lru_cache(maxsize=8)
def sprite_sheet(cell_px: int) -> np.ndarray:
    """The sprites at `cell_px` per cell (nearest-neighbour: the pixel art keeps its exact colours)."""
    sprites = _sprites_16px()
    if cell_px == SPRITE_PX:
        return sprites
    resized = [Image.fromarray(s).resize((cell_px, cell_px), Image.NEAREST) for s in sprites]
    return np.stack([np.asarray(s) for s in resized])


def render_frame(state: SokobanState, cell_px: int = SPRITE_PX) -> Image.Image:
    codes = state.tile_codes()
    height, width = codes.shape
    tiles = sprite_sheet(cell_px)[codes]  # (H, W, px, px, 3)
    return Image.fromarray(tiles.transpose(0, 2, 1, 3, 4).reshape(height * cell_px, width * cell_px, 3))


class SokobanVisualEnv(SokobanEnv):
    name = "sokoban_visual"

    def __init__(
        self, dim_room: tuple[int, int] = (6, 6), num_boxes: int = 1, max_steps: int | None = None,
        cell_px: int = SPRITE_PX, search_depth: int = SEARCH_DEPTH, end_on_deadlock: bool = False,
        min_solution_moves: int = 0,
    ) -> None:
        super().__init__(dim_room, num_boxes, max_steps, search_depth, end_on_deadlock, min_solution_moves)
        self.cell_px = cell_px

    def _observe(self) -> Observation:
        return Observation(text=LEGEND, images=[render_frame(self.state, self.cell_px)])
