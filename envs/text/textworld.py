"""TextWorld (optional extra `seed-vl[textworld]`): text adventures generated offline by TextWorld's own
generator and played by its engine.

Games. `env.textworld_level` (1-30) is the difficulty scale of TextWorld's `tw-treasure_hunter` challenge
(the one built-in challenge with a 1-30 level; `tw-simple` only varies reward density and objective
wording): levels 1-10 have 5 rooms and 1-5 step quests, 11-20 have 10 rooms with closed doors and
containers and 2-10 steps, 21-30 have 20 rooms with locked ones and 3-20 steps. Find and take the named
object; taking the decoy object loses. Game i of the pool is
generated from seed i and cached under `<cache_dir>/level-<level>/game-<i>/`, each game written to a
temporary directory and renamed into place, so concurrent runs share one pool and a pool grows by the
missing games only. Generation takes about a second per game at low levels and up to minutes at level 30.

Episode. `reset(seed)` picks a pool game with a generator seeded by `seed`; the prompt lists the engine's
admissible commands. A command outside that list (or None) is an invalid action: -0.1, no engine step. A
valid command earns the engine's score delta, plus 10 when it wins; the engine decides won and lost.
The default step budget is twice the game's walkthrough, at least 8 steps.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seed_vl.config import ConfigError, EnvConfig
from seed_vl.envs.base import (
    Env,
    EpisodeOver,
    Hindsight,
    Observation,
    StepResult,
    phrase,
    run_length,
    step_list,
)

try:
    import textworld
    import textworld.challenges
    from textworld.generator import compile_game
except ImportError:  # the optional extra is missing: `make_textworld_env` says how to install it
    textworld = None

CHALLENGE = "tw-treasure_hunter"
DEFAULT_CACHE_DIR = Path(".cache/textworld")
INVALID_ACTION_REWARD = -0.1
WIN_BONUS = 10.0
MIN_MAX_STEPS = 8

# Jericho does not know TextWorld's generated games and says so on every load; TextWorld tracks them itself.
warnings.filterwarnings("ignore", message=r"Game '.*' is not fully supported", module=r"jericho\.")


class MissingExtraError(ConfigError, ImportError):
    """An optional dependency is not installed (a one-line setup error, like a bad config)."""


def make_textworld_env(
    env_config: EnvConfig, cache_dir: str | os.PathLike = DEFAULT_CACHE_DIR
) -> TextWorldEnv:
    """The environment for `env_config`, generating the level's game pool on first use."""
    games = game_pool(env_config.textworld_level, env_config.textworld_pool_size, cache_dir)
    return TextWorldEnv(games, env_config.max_steps)


def game_pool(level: int, size: int, cache_dir: str | os.PathLike = DEFAULT_CACHE_DIR) -> list[Path]:
    """The game files of seeds 0..size-1 at `level`; missing ones are generated and cached."""
    if textworld is None:
        raise MissingExtraError("TextWorld needs the optional extra: pip install 'seed-vl[textworld]'")
    if not 1 <= level <= 30:
        raise ConfigError(f"env.textworld_level: must be within 1-30 (got {level})")
    directory = Path(cache_dir) / f"level-{level}"
    return [_cached_game(directory / f"game-{seed}", level, seed) for seed in range(size)]


def _cached_game(game_dir: Path, level: int, seed: int) -> Path:
    game_file = game_dir / "game.z8"
    if game_file.is_file():
        return game_file
    game_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{game_dir.name}.", dir=game_dir.parent))
    try:
        options = textworld.GameOptions()
        options.seeds = seed
        options.path = str(tmp / game_file.name)
        _, make_game, _ = textworld.challenges.CHALLENGES[CHALLENGE]
        compile_game(make_game({"level": level}, options), options)
        (tmp / "game.ni").unlink(missing_ok=True)  # Inform 7 source, only needed to compile
        try:
            os.rename(tmp, game_dir)
        except OSError:  # another process published this game first; keep theirs
            if not game_file.is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return game_file


@dataclass(frozen=True)
class TextWorldStep:
    """One replayed step, for the scripted analyzer."""

    action: str | None
    valid: bool
    plan: tuple[str, ...]  # the engine's winning commands after the step (its walkthrough from there)


