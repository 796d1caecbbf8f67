"""Prompt text per environment: who the agent is, the marked task line, history lines, the action list and
the answer instruction. `messages.py` arranges these pieces (and the frames) into chat messages.

The task line is the first line starting with `TASK_PREFIX` in a context: the system prompt never holds
one and the header comes before any observation, so `seed_vl.skills` finds the right line to put the skill
block after. Legends come with the observations (each environment describes its own symbols or frame).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TASK_PREFIX = "Task:"
SYSTEM_PROMPT = "You are an agent that solves a task in an environment by taking one action per turn."
ANSWER_INSTRUCTION = "Answer with <think>your reasoning</think><action>one action</action>."


@dataclass(frozen=True)
class PromptTemplate:
    intro: str  # what the agent plays and what it observes
    hint: str  # one general rule of the game worth restating every turn


_SOKOBAN_HINT = "A box can only be pushed, never pulled: never push one into a corner that holds no target."
_EZPOINTS_HINT = "Use each card's value exactly once, then submit with '='."

TEMPLATES: dict[str, PromptTemplate] = {
    "sokoban_visual": PromptTemplate(
        "You are playing Sokoban; each turn shows the room as an image.", _SOKOBAN_HINT
    ),
    "sokoban_text": PromptTemplate(
        "You are playing Sokoban; each turn shows the room as a symbol grid.", _SOKOBAN_HINT
    ),
    "ezpoints_visual": PromptTemplate(
        "You are playing EZPoints; each turn shows two cards and your formula as an image.", _EZPOINTS_HINT
    ),
    "ezpoints_text": PromptTemplate(
        "You are playing EZPoints; each turn describes two cards and your formula.", _EZPOINTS_HINT
    ),
    "textworld": PromptTemplate(
        "You are playing a text adventure; each turn describes where you are and what you carry.",
        "Follow the objective step by step; typing a command that is not in the list wastes a turn.",
    ),
}


def template_for(env_name: str) -> PromptTemplate:
    if env_name not in TEMPLATES:
        raise ValueError(f"no prompt template for environment '{env_name}' (known: {', '.join(TEMPLATES)})")
    return TEMPLATES[env_name]


def header(env_name: str, task: str) -> str:
    """Intro, the task line (the task flattened to one line) and the game's hint."""
    template = template_for(env_name)
    return f"{template.intro}\n{TASK_PREFIX} {one_line(task)}\n{template.hint}"


def history_heading(shown: int, total: int) -> str:
    return "Previous turns:" if shown == total else f"Previous turns (the last {shown} of {total}):"


def observation_heading(step: int) -> str:
    return f"Step {step} observation:"


def outcome_line(step: int, action: str | None, valid: bool, reward: float) -> str:
    """What the agent did at `step` and what it earned."""
    if action is None:
        did = "your answer did not follow the format (invalid action)"
    elif not valid:
        did = f"'{action}' was an invalid action"
    else:
        did = f"you took '{action}'"
    return f"Step {step}: {did}; reward {reward:g}."


def current_heading(step: int) -> str:
    return f"Current observation (step {step}):"


def footer(admissible_actions: Sequence[str]) -> str:
    """The action list and the answer instruction: the last lines before the model answers."""
    return f"Admissible actions: {', '.join(admissible_actions)}\n{ANSWER_INSTRUCTION}"


def one_line(text: str) -> str:
    """Whitespace runs, newlines included, collapsed to single spaces."""
    return " ".join(text.split())
