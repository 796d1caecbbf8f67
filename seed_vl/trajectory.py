"""The trajectory record: what a rollout produces and every later stage (analyzer, skills, scoring,
losses, reports) reads. A leaf module: it imports nothing from the rest of the package."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
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
    frame_ids: list[str] = field(default_factory=list)  # content hashes of this turn's observation images
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """One episode of one group member. `seed` reproduces the initial state of the environment."""

    env_name: str
    seed: int
    task: str  # the task description shown on the marked task line
    group_id: int
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

    def to_record(self) -> dict[str, Any]:
        """JSON-safe dict; image content items are replaced by their frame ids (see rollout's writer)."""
        record = asdict(self)
        record["length"] = self.length
        return record