class TextWorldEnv(Env):
    name = "textworld"

    def __init__(self, game_files: Sequence[str | os.PathLike], max_steps: int | None = None) -> None:
        if not game_files:
            raise ConfigError("env.textworld_pool_size: the game pool is empty")
        self.game_files = [Path(f) for f in game_files]
        self._fixed_max_steps = max_steps  # None: a budget per game, set at reset
        self.max_steps = max_steps or MIN_MAX_STEPS
        self._infos = textworld.EnvInfos(
            admissible_commands=True, won=True, lost=True, description=True, inventory=True, objective=True,
            score=True, max_score=True, policy_commands=True, extras=["walkthrough"],
        )
        self._engine = None
        self._game_file: Path | None = None
        self._state: Any = None
        self._steps = 0
        self._done = True

    @property
    def walkthrough(self) -> list[str]:
        """The current game's solution, from its generator (scripted analyzer, tests, demonstrations)."""
        return list(self._state["extra.walkthrough"])

    def reset(self, seed: int) -> tuple[Observation, dict[str, Any]]:
        game_file = self.game_files[random.Random(seed).randrange(len(self.game_files))]
        if game_file != self._game_file:
            self.close()
            self._engine = textworld.start(str(game_file), request_infos=self._infos)
            self._game_file = game_file
        self._state = self._engine.reset()
        self.max_steps = self._fixed_max_steps or max(MIN_MAX_STEPS, 2 * len(self.walkthrough))
        self._steps, self._done = 0, False
        return self._observe(feedback=None), self._info(action_valid=True)

    def step(self, action: str | None) -> StepResult:
        if self._done:
            raise EpisodeOver(f"{self.name}: step() on a finished episode; call reset(seed) first")
        self._steps += 1
        valid = action is not None and action in self._state["admissible_commands"]
        if valid:
            score_before = self._state["score"]
            self._state, _, _ = self._engine.step(action)
            reward = float(self._state["score"] - score_before) + (WIN_BONUS if self._state["won"] else 0.0)
            feedback = _clean(self._state["feedback"])
        else:
            reward = INVALID_ACTION_REWARD
            feedback = "That is not an admissible command; nothing happened."
        terminated = bool(self._state["won"] or self._state["lost"])
        truncated = not terminated and self._steps >= self.max_steps
        self._done = terminated or truncated
        return self._observe(feedback), reward, terminated, truncated, self._info(action_valid=valid)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine, self._game_file = None, None

    def _observe(self, feedback: str | None) -> Observation:
        """Feedback on the last command (unless it merely repeats the room), the room and the inventory."""
        room, inventory = _clean(self._state["description"]), _clean(self._state["inventory"])
        lines = [f"Feedback: {feedback}"] if feedback and feedback != room else []
        return Observation(text="\n".join([*lines, room, inventory]), images=[])

    def _info(self, action_valid: bool) -> dict[str, Any]:
        state = self._state
        return {
            "won": bool(state["won"]),
            "lost": bool(state["lost"]),
            "action_valid": action_valid,
            "task": " ".join(state["objective"].split()),
            "admissible_actions": list(state["admissible_commands"]),
            "step": self._steps,
            "score": state["score"],
            "max_score": state["max_score"],
            "game": self._game_file.parent.name,
        }

    def hindsight(self, seed: int, actions: Sequence[str | None], rng: random.Random) -> Hindsight:
        self.reset(seed)
        walkthrough, trace = self.walkthrough, []
        for action in actions:
            _, _, terminated, truncated, info = self.step(action)
            trace.append(TextWorldStep(action, info["action_valid"], tuple(self._state["policy_commands"])))
            if terminated or truncated:
                break
        won, lost = bool(self._state["won"]), bool(self._state["lost"])
        return textworld_hindsight(walkthrough, trace, won, lost, rng)


def _clean(text: str) -> str:
    """Engine text without the command prompt and status line that follow it, and without blank lines."""
    text = text.split("\n>", 1)[0]
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


# -------------------------------------------------------------------------------------- scripted analyzer
_WON = (
    "Carry out the objective's steps in the order given, each as an admissible command: {route} won this "
    "game.",
    "Winning workflow: read the objective, then type its steps one by one ({route}), exactly as listed.",
    "Do what the objective says in the order it says it; here {route} reached the goal in {n} steps.",
)
_LOST = (
    "Never type '{fatal}' here: it ended the game as a loss. The objective's next step was '{next}'.",
    "'{fatal}' lost the game at step {k}. Check each command against the objective first; the right one "
    "was '{next}'.",
    "Warning sign: a command the objective never asks for. '{fatal}' at step {k} lost; '{next}' was needed.",
)
_STALLED = (
    "The missing sub-goal was '{next}': only {done} of {total} objective steps got done. Take the "
    "objective's next step as soon as it is admissible.",
    "Do not wander: '{next}' was never done, so the game stalled after {done} of {total} steps. Re-read "
    "the objective and do its next step.",
    "Warning sign: turns pass without progress. The objective still needed '{next}' (remaining: {rest}).",
)
_INVALID = (
    "Not admissible at {steps}: copy commands from the list exactly instead of inventing them. The missing "
    "sub-goal was '{next}'.",
    "Type only commands from the admissible list (rejected at {steps}). The game still needed '{next}'.",
)


def textworld_hindsight(
    walkthrough: Sequence[str], trace: Sequence[TextWorldStep], won: bool, lost: bool, rng: random.Random
) -> Hindsight:
    """A workflow skill for a win; the fatal command for a loss; otherwise the missing sub-goal: the first
    step of the engine's remaining plan, with the rejected commands when there were any."""
    n, total = len(trace), len(walkthrough)
    plans = [tuple(walkthrough), *(t.plan for t in trace)]  # before the first step, then after each
    route = run_length([t.action for t in trace if t.valid])
    invalid = [k for k, t in enumerate(trace, 1) if not t.valid]
    if won:
        summary = f"Won in {n} steps (the walkthrough takes {total}): {route}."
        return Hindsight(episode_summary=summary, episode_skill=phrase(rng, _WON, route=route, n=n))
    if lost:  # by the last command
        fatal = trace[-1].action
        summary = f"Lost at step {n} by '{fatal}' (invalid commands: {len(invalid)})."
        skill = phrase(rng, _LOST, fatal=fatal, next=plans[-2][0], k=n)
        return Hindsight(episode_summary=summary, episode_skill=skill)
    plan = plans[-1]
    done = max(0, total - len(plan))
    fields = {"next": plan[0], "done": done, "total": total, "rest": run_length(list(plan))}
    summary = f"Not won in {n} steps (invalid commands: {len(invalid)}); {done} of {total} objective steps done."
    if invalid:
        skill = phrase(rng, _INVALID, steps=step_list(invalid), **fields)
    else:
        skill = phrase(rng, _STALLED, **fields)
    return Hindsight(episode_summary=summary, episode_skill=skill)
