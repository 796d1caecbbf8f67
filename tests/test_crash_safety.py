"""SIGKILL at any point of a run loses at most the work since the last checkpoint, and a resumed run ends
exactly where the uninterrupted one does: the same metrics and the same weights. The kill is injected in a
child process by wrapping one seed-vl function, so it lands mid-rollout, mid-update or mid-checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from test_trainer import _cli, _metrics, _overrides

from seed_vl.checkpoint import list_checkpoints

# (module, function, which call is killed): calls counted over the whole run of 3 steps
KILL_POINTS = {
    "mid-rollout": ("seed_vl.policy", "Policy.generate", 9),
    "mid-update": ("seed_vl.distributed", "Runtime.optimizer_step", 4),  # step 2, 2nd mini-batch
    "mid-checkpoint": ("seed_vl.checkpoint", "write_manifest", 2),  # step 2, shards written
}

DRIVER = textwrap.dedent("""
    import importlib, os, signal, sys
    module_name, qualname, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    owner = importlib.import_module(module_name)
    names = qualname.split(".")
    for name in names[:-1]:
        owner = getattr(owner, name)
    original, calls = getattr(owner, names[-1]), [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(owner, names[-1], wrapped)
    from seed_vl.cli import main
    sys.exit(main(sys.argv[4:]))
""")


def _comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_vl_path):
    out = tmp_path_factory.mktemp("uninterrupted")
    proc = _cli("train", *_recipe(tiny_vl_path, out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "run"


def _recipe(model_path, out) -> list[str]:
    """SEED with the self analyzer and the KL reference model, a checkpoint after every step."""
    return _overrides(model_path, out, "sokoban_visual", **{
        "train.steps": 3, "checkpoint.every": 1, "checkpoint.keep_last": 3, "eval.num_tasks": 1,
        "analyzer.backend": "self", "algorithm.kl_coef": 0.05,
    })


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_then_resume_ends_like_the_uninterrupted_run(tmp_path, tiny_vl_path, uninterrupted, point):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    module, function, call = KILL_POINTS[point]
    args = ["train", *_recipe(tiny_vl_path, tmp_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    killed = subprocess.run([sys.executable, str(driver), module, function, str(call), *args],
                            capture_output=True, text=True, env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    for checkpoint in list_checkpoints(tmp_path / "run" / "checkpoints"):
        assert (checkpoint / "manifest.json").is_file()  # only complete checkpoints are listed

    resumed = _cli(*args, "--resume", str(tmp_path / "run"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _comparable(_metrics(tmp_path / "run")) == _comparable(_metrics(uninterrupted))
    final = list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    expected = list_checkpoints(uninterrupted / "checkpoints")[-1]
    assert final.name == expected.name == "step_000003"
    a, b = (load_file(str(c / "model" / "model.safetensors")) for c in (final, expected))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    state = json.loads((final / "trainer.json").read_text())
    assert state["counters"] == json.loads((expected / "trainer.json").read_text())["counters"]
