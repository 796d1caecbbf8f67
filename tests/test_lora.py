"""LoRA through PEFT: only adapters train, the reference is the base model, adapters save and merge."""

from __future__ import annotations

import pytest
import torch
from helpers import noise_frame, user_context
from test_trainer import _cli, _overrides

from seed_vl.config import load_config
from seed_vl.export import export
from seed_vl.policy import Policy
from seed_vl.trainer import Trainer

LORA = "{r: 4, alpha: 8, target_modules: [q_proj, v_proj, down_proj]}"


def test_lora_trains_adapters_only_and_its_reference_is_the_base_model(tmp_path, tiny_vl_path):
    trainer = Trainer(load_config(None, _overrides(tiny_vl_path, tmp_path, "sokoban_visual", **{
        "model.lora": LORA, "train.steps": 1, "checkpoint.every": 1, "algorithm.kl_coef": 0.05,
    })))
    model = trainer.policy.model
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert not any(".visual." in name for name in trainable)  # the frozen vision tower gets no adapters
    assert trainer.reference is None  # no second copy in memory

    base = Policy.from_pretrained(tiny_vl_path, device="cpu")
    contexts = [user_context("push the box", noise_frame(i)) for i in range(2)]
    responses = [base.tokenizer.encode(t) for t in ("<think>up</think>", "<action>left</action>")]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.config.train.lr = 1e-2
    for group in trainer.optimizer.param_groups:
        group["lr"] = 1e-2  # large enough that the adapters visibly move
    trainer.train()

    changed = [name for name, p in model.named_parameters() if not torch.equal(p, before[name])]
    assert changed and set(changed) <= set(trainable)
    with trainer.policy.adapters_disabled():
        reference = trainer.policy.score(contexts, responses).logprobs
    adapted = trainer.policy.score(contexts, responses).logprobs
    expected = base.score(contexts, responses).logprobs
    for ref, exp, ada in zip(reference, expected, adapted, strict=True):
        assert torch.allclose(ref, exp, atol=1e-5)
        assert not torch.allclose(ada, exp, atol=1e-4)

    # The checkpoint holds adapters; `export` merges them into a plain checkpoint that scores the same.
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    assert (checkpoint / "model" / "adapter_model.safetensors").is_file()
    merged = Policy.from_pretrained(export(checkpoint, tmp_path / "merged"), device="cpu")
    assert not merged.has_adapters
    for a, b in zip(merged.score(contexts, responses).logprobs, adapted, strict=True):
        assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("{target_modules: [no_such_proj]}", "model.lora.target_modules"),
        ("{r: 0}", "model.lora.r"),
        ("{dropout: 1.5}", "model.lora.dropout"),
    ],
)
def test_bad_lora_settings_are_one_line_exit_2(tiny_vl_path, tmp_path, value, named):
    proc = _cli("train", f"model.path={tiny_vl_path}", "model.device=cpu", f"model.lora={value}",
                f"train.output_dir={tmp_path}", "logging.progress=false")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert named in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
