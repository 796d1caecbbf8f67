"""Skills as training-time privileged context (DESIGN §1 stage 2 step 3).

`insert_skill` builds the teacher's context: the ordinary context with the episode-level skill block
right after the task line. A `SkillBank` holds the static per-task-type skills of the SDAR baseline.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from seed_vl.config import ConfigError
from seed_vl.processors.prompts import TASK_PREFIX

SKILL_HEADER = "**Episode-Level Skill**"
SKILL_INSTRUCTION = (
    "Refer to this episode-level skill when deciding what action to take in the current episode:"
)

Context = list[dict[str, Any]]


def skill_block(skill: str) -> str:
    """The three-line block of DESIGN §1 stage 2 step 3."""
    return f"{SKILL_HEADER}\n{SKILL_INSTRUCTION}\n[{skill}]"


def insert_skill(context: Context, skill: str) -> Context:
    """A new context with the skill block right after the first task line; `context` is left untouched.

    Messages and items other than the one holding the task line are shared, not copied (images included),
    so the teacher's context reuses the same image objects as the ordinary one.
    """
    block = skill_block(skill)
    for m, message in enumerate(context):
        content = message["content"]
        if isinstance(content, str):
            text = _after_task_line(content, block)
            if text is not None:
                return [*context[:m], {**message, "content": text}, *context[m + 1 :]]
            continue
        for i, item in enumerate(content):
            text = _after_task_line(item["text"], block) if item.get("type") == "text" else None
            if text is not None:
                new_content = [*content[:i], {**item, "text": text}, *content[i + 1 :]]
                return [*context[:m], {**message, "content": new_content}, *context[m + 1 :]]
    raise ValueError(
        f"cannot insert the skill: no task line (a line starting with {TASK_PREFIX!r}) in the context"
    )


def _after_task_line(text: str, block: str) -> str | None:
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(TASK_PREFIX):
            before, after = "".join(lines[: i + 1]), "".join(lines[i + 1 :])
            return f"{before}{block}\n{after}" if before.endswith("\n") else f"{before}\n{block}"
    return None


@dataclass(frozen=True)
class SkillBank:
    """Static skills per task type (environment name) for the SDAR baseline."""

    path: str
    skills: dict[str, str]

    def skill_for(self, task_type: str) -> str:
        if task_type not in self.skills:
            known = ", ".join(sorted(self.skills))
            raise ConfigError(f"skill bank {self.path}: no skill for task type '{task_type}' (has: {known})")
        return self.skills[task_type]


def load_skill_bank(path: str | os.PathLike) -> SkillBank:
    """Read a YAML/JSON mapping `task type -> skill text` (or a list of texts, joined into one skill)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"algorithm.skill_bank: file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError):
        raise ConfigError(
            f"algorithm.skill_bank: {path} is not valid {path.suffix.lstrip('.').upper() or 'YAML'}"
        ) from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"algorithm.skill_bank: {path} must map task types to skills")
    skills = {}
    for task_type, value in data.items():
        parts = [value] if isinstance(value, str) else value
        if (
            not isinstance(parts, list)
            or not parts
            or not all(isinstance(p, str) and p.strip() for p in parts)
        ):
            raise ConfigError(
                f"algorithm.skill_bank: {path}: '{task_type}' must be a skill text or a list of them"
            )
        skills[str(task_type)] = " ".join(" ".join(parts).split())
    return SkillBank(path=str(path), skills=skills)
