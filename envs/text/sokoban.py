"""Text Sokoban: the room as a symbol grid (XSB notation, '_' for floor) with its legend."""

from __future__ import annotations

from seed_vl.envs.base import Observation
from seed_vl.envs.sokoban import TEXT_LEGEND, SokobanEnv


class SokobanTextEnv(SokobanEnv):
    name = "sokoban_text"

    def _observe(self) -> Observation:
        return Observation(text=f"Current room:\n{self.state.to_text()}\nLegend: {TEXT_LEGEND}.", images=[])
