"""`seed-vl export`: a checkpoint's policy as a plain Hugging Face checkpoint that `from_pretrained` loads.

A full fine-tune's `model/` already is one; under LoRA, `model/` holds adapters, which are merged here into
the base weights named by the checkpoint's own config. Saved in the run's compute dtype.
"""

from __future__ import annotations

import os
from pathlib import Path

from seed_vl.checkpoint import MODEL_DIR, resolve_resume
from seed_vl.config import ConfigError, load_config
from seed_vl.io import atomic_directory
from seed_vl.policy import Policy


def export(checkpoint: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    found = resolve_resume(checkpoint)
    config_file = found / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"{found}: no config.yaml (not a seed-vl checkpoint)")
    model = load_config(config_file).model.model_copy(update={"device": "cpu"})
    lora = model.lora is not None
    policy = Policy.from_config(
        model,
        path=model.path if lora else found / MODEL_DIR,
        trainable=False,
        adapter_path=found / MODEL_DIR if lora else None,
    )
    with atomic_directory(out_dir) as tmp:
        policy.save_merged(tmp)
    return Path(out_dir)
