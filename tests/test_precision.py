"""Mixed precision that learns, gradient checkpointing that is on, checkpoints in the dtype users load."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import noise_frame, user_context
from safetensors import safe_open
from test_trainer import _overrides
from transformers import AutoModelForImageTextToText

from seed_vl.config import load_config
from seed_vl.policy import Policy
from seed_vl.trainer import Trainer


def _trainer(model_path, tmp_path, dtype: str, name: str) -> Trainer:
    return Trainer(load_config(None, _overrides(model_path, tmp_path, "sokoban_visual", **{
        "model.dtype": dtype, "train.lr": 1e-6, "train.mini_batch_size": 64,  # one optimizer step
        "algorithm.preset": "grpo", "train.run_name": name,
    })))


def _trainable(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}


def _changed_fraction(trainer: Trainer, before: dict[str, torch.Tensor]) -> float:
    changed = sum(int((p.detach() != before[n]).sum()) for n, p in trainer.policy.model.named_parameters()
                  if n in before)
    return changed / sum(t.numel() for t in before.values())


def test_bf16_compute_learns_at_lr_1e_6_like_fp32(tmp_path, tiny_vl_path):
    """One update on the same trajectories: bf16 compute with fp32 master weights moves (nearly) every
    trainable weight and reports the fp32 run's loss; the same update applied to bf16 weights (the old
    behaviour) loses most of it, which is what this test would catch."""
    fp32 = _trainer(tiny_vl_path, tmp_path, "float32", "fp32")
    trajectories = fp32.rollout(1)
    mixed = _trainer(tiny_vl_path, tmp_path, "bfloat16", "bf16")
    assert {p.dtype for p in mixed.policy.model.parameters() if p.requires_grad} == {torch.float32}
    assert mixed.policy.compute_dtype == torch.bfloat16

    before = _trainable(mixed)
    metrics_mixed = mixed.learn(1, trajectories)
    metrics_fp32 = fp32.learn(1, trajectories)
    assert _changed_fraction(mixed, before) >= 0.99
    # bf16 keeps ~3 significant digits: the log-probs and so the loss agree to about 1e-2 relative
    assert metrics_mixed["entropy"] == pytest.approx(metrics_fp32["entropy"], rel=1e-2)
    assert metrics_mixed["loss"] == pytest.approx(metrics_fp32["loss"], abs=1e-3)
    assert metrics_mixed["ratio"] == pytest.approx(1.0, abs=1e-2)  # on-policy: l_theta == l_old

    pure = _trainer(tiny_vl_path, tmp_path, "bfloat16", "pure-bf16")
    pure.policy.model.to(torch.bfloat16)  # weights and AdamW state in bf16
    before = _trainable(pure)
    pure.learn(1, trajectories)
    assert _changed_fraction(pure, before) < 0.5


def test_checkpoint_saves_compute_dtype_model_and_fp32_training_state(tmp_path, tiny_vl_path):
    trainer = _trainer(tiny_vl_path, tmp_path, "bfloat16", "ckpt")
    trainer.learn(1, trainer.rollout(1))
    trainer.save_checkpoint(1)
    checkpoint = tmp_path / "ckpt" / "checkpoints" / "step_000001"

    config = json.loads((checkpoint / "model" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    with safe_open(str(checkpoint / "model" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118 (safe_open is no dict) == {torch.bfloat16}
    loaded = AutoModelForImageTextToText.from_pretrained(checkpoint / "model", dtype="auto")
    master = dict(trainer.policy.model.named_parameters())
    for name, param in loaded.named_parameters():
        assert torch.equal(param, master[name].detach().to(torch.bfloat16)), name

    # The resumable state keeps the float32 master weights bit for bit; the frozen tower is held in bf16.
    resumed = Trainer(trainer.config, resume=str(checkpoint))
    for name, param in resumed.policy.model.named_parameters():
        assert param.dtype == (torch.float32 if param.requires_grad else torch.bfloat16), name
        assert torch.equal(param, master[name]), name


def _mlp_calls(policy: Policy) -> list[int]:
    """Per decoder layer, how often its MLP started (a child's hook runs inside the checkpointed region; a
    pre-hook, because the recompute stops once it has rebuilt the last activation backward needs)."""
    layers = policy.model.model.language_model.layers
    calls = [0] * len(layers)
    for i, layer in enumerate(layers):
        layer.mlp.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


def test_gradient_checkpointing_reruns_layers_in_backward_only(tiny_vl_path):
    contexts = [user_context("push the box", noise_frame(i)) for i in range(2)]
    plain = Policy.from_pretrained(tiny_vl_path, device="cpu")
    responses = [plain.tokenizer.encode(text) for text in ("<think>up</think>", "<action>left</action>")]
    checkpointed = Policy.from_pretrained(tiny_vl_path, device="cpu", gradient_checkpointing=True)
    counts = {name: _mlp_calls(p) for name, p in (("plain", plain), ("checkpointed", checkpointed))}

    scores = {}
    for name, policy in (("plain", plain), ("checkpointed", checkpointed)):
        with policy.update_mode():
            out = policy.score(contexts, responses, with_grad=True)
            torch.cat(out.logprobs).sum().backward()
        scores[name] = out.logprobs
    assert counts["plain"] == [1] * len(counts["plain"])
    assert counts["checkpointed"] == [2] * len(counts["checkpointed"])  # recomputed in backward
    for a, b in zip(scores["plain"], scores["checkpointed"], strict=True):
        assert torch.equal(a.detach(), b.detach())
    pairs = zip(plain.model.parameters(), checkpointed.model.parameters(), strict=True)
    grads = [(p.grad, q.grad) for p, q in pairs if p.grad is not None]
    assert grads and all(torch.allclose(a, b, atol=1e-6) for a, b in grads)

    checkpointed.score(contexts, responses)  # no graph: nothing to recompute, layers run once
    assert counts["checkpointed"] == [3] * len(counts["checkpointed"])
    assert not any(m.training for m in checkpointed.model.modules())  # dropout keeps eval semantics
