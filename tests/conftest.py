"""Shared fixtures. The tiny models are built once per test session through the real builder and
loaded through the real `from_pretrained` path."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tiny_vl_path(tmp_path_factory) -> str:
    from seed_vl.toy.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("tiny-vl")
    build_tiny_model(out, text_only=False, seed=0)
    return str(out)


@pytest.fixture(scope="session")
def tiny_text_path(tmp_path_factory) -> str:
    from seed_vl.toy.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("tiny-text")
    build_tiny_model(out, text_only=True, seed=0)
    return str(out)


@pytest.fixture(scope="module")
def vl_policy(tiny_vl_path):
    """The tiny VL model loaded through `Policy.from_pretrained`, one per test module."""
    from seed_vl.policy import Policy

    return Policy.from_pretrained(tiny_vl_path, device="cpu")


@pytest.fixture(scope="module")
def text_policy(tiny_text_path):
    """The tiny text-only model loaded through `Policy.from_pretrained`, one per test module."""
    from seed_vl.policy import Policy

    return Policy.from_pretrained(tiny_text_path, device="cpu")


@pytest.fixture(scope="session")
def script_module():
    """Import a module from scripts/ (not a package) by name, as the scripts' tests call their `main`."""

    def load(name: str):
        sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
        try:
            return importlib.import_module(name)
        finally:
            sys.path.pop(0)

    return load
