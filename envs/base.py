"""The environment protocol every seed-vl environment follows (gymnasium-style, text actions).

    obs, info = env.reset(seed)
    obs, reward, terminated, truncated, info = env.step(action)

`obs = {"text": str, "images": [PIL.Image, ...]}` (no images for text environments). `info` always holds
`won`, `action_valid`, `task` (the one-line task description) and `admissible_actions` (the action
vocabulary), plus environment extras.

`step` takes the *parsed* action (`seed_vl.processors.parsing.parse_action` turns model text into one), or
None when the model output did not parse. None, a string outside `admissible_actions`, or an action the
game's rules reject is an invalid action: `info["action_valid"] = False`, with the penalty each game
specifies. Model output never crashes an environment; stepping a finished episode (a caller's bug) raises
`EpisodeOver`.

Every random draw goes through a generator the environment seeds from `reset(seed)`; Python's global
`random` and NumPy's global state are never touched, so the same seed gives the same episode anywhere.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, TypedDict

from PIL import Image


class Observation(TypedDict):
    text: str
    images: list[Image.Image]


class Hindsight(TypedDict):
    """The analyzer's JSON answer (DESIGN §1): a short summary and one policy-facing skill."""

    episode_summary: str
    episode_skill: str


StepResult = tuple[Observation, float, bool, bool, dict[str, Any]]


class Env(ABC):
    """Base class: subclasses set `name` (the registry name) and implement `reset` and `step`."""

    name: str
    max_steps: int

    @abstractmethod
    def reset(self, seed: int) -> tuple[Observation, dict[str, Any]]: ...

    @abstractmethod
    def step(self, action: str | None) -> StepResult: ...

    def hindsight(self, seed: int, actions: Sequence[str | None], rng: random.Random) -> Hindsight:
        """Scripted hindsight analyzer: replay the episode (`seed`, `actions`) with the game's own rules
        and solver, and name what worked (success) or the concrete mistake (failure)."""
        raise NotImplementedError(f"environment '{self.name}' has no scripted hindsight analyzer")

    def hindsight_facts(self, seed: int, actions: Sequence[str | None]) -> list[str]:
        """What a correct skill for this episode states, quoted as the scripted analyzer quotes it (the
        winning order, a correct solution): a written skill agrees with the scripted one when it holds any."""
        raise NotImplementedError(f"environment '{self.name}' has no scripted hindsight analyzer")


class EpisodeOver(RuntimeError):
    """`step` was called on a finished episode (or before `reset`)."""


def phrase(rng: random.Random, templates: Sequence[str], **fields: Any) -> str:
    """One of several phrasings, picked by the caller's seeded rng, so that a model trained on scripted
    skills does not learn a single template."""
    return rng.choice(templates).format(**fields)


def run_length(moves: Sequence[str]) -> str:
    """'right, right, down' -> 'right x2, down': short enough to quote inside a skill."""
    runs: list[list[Any]] = []
    for move in moves:
        if runs and runs[-1][0] == move:
            runs[-1][1] += 1
        else:
            runs.append([move, 1])
    return ", ".join(m if n == 1 else f"{m} x{n}" for m, n in runs)


def step_route(moves: Sequence[str | None]) -> str:
    """'up, left, left' -> 'step 1 up, step 2 left, step 3 left': each move under the number its turn's
    observation heading shows ("Current observation (step 2)"), so a policy can follow a route step by step.
    A turn without a valid move (None) keeps its number and is left out: [up, None, left] -> 'step 1 up,
    step 3 left', so the later steps still match their headings."""
    return ", ".join(f"step {k} {move}" for k, move in enumerate(moves, 1) if move is not None)


def step_list(steps: Sequence[int]) -> str:
    """[3] -> 'step 3'; [2, 5, 6, 7] -> 'steps 2 and 5-7'."""
    runs: list[list[int]] = []
    for k in steps:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    parts = [str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs]
    if len(parts) == 1 and len(steps) == 1:
        return f"step {parts[0]}"
    return "steps " + (parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + f" and {parts[-1]}")


def count(n: int, noun: str, plural_suffix: str = "s") -> str:
    """count(1, 'push', 'es') -> '1 push'; count(3, 'push', 'es') -> '3 pushes'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{plural_suffix}"
