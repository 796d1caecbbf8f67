"""Text EZPoints: the two cards and the formula typed so far, as text."""

from __future__ import annotations

from seed_vl.envs.base import Observation
from seed_vl.envs.ezpoints import EZPointsEnv, show_formula


class EZPointsTextEnv(EZPointsEnv):
    name = "ezpoints_text"

    def _observe(self) -> Observation:
        cards = ", ".join(card.describe() for card in self.cards)
        formula = show_formula(self.formula) or "(empty)"
        return Observation(text=f"Cards: {cards}.\nFormula: {formula}", images=[])
