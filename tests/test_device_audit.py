"""Device correctness without a GPU: every training path runs under `DeviceAudit` (see device_audit.py),
which raises where a CUDA run would find a CPU tensor meeting a device tensor."""

from __future__ import annotations

import pytest
import torch
from device_audit import DeviceAudit, DeviceMismatch
from helpers import noise_frame, user_context
from test_trainer import _overrides

from seed_vl.config import load_config
from seed_vl.evaluation import evaluate
from seed_vl.policy import Policy
from seed_vl.sft import SFTExample, SFTSettings, train_sft
from seed_vl.trainer import Trainer


def test_the_audit_catches_what_cuda_rejects():
    layer = torch.nn.Linear(4, 3)
    with DeviceAudit(layer) as audit:
        logits = layer(torch.ones(2, 4).to("cuda" if torch.cuda.is_available() else "cpu"))
        with pytest.raises(DeviceMismatch, match="off the device"):
            logits + torch.zeros(2, 3)  # a factory without device=
        batch = torch.tensor([[0], [2]])
        moved = batch.to(logits.device)  # on the CPU a no-op, yet `batch` itself stays off the device
        assert audit.is_on(logits) and not audit.is_on(batch)
        logits.gather(-1, moved)
        with pytest.raises(DeviceMismatch, match="gather"):
            logits.gather(-1, batch)  # the bug behind the first GPU crash
        # what CUDA accepts: 0-dim CPU scalars, CPU index tensors, copies back to the CPU
        logits * torch.tensor(2.0)
        logits[torch.tensor([1])]
        logits.detach().cpu() + torch.zeros(2, 3)


@pytest.mark.parametrize("lora", [False, True])
def test_a_training_step_touches_the_device_only_with_device_tensors(tmp_path, tiny_vl_path, lora):
    """SEED with the self analyzer and the KL reference (a second model, or LoRA's disabled adapters),
    bf16 autocast, gradient checkpointing, evaluation and a checkpoint, all under the audit."""
    extra = {"model.dtype": "bfloat16", "model.gradient_checkpointing": True, "train.steps": 1,
             "train.micro_batch_size": 3, "train.mini_batch_size": 5, "checkpoint.every": 1}
    if lora:
        extra["model.lora"] = "{r: 4, alpha: 8, dropout: 0.1}"
    trainer = Trainer(load_config(None, _overrides(tiny_vl_path, tmp_path, "sokoban_visual", **extra)))
    models = [trainer.policy.model] + ([trainer.reference.model] if trainer.reference else [])
    with DeviceAudit(*models) as audit:
        metrics = trainer.train()
    assert audit.ops_checked > 10_000
    assert metrics[-1]["kl"] >= 0 and metrics[-1]["step"] == 1
    assert (tmp_path / "run" / "checkpoints" / "step_000001" / "model").is_dir()


def test_sft_and_evaluation_touch_the_device_only_with_device_tensors(tiny_vl_path):
    from seed_vl.config import EnvConfig
    from seed_vl.envs.group import EnvGroup
    from seed_vl.rollout import SamplingSettings

    policy = Policy.from_pretrained(tiny_vl_path, dtype="bfloat16", device="cpu", gradient_checkpointing=True)
    examples = [SFTExample(user_context("push the box", noise_frame(i)), "<think>up</think><action>up</action>")
                for i in range(3)]
    group = EnvGroup(EnvConfig(name="sokoban_visual", max_steps=2, cell_px=28), num_tasks=2, group_size=1)
    with DeviceAudit(policy.model):
        result = train_sft(policy, examples, SFTSettings(epochs=1, batch_size=2, micro_batch_size=1),
                           show_progress=False)
        metrics = evaluate(policy, group, SamplingSettings(8, 0.4, 1.0, 1), seed=0)
    assert result.steps == 2 and 0.0 <= metrics["eval/success_rate"] <= 1.0
