"""Checkpoints: written atomically (temporary directory, then one rename), the last M kept.

A checkpoint directory `checkpoints/step_000010/` holds
  model/            the policy for users: Hugging Face format in the compute dtype (safetensors + processor),
                    loadable by from_pretrained; under LoRA the adapters (`seed-vl export` merges them)
  training_state/   float32 trainable weights and optimizer state (torch.distributed.checkpoint: one shard
                    per process under FSDP2), what a resume continues from
  scheduler.pt      learning-rate scheduler state
  rng.pt            Python, NumPy and torch (CPU + CUDA) RNG states
  trainer.json      the step, counters and the metrics so far
  config.yaml       the resolved config, secrets redacted
  manifest.json     size and SHA-256 of every file above: damage is found before anything is loaded
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from seed_vl.config import ConfigError, save_config
from seed_vl.distributed import Runtime
from seed_vl.io import replace_directory
from seed_vl.policy import Policy

_STEP_DIR = re.compile(r"^step_(\d+)$")
MODEL_DIR, TRAINING_STATE, MANIFEST = "model", "training_state", "manifest.json"


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
    runtime: Runtime,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    scheduler: Any | None,
    config: BaseModel,
    state: TrainerState,
    keep_last: int,
) -> Path:
    """Write `checkpoints_dir/step_{step}` atomically (every process takes part), then prune to the newest
    `keep_last`."""
    target = Path(checkpoints_dir) / f"step_{step:06d}"
    runtime.check_replicas_in_sync()  # DDP: the main process's copy stands for every process's
    model_state = runtime.model_state_for_export()  # a collective under FSDP2
    tmp = target.with_name(f".{target.name}.tmp")
    if runtime.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    runtime.wait_for_everyone()
    runtime.save_training_state(tmp / TRAINING_STATE, optimizer)
    if runtime.is_main:
        policy.save_pretrained(tmp / MODEL_DIR, state_dict=model_state)
        torch.save(scheduler.state_dict() if scheduler is not None else None, tmp / "scheduler.pt")
        torch.save(capture_rng_state(), tmp / "rng.pt")
        (tmp / "trainer.json").write_text(
            json.dumps({"step": step, "metrics": state.metrics, "counters": state.counters}, indent=1)
        )
        save_config(config, tmp / "config.yaml")
        write_manifest(tmp)
        replace_directory(tmp, target)
        for old in list_checkpoints(checkpoints_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    runtime.wait_for_everyone()
    return target


def load_checkpoint(checkpoint: Path, runtime: Runtime, optimizer, scheduler: Any | None) -> TrainerState:
    """Restore weights, optimizer, scheduler and RNG states in place; return the trainer state."""
    runtime.load_training_state(checkpoint / TRAINING_STATE, optimizer)
    blob = torch.load(checkpoint / "scheduler.pt", map_location="cpu", weights_only=False)
    if scheduler is not None and blob is not None:
        scheduler.load_state_dict(blob)
    restore_rng_state(torch.load(checkpoint / "rng.pt", map_location="cpu", weights_only=False))
    return load_trainer_state(checkpoint)


def list_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories of an interrupted write are ignored)."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name) and (p / "trainer.json").is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def resolve_resume(path: str | Path) -> Path:
    """Accept a checkpoint directory, a checkpoints/ folder or a run directory; return the newest intact
    checkpoint. A damaged one named directly is an error; found by search, it is skipped with a warning."""
    path = Path(path)
    if (path / "trainer.json").is_file():
        problem = damage(path)
        if problem:
            raise ConfigError(f"{problem}: the checkpoint is damaged; resume from an earlier one")
        return path
    for candidate in (path / "checkpoints", path):
        found = list_checkpoints(candidate)
        for checkpoint in reversed(found):
            problem = damage(checkpoint)
            if not problem:
                return checkpoint
            print(f"[seed-vl] warning: skipping damaged checkpoint {checkpoint.name} ({problem})", file=sys.stderr)
        if found:
            raise ConfigError(f"{candidate}: every checkpoint is damaged")
    raise ConfigError(f"{path}: no checkpoint found (expected a checkpoint, its checkpoints/ folder or a run directory)")


def write_manifest(directory: Path) -> None:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    (directory / MANIFEST).write_text(json.dumps(entries, indent=1, sort_keys=True))


def damage(checkpoint: Path) -> str:
    """'' for an intact checkpoint, else the first damaged file and what is wrong with it."""
    manifest = checkpoint / MANIFEST
    try:
        entries = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return f"{manifest}: missing or unreadable"
    for name, entry in entries.items():
        file = checkpoint / name
        if not file.is_file():
            return f"{file}: missing"
        if file.stat().st_size != entry["bytes"] or _sha256(file) != entry["sha256"]:
            return f"{file}: checksum mismatch"
    return ""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_trainer_state(checkpoint: Path) -> TrainerState:
    data = json.loads((checkpoint / "trainer.json").read_text())
    return TrainerState(step=int(data["step"]), metrics=data["metrics"], counters=data["counters"])
