"""scripts/gpu_smoke.py: one line and exit 2 without a GPU; its dry run exercises the same code on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_trainer import REPO

SCRIPT = str(REPO / "scripts" / "gpu_smoke.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run the smoke check itself")
def test_without_a_gpu_it_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no CUDA GPU" in proc.stderr


@pytest.mark.slow
def test_dry_run_on_the_cpu(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--size", "tiny", "--out", str(tmp_path)],
                   check=True, env=env, timeout=1200)
    results = json.loads((tmp_path / "smoke.json").read_text())
    assert set(results) >= {"grpo", "seed", "seed_fsdp2"}
    assert "FSDP2" in results["seed_fsdp2"]["distributed"]
    for run in ("grpo", "seed", "seed_fsdp2"):
        assert results[run]["trainable_changed"] > 0.99
        assert results[run]["cache"]["encoder_calls"] > 0
