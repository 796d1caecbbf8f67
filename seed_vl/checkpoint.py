"""Checkpoints: written atomically (temporary directory, then one rename), the last M kept.

A checkpoint directory `checkpoints/step_000010/` holds
  model/            the policy in ordinary Hugging Face format (safetensors + processor), loadable by from_pretrained
  optimizer.pt      optimizer and scheduler state
  rng.pt            Python, NumPy and torch (CPU + CUDA) RNG states, plus any named generator states
  trainer.json      the step, counters and the metrics so far
  config.yaml       the resolved config, secrets redacted
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from seed_vl.config import ConfigError, save_config
from seed_vl.io import atomic_directory

_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class TrainerState:
    step: int
    metrics: list[dict[str, Any]]
    counters: dict[str, Any]


def capture_rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    checkpoints_dir: str | Path,
    *,
    step: int,
    save_model,  # callable(directory) that writes the model + processor in HF format
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    config: BaseModel,
    state: TrainerState,
    keep_last: int,
) -> Path:
    """Write `checkpoints_dir/step_{step}` atomically, then prune to the newest `keep_last`."""
    target = Path(checkpoints_dir) / f"step_{step:06d}"
    with atomic_directory(target) as tmp:
        save_model(tmp / "model")
        torch.save(
            {
                "optimizer": optimizer.state_dict() if optimizer is not None else None,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
            },
            tmp / "optimizer.pt",
        )
        torch.save(capture_rng_state(), tmp / "rng.pt")
        (tmp / "trainer.json").write_text(
            json.dumps({"step": step, "metrics": state.metrics, "counters": state.counters}, indent=1)
        )
        save_config(config, tmp / "config.yaml")
    for old in list_checkpoints(checkpoints_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def list_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories of an interrupted write are ignored)."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name) and (p / "trainer.json").is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def resolve_resume(path: str | Path) -> Path:
    """Accept a checkpoint directory, a checkpoints/ folder or a run directory; return the newest checkpoint."""
    path = Path(path)
    if (path / "trainer.json").is_file():
        return path
    for candidate in (path / "checkpoints", path):
        found = list_checkpoints(candidate)
        if found:
            return found[-1]
    raise ConfigError(f"--resume: no checkpoint found in {path}")


def load_trainer_state(checkpoint: Path) -> TrainerState:
    data = json.loads((checkpoint / "trainer.json").read_text())
    return TrainerState(step=int(data["step"]), metrics=data["metrics"], counters=data["counters"])


def load_optimizer_state(checkpoint: Path, optimizer: torch.optim.Optimizer, scheduler: Any | None) -> None:
    blob = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=False)
    if blob["optimizer"] is not None:
        optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None and blob["scheduler"] is not None:
        scheduler.load_state_dict(blob["scheduler"])


def load_rng_state(checkpoint: Path) -> None:
    restore_rng_state(torch.load(checkpoint / "rng.pt", map_location="cpu", weights_only=False))
