"""Multi-process runs on 2 CPU processes over gloo, launched through the shipped accelerate configs.

accelerate itself runs FSDP on GPUs only (with `use_cpu` it falls back to plain multi-CPU), so seed-vl
applies FSDP2 itself (`seed_vl.distributed`); here the shipped `fsdp.yaml`, with `use_cpu: true` and two
processes, drives the same `fully_shard` code over gloo. Each GPU config is run as its CPU variant (only
`use_cpu` and `num_processes` changed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_trainer import REPO, _metrics, _overrides

from seed_vl.checkpoint import list_checkpoints
from seed_vl.config import load_config
from seed_vl.stage1 import collect, sft
from seed_vl.toy.tiny_model import build_tiny_model

ACCELERATE_CONFIGS = sorted(p.name for p in (REPO / "configs" / "accelerate").glob("*.yaml"))


def _cpu_variant(name: str, tmp_path: Path, processes: int) -> Path:
    config = yaml.safe_load((REPO / "configs" / "accelerate" / name).read_text())
    config.update(use_cpu=True, num_processes=processes)
    path = tmp_path / f"cpu_{name}"
    path.write_text(yaml.safe_dump(config))
    return path


def _launch(config: Path, *args: str, port: int) -> None:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--main_process_port", str(port), "-m", "seed_vl.cli", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _metrics_sft(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "model" / "model.safetensors"))


def test_fsdp2_matches_ddp_and_resumes_from_its_sharded_checkpoints(tmp_path, tiny_vl_path):
    """The same two updates with FSDP2 and with DDP (hand-averaged gradients) give the same metrics and
    weights; FSDP2 writes one shard per process and `--resume` continues from them."""
    common = _overrides(tiny_vl_path, tmp_path, "sokoban_visual", **{
        "analyzer.backend": "scripted", "rollout.num_tasks": 3, "train.mini_batch_size": 4,
        "train.micro_batch_size": 2, "checkpoint.every": 1, "checkpoint.keep_last": 3, "eval.num_tasks": 1,
    })
    _launch(_cpu_variant("fsdp.yaml", tmp_path, 2), "train", *common, "train.run_name=fsdp", port=29571)
    _launch(_cpu_variant("multi_gpu.yaml", tmp_path, 2), "train", *common, "train.run_name=ddp", port=29572)

    fsdp, ddp = _metrics(tmp_path / "fsdp"), _metrics(tmp_path / "ddp")
    assert [r["step"] for r in fsdp] == [r["step"] for r in ddp] == [0, 1, 2]
    for a, b in zip(fsdp[1:], ddp[1:], strict=True):
        for key in ("loss", "grad_norm", "kl", "entropy", "opd_loss", "env_steps"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    checkpoints = list_checkpoints(tmp_path / "fsdp" / "checkpoints")
    assert len(list((checkpoints[-1] / "training_state").glob("*.distcp"))) == 2
    ddp_final = _weights(list_checkpoints(tmp_path / "ddp" / "checkpoints")[-1])
    for name, value in _weights(checkpoints[-1]).items():
        assert torch.allclose(value, ddp_final[name], atol=1e-5), name

    _launch(_cpu_variant("fsdp.yaml", tmp_path, 2), "train", *common, "train.run_name=fsdp", "train.steps=3",
            "--resume", str(tmp_path / "fsdp"), port=29573)
    assert [r["step"] for r in _metrics(tmp_path / "fsdp")] == [0, 1, 2, 3]


def test_single_gpu_config_runs_one_process(tmp_path, tiny_text_path):
    _launch(_cpu_variant("single_gpu.yaml", tmp_path, 1), "train",
            *_overrides(tiny_text_path, tmp_path, "ezpoints_text", **{"train.steps": 1}), port=29574)
    assert [r["step"] for r in _metrics(tmp_path / "run")] == [0, 1]


def test_every_shipped_accelerate_config_is_exercised():
    exercised = {"cpu_ddp.yaml", "fsdp.yaml", "multi_gpu.yaml", "single_gpu.yaml"}  # here and test_trainer
    assert set(ACCELERATE_CONFIGS) == exercised


@pytest.mark.parametrize("launch", ["fsdp.yaml", "multi_gpu.yaml"])
def test_sft_on_two_processes_matches_one_process_and_resumes_exactly(tmp_path, tiny_text_path, launch):
    def config(name: str, *extra: str):
        return [
            f"model.path={tiny_text_path}", "model.device=cpu", "env.name=ezpoints_text",
            f"sft.data=[{data}]", "sft.epochs=2", "sft.batch_size=4", "sft.lr=1e-3",
            "train.micro_batch_size=1", f"sft.out_dir={tmp_path / name}", "checkpoint.every=1",
            "checkpoint.keep_last=10", "logging.progress=false", *extra,
        ]

    data = collect(load_config(None, [
        f"model.path={tiny_text_path}", "model.device=cpu", "env.name=ezpoints_text", "env.max_steps=2",
        "rollout.max_new_tokens=6", "collect.num_tasks=6", "collect.group_size=2", "analyzer.backend=scripted",
        f"collect.out_dir={tmp_path / 'data'}", "logging.progress=false",
    ]))
    labelled = json.loads((data / "dataset.json").read_text())["labelled"]
    single = sft(load_config(None, config("single")))
    _launch(_cpu_variant(launch, tmp_path, 2), "sft", *config("two"), port=29575)
    # The same losses and gradient norms step by step (a gradient off by a constant factor would show in
    # the norm; Adam would hide it in the weights), and weights equal up to summation order.
    steps = [_metrics_sft(tmp_path / name) for name in ("single", "two")]
    assert len(steps[0]) == len(steps[1]) == 2 * -(-labelled // 4) >= 4
    for a, b in zip(*steps, strict=True):
        assert a["sft/loss"] == pytest.approx(b["sft/loss"], rel=1e-6)
        assert a["sft/grad_norm"] == pytest.approx(b["sft/grad_norm"], rel=1e-4)
    reference = load_file(str(single / "model.safetensors"))
    for name, value in load_file(str(tmp_path / "two" / "model" / "model.safetensors")).items():
        assert torch.allclose(value, reference[name], atol=1e-4), name

    # Interrupted after step 1, resumed: bit for bit the uninterrupted run.
    first = list_checkpoints(tmp_path / "single" / "checkpoints")[0]
    resumed = sft(load_config(None, config("single")), resume=str(first))
    for name, value in load_file(str(resumed / "model.safetensors")).items():
        assert torch.equal(value, reference[name]), name


@pytest.mark.parametrize(
    ("arch", "extra"),
    [
        ("qwen2_vl", {}),
        ("qwen3_vl", {"model.dtype": "bfloat16"}),
        ("text", {"model.dtype": "bfloat16", "model.lora": "{r: 4}"}),
    ],
)
def test_fsdp2_shards_every_model_family(tmp_path, tiny_text_path, arch, extra):
    """Wrap units come from the loaded model (its `_no_split_modules`), so no family needs a class list;
    bf16 mixed precision and LoRA adapters shard too."""
    if arch == "text":
        model, env = tiny_text_path, "sokoban_text"
    else:
        model, env = str(build_tiny_model(tmp_path / arch, arch=arch)), "sokoban_visual"
    overrides = _overrides(model, tmp_path, env, **{"train.steps": 1, "eval.num_tasks": 1, "checkpoint.every": 1,
                                                    "analyzer.backend": "scripted", **extra})
    _launch(_cpu_variant("fsdp.yaml", tmp_path, 2), "train", *overrides, port=29576)
    (checkpoint,) = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert len(list((checkpoint / "training_state").glob("*.distcp"))) == 2
    assert _metrics(tmp_path / "run")[-1]["grad_norm"] > 0
    saved = "adapter_model.safetensors" if "model.lora" in extra else "model.safetensors"
    assert load_file(str(checkpoint / "model" / saved))


def test_a_ddp_process_whose_weights_drifted_is_caught(tmp_path, tiny_text_path):
    """Every checkpoint first checks that the DDP processes' weight copies are equal (the test above
    checkpoints each step, so its runs pass that check); a copy perturbed on one process fails it."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(_cpu_variant("multi_gpu.yaml", tmp_path, 2)), "--main_process_port", "29579",
               str(REPO / "tests" / "ddp_replicas.py"), tiny_text_path]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # (both processes print to one pipe: their lines may interleave)
    assert sorted(re.findall(r"caught on process \d", proc.stdout)) == ["caught on process 0", "caught on process 1"]


