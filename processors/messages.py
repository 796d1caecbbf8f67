"""Observation + history -> chat messages.

Windowed (`history_window` K, the paper's mode): a system and a user message. The user message reads: header
(with the task line), the last K turns (each turn's frames - or its text when it has none - and what the
agent did), the current observation, the admissible actions and the answer instruction.
Episode (`history_window="episode"`): one chat over the whole episode. The first user message holds the
header and the first observation, each answer is an assistant message, and each later user message says what
the previous action earned and shows the next observation; each turn's context extends the previous turn's
context and answer. With frames a message's content is a list of text and `{"type": "image", "image":
PIL.Image}` items; without, it is one string, which every chat template (text-only tokenizers) accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image

from seed_vl.envs.base import Observation
from seed_vl.processors import prompts
from seed_vl.processors.images import ImageSettings, prepare_image


@dataclass
class HistoryTurn:
    """One earlier turn: what the agent saw, what it answered and what that earned."""

    observation: Observation
    response: str
    action: str | None  # parsed action, None when the response did not parse
    valid: bool
    reward: float
    admissible_actions: Sequence[str] = ()  # as listed at that turn (an episode-mode context shows them again)


def build_messages(
    env_name: str,
    obs: Observation,
    info: dict[str, Any],
    history: Sequence[HistoryTurn],
    history_window: int | str,
    image_settings: ImageSettings | None = None,
) -> list[dict[str, Any]]:
    """The context for the next turn; `history` is the whole episode so far, the last `history_window`
    turns are shown (or all, as chat turns: "episode"). `image_settings` resizes every frame to the model's
    pixel budget (None: as given)."""
    if history_window == "episode":
        return _episode_messages(env_name, obs, info, history, image_settings)
    content = _Content(image_settings)
    content.add_text(prompts.header(env_name, info["task"]))
    shown = list(history[max(0, len(history) - history_window) :])
    if shown:
        content.add_text("", prompts.history_heading(len(shown), len(history)))
    for step, turn in enumerate(shown, start=len(history) - len(shown) + 1):
        content.add_text(prompts.observation_heading(step))
        if turn.observation["images"]:  # a frame speaks for itself; its legend is shown once, below
            content.add_images(turn.observation["images"])
        else:
            content.add_text(turn.observation["text"])
        content.add_text(prompts.outcome_line(step, turn.action, turn.valid, turn.reward))
    content.add_text("", prompts.current_heading(len(history) + 1))
    content.add_images(obs["images"])
    content.add_text(obs["text"], prompts.footer(info["admissible_actions"]))
    return [
        {"role": "system", "content": prompts.SYSTEM_PROMPT},
        {"role": "user", "content": content.finish()},
    ]


def _episode_messages(
    env_name: str,
    obs: Observation,
    info: dict[str, Any],
    history: Sequence[HistoryTurn],
    image_settings: ImageSettings | None,
) -> list[dict[str, Any]]:
    shown = [(turn.observation, turn.admissible_actions) for turn in history]
    shown.append((obs, info["admissible_actions"]))
    messages: list[dict[str, Any]] = [{"role": "system", "content": prompts.SYSTEM_PROMPT}]
    for step, (observation, admissible) in enumerate(shown, start=1):
        content = _Content(image_settings)
        if step == 1:
            content.add_text(prompts.header(env_name, info["task"]), "")
        else:
            turn = history[step - 2]
            messages.append({"role": "assistant", "content": turn.response})
            content.add_text(prompts.outcome_line(step - 1, turn.action, turn.valid, turn.reward), "")
        content.add_text(prompts.current_heading(step))
        content.add_images(observation["images"])
        content.add_text(observation["text"], prompts.footer(admissible))
        messages.append({"role": "user", "content": content.finish()})
    return messages


class _Content:
    """Accumulates lines and frames; consecutive lines share one text item."""

    def __init__(self, image_settings: ImageSettings | None) -> None:
        self.items: list[dict[str, Any]] = []
        self.image_settings = image_settings

    def add_text(self, *lines: str) -> None:
        text = "\n".join(lines)
        if self.items and self.items[-1]["type"] == "text":
            self.items[-1]["text"] += "\n" + text
        else:
            self.items.append({"type": "text", "text": text})

    def add_images(self, images: Sequence[Image.Image]) -> None:
        for image in images:
            if self.image_settings is not None:
                image = prepare_image(image, self.image_settings.min_pixels, self.image_settings.max_pixels)
            self.items.append({"type": "image", "image": image})

    def finish(self) -> str | list[dict[str, Any]]:
        if len(self.items) == 1:
            return self.items[0]["text"]
        return self.items
