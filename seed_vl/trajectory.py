"""The trajectory record: what a rollout produces and every later stage (analyzer, skills, scoring,
losses, reports) reads. A leaf module: it imports nothing from the rest of the package."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class Turn:
    """One agent turn: the context the policy saw, what it answered, and what the environment did."""

    context: list[dict[str, Any]]  # chat messages; image items hold PIL images in memory, frame ids on disk
    response_text: str
    response_ids: list[int]
    action: str | None  # parsed action, None when the output did not parse
    action_valid: bool
    reward: float
    observation_text: str = ""  # the observation text shown at this turn (analyzer prompts, reports)
    images: list[Any] = field(default_factory=list)  # this turn's observation frames (PIL; frame ids on disk)
    # The sampler's log-prob of each response token (None when the actor reports none, e.g. a script): the
    # trainer compares them with its own l_old (rollout/logprob_gap) and may correct for the gap.
    rollout_logprobs: list[float] | None = None
    # Filled by the trainer's paired re-scoring (reports): the OPD gate of each response token.
    gates: list[float] | None = None


@dataclass
class Trajectory:
    """One episode of one group member. `seed` reproduces the initial state of the environment."""

    env_name: str
    seed: int
    task: str  # the task description shown on the marked task line
    group_id: int
    episode_id: int | None = None  # index in the whole step's batch, whichever process played it
    turns: list[Turn] = field(default_factory=list)
    won: bool = False
    episode_return: float = 0.0
    # Filled by the analyzer; `skill is None` means "no skill": no OPD signal for this trajectory.
    skill: str | None = None
    summary: str | None = None
    analyzer_status: str = "pending"  # ok | no_skill | error | pending

    @property
    def length(self) -> int:
        return len(self.turns)

    @property
    def actions(self) -> list[str | None]:
        return [t.action for t in self.turns]

    @property
    def invalid_actions(self) -> int:
        return sum(not t.action_valid for t in self.turns)

    def to_record(self, image_ref: Callable[[Any], str] = lambda image: "<image>") -> dict[str, Any]:
        """JSON-safe dict; each image item of a context becomes `{"type": "image", "image": image_ref(img)}`."""
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "turns"}
        record["length"] = self.length
        record["turns"] = [
            {
                **{f.name: getattr(t, f.name) for f in fields(t)},
                "context": map_images(t.context, image_ref),
                "images": [image_ref(img) for img in t.images],
            }
            for t in self.turns
        ]
        return record


def map_images(messages: list[dict[str, Any]], fn: Callable[[Any], Any]) -> list[dict[str, Any]]:
    """The messages with every image item's `image` replaced by `fn(image)` (e.g. PIL image <-> frame id)."""
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [{**item, "image": fn(item["image"])} if item.get("type") == "image" else item for item in content]
        out.append({**message, "content": content})
    return out