def test_ddp_equals_one_process_on_the_same_data(tmp_path, tiny_vl_path):
    """Sampling seeds follow each episode's global index, so two processes play exactly the episodes one
    process plays; with one optimizer step per update (a mini-batch holding every turn), their averaged
    gradients are the one-process gradient, and the weights agree to summation order."""
    common = _overrides(tiny_vl_path, tmp_path, "sokoban_visual", **{
        "analyzer.backend": "scripted", "rollout.num_tasks": 2, "train.mini_batch_size": 64,
        "train.micro_batch_size": 3, "eval.num_tasks": 2,
    })
    _launch(_cpu_variant("multi_gpu.yaml", tmp_path, 2), "train", *common, "train.run_name=ddp", port=29577)
    _launch(_cpu_variant("single_gpu.yaml", tmp_path, 1), "train", *common, "train.run_name=one", port=29578)
    ddp, one = _metrics(tmp_path / "ddp"), _metrics(tmp_path / "one")
    assert [r["step"] for r in ddp] == [r["step"] for r in one] == [0, 1, 2]
    for a, b in zip(ddp, one, strict=True):
        for key in ("loss", "grad_norm", "kl", "entropy", "train/return", "eval/success_rate", "env_steps"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    final = [_weights(list_checkpoints(tmp_path / name / "checkpoints")[-1]) for name in ("ddp", "one")]
    for name, value in final[0].items():
        assert torch.allclose(value, final[1][name], atol=1e-5), name
