"""`make_env(env_config)`: the one place that maps `EnvConfig.name` to an environment."""

from __future__ import annotations

from collections.abc import Callable

from seed_vl.config import EnvConfig
from seed_vl.envs.base import Env
from seed_vl.envs.text.ezpoints import EZPointsTextEnv
from seed_vl.envs.text.sokoban import SokobanTextEnv
from seed_vl.envs.visual.ezpoints import EZPointsVisualEnv
from seed_vl.envs.visual.sokoban import SokobanVisualEnv


def _textworld(cfg: EnvConfig) -> Env:
    # Imported on demand: TextWorld is an optional extra (`pip install seed-vl[textworld]`).
    from seed_vl.envs.text.textworld import make_textworld_env

    return make_textworld_env(cfg)


ENV_FACTORIES: dict[str, Callable[[EnvConfig], Env]] = {
    "sokoban_visual": lambda cfg: SokobanVisualEnv(
        cfg.dim_room, cfg.num_boxes, cfg.max_steps, cfg.cell_px, end_on_deadlock=cfg.end_on_deadlock,
        min_solution_moves=cfg.min_solution_moves,
    ),
    "sokoban_text": lambda cfg: SokobanTextEnv(
        cfg.dim_room, cfg.num_boxes, cfg.max_steps, end_on_deadlock=cfg.end_on_deadlock,
        min_solution_moves=cfg.min_solution_moves,
    ),
    "ezpoints_visual": lambda cfg: EZPointsVisualEnv(cfg.max_steps, cfg.image_size, cfg.ezpoints_deal),
    "ezpoints_text": lambda cfg: EZPointsTextEnv(cfg.max_steps, cfg.ezpoints_deal),
    "textworld": _textworld,
}


def make_env(env_config: EnvConfig) -> Env:
    """A fresh environment for `env_config` (call `reset(seed)` before stepping it)."""
    return ENV_FACTORIES[env_config.name](env_config)
