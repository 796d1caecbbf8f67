"""Losses against hand-computed values (DESIGN §1 stage 2 step 4)."""

from __future__ import annotations

import math

import pytest
import torch

from seed_vl.config import AlgorithmConfig, ConfigError
from seed_vl.losses import (
    group_advantages,
    k3_kl,
    opd_gate,
    policy_loss,
    ppo_dual_clip,
    resolve_preset,
    shaped_return,
)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_ppo_dual_clip_cases():
    # (advantage, ratio) -> expected per-token loss, with eps 0.2 and dual clip c = 3.
    cases = [
        (1.0, 1.5, -1.2, True, False),  # A > 0, ratio above 1 + eps: clipped
        (1.0, 0.5, -0.5, False, False),  # A > 0, ratio below 1 - eps: the pessimistic unclipped term wins
        (-1.0, 0.5, 0.8, True, False),  # A < 0, ratio below 1 - eps: clipped
        (-1.0, 2.0, 2.0, False, False),  # A < 0, ratio 2 < c: unclipped
        (-1.0, 5.0, 3.0, False, True),  # A < 0, ratio 5 > c: the dual clip caps it at -c * A
        (0.0, 5.0, 0.0, False, False),
    ]
    adv = torch.tensor([c[0] for c in cases])
    ratio = torch.tensor([c[1] for c in cases])
    loss, got_ratio, clipped, dual = ppo_dual_clip(ratio.log(), torch.zeros_like(ratio), adv, 0.2, 3.0)
    torch.testing.assert_close(loss, torch.tensor([c[2] for c in cases]))
    torch.testing.assert_close(got_ratio, ratio)
    assert clipped.tolist() == [c[3] for c in cases]
    assert dual.tolist() == [c[4] for c in cases]


def test_k3_kl_hand_values():
    logp = torch.tensor([math.log(0.5), -1.0, -1.0])
    ref = torch.tensor([0.0, -1.0, -2.0])  # ref - logp = ln 2, 0, -1
    expected = torch.tensor([2 - math.log(2) - 1, 0.0, math.exp(-1) + 1 - 1])
    torch.testing.assert_close(k3_kl(logp, ref), expected)


def test_opd_gate_hand_values():
    gate = opd_gate(torch.tensor([-2.0, -1.0, -1.0]), torch.tensor([-1.0, -2.0, -1.0]), beta=5.0)
    torch.testing.assert_close(gate, torch.tensor([sigmoid(5.0), sigmoid(-5.0), 0.5]))


def test_seed_loss_hand_computed():
    """Two sequences, 3 slots each; sequence 0 has a skill and 2 action tokens, sequence 1 has none."""
    config = AlgorithmConfig(preset="seed")
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool)
    logp = torch.tensor([[0.0, -2.0, -1.0], [0.0, -1.0, 0.0]])
    # Ratios: 1 and 1.5 for sequence 0, 2 for sequence 1.
    old = torch.tensor([[0.0, -2.0, -1.0 - math.log(1.5)], [0.0, -1.0 - math.log(2.0), 0.0]])
    teacher = torch.tensor([[0.0, -1.0, -2.0], [0.0, 0.0, 0.0]])
    ref = torch.tensor([[0.0, -2.0 + math.log(2.0), -1.0], [0.0, -1.0, 0.0]])
    entropy = torch.tensor([[9.0, 1.0, 2.0], [9.0, 3.0, 9.0]])
    adv = torch.tensor([1.0, -1.0])

    loss, metrics = policy_loss(
        logp, old, adv, mask, config, teacher_logprobs=teacher, has_skill=torch.tensor([True, False]),
        ref_logprobs=ref, entropy=entropy,
    )  # fmt: skip

    # -A*r per token: ratio 1.5 is clipped to 1.2; ratio 2 with A = -1 stays under the dual bound 3.
    pg = (-1.0 - 1.2 + 2.0) / 3
    kl = (2 - math.log(2) - 1) / 3
    ent = (1.0 + 2.0 + 3.0) / 3
    opd = (sigmoid(5.0) * 1.0 + sigmoid(-5.0) * -1.0) / 2  # only sequence 0's two tokens
    expected = pg + 0.01 * kl - 0.001 * ent + 0.01 * opd
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["pg_loss"].item() == pytest.approx(pg, abs=1e-6)
    assert metrics["kl"].item() == pytest.approx(kl, abs=1e-6)
    assert metrics["entropy"].item() == pytest.approx(ent, abs=1e-6)
    assert metrics["opd_loss"].item() == pytest.approx(opd, abs=1e-6)
    assert metrics["gate_mean"].item() == pytest.approx((sigmoid(5.0) + sigmoid(-5.0)) / 2, abs=1e-6)
    assert metrics["gate_open_frac"].item() == pytest.approx(0.5)
    assert metrics["clip_frac"].item() == pytest.approx(1 / 3)  # the ratio-1.5 token
    assert metrics["dual_clip_frac"].item() == 0.0
    assert all(not v.requires_grad for v in metrics.values())


def test_presets():
    assert resolve_preset(AlgorithmConfig(preset="grpo")).opd_coef == 0.0
    opsd = resolve_preset(AlgorithmConfig(preset="opsd", opd_coef=0.05))
    assert (opsd.opd_coef, opsd.use_gate, opsd.skill_source) == (0.05, False, "analyzer")
    seed = resolve_preset(AlgorithmConfig(preset="seed"))
    assert (seed.opd_coef, seed.use_gate, seed.skill_source) == (0.01, True, "analyzer")
    sdar = resolve_preset(AlgorithmConfig(preset="sdar", skill_bank="configs/skill_bank.yaml"))
    assert (sdar.use_gate, sdar.skill_source) == (True, "bank")
    with pytest.raises(ConfigError, match="algorithm.skill_bank"):
        resolve_preset(AlgorithmConfig(preset="sdar"))


def _batch(seed: int = 0, batch: int = 4, length: int = 6) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, length, generator=gen) > 0.3
    mask[:, 0] = True
    return {
        "logprobs": -torch.rand(batch, length, generator=gen) * 3,
        "old_logprobs": -torch.rand(batch, length, generator=gen) * 3,
        "advantages": torch.randn(batch, generator=gen),
        "action_mask": mask,
        "teacher_logprobs": -torch.rand(batch, length, generator=gen) * 3,
        "has_skill": torch.tensor([True, False, True, True])[:batch],
        "ref_logprobs": -torch.rand(batch, length, generator=gen) * 3,
        "entropy": torch.rand(batch, length, generator=gen),
    }


def test_grpo_ignores_teacher_and_opsd_differs_from_seed_only_by_the_gate():
    b = _batch()
    grpo_loss, grpo_metrics = policy_loss(config=AlgorithmConfig(preset="grpo"), **b)
    assert "opd_loss" not in grpo_metrics
    no_teacher = {k: v for k, v in b.items() if k not in ("teacher_logprobs", "has_skill")}
    torch.testing.assert_close(policy_loss(config=AlgorithmConfig(preset="grpo"), **no_teacher)[0], grpo_loss)
    with pytest.raises(ValueError, match="teacher_logprobs"):
        policy_loss(config=AlgorithmConfig(preset="seed"), **no_teacher)

    _, opsd = policy_loss(config=AlgorithmConfig(preset="opsd"), **b)
    _, seed = policy_loss(config=AlgorithmConfig(preset="seed"), **b)
    assert opsd["gate_mean"].item() == pytest.approx(1.0)
    skill_mask = b["action_mask"] & b["has_skill"][:, None]
    delta = (b["teacher_logprobs"] - b["logprobs"])[skill_mask]
    assert opsd["opd_loss"].item() == pytest.approx(delta.mean().item(), abs=1e-6)
    assert seed["opd_loss"].item() == pytest.approx(
        (torch.sigmoid(5 * delta) * delta).mean().item(), abs=1e-6
    )


def test_only_action_tokens_count():
    """Whatever sits in prompt/padding positions (even inf and nan) changes neither loss nor gradients."""
    b = _batch()
    dirty = {k: v.clone() for k, v in b.items()}
    outside = ~b["action_mask"]
    for key, junk in [("logprobs", -math.inf), ("old_logprobs", math.nan), ("teacher_logprobs", 50.0),
                      ("ref_logprobs", math.inf), ("entropy", 1e6)]:  # fmt: skip
        dirty[key][outside] = junk
    config = AlgorithmConfig(preset="seed")
    losses, grads = [], []
    for inputs in (b, dirty):
        logprobs = inputs["logprobs"].clone().requires_grad_(True)
        loss, _ = policy_loss(config=config, **{**inputs, "logprobs": logprobs})
        loss.backward()
        losses.append(loss)
        grads.append(logprobs.grad)
    torch.testing.assert_close(losses[1], losses[0])
    torch.testing.assert_close(grads[1], grads[0])
    assert (grads[0][outside] == 0).all()


def test_micro_batches_sum_to_the_mini_batch_with_global_token_counts():
    b = _batch(seed=1)
    config = AlgorithmConfig(preset="seed")
    full, full_metrics = policy_loss(config=config, **b)
    num_tokens = float(b["action_mask"].sum())
    num_skill_tokens = float((b["action_mask"] & b["has_skill"][:, None]).sum())
    parts = [
        policy_loss(
            config=config,
            num_tokens=num_tokens,
            num_skill_tokens=num_skill_tokens,
            **{k: v[rows] for k, v in b.items()},
        )
        for rows in (slice(0, 1), slice(1, 4))
    ]
    torch.testing.assert_close(sum(p[0] for p in parts), full)
    for name, value in full_metrics.items():
        torch.testing.assert_close(sum(p[1][name] for p in parts), value, msg=name)


def test_gradients_reach_only_the_student():
    """Old, teacher and reference scores, advantages and the gate are constants; the OPD gradient on a
    sampled token is the gate-weighted NLL gradient -lambda * g / N (DESIGN §1 stage 2 step 4)."""
    b = _batch(seed=2)
    leaves = {k: v.clone().requires_grad_(True) for k, v in b.items() if v.is_floating_point()}
    config = AlgorithmConfig(preset="seed")
    loss, _ = policy_loss(config=config, **{**b, **leaves})
    loss.backward()
    assert leaves["logprobs"].grad is not None and leaves["logprobs"].grad.abs().sum() > 0
    assert leaves["entropy"].grad is not None  # the entropy bonus is the student's own entropy
    for name in ("old_logprobs", "teacher_logprobs", "ref_logprobs", "advantages"):
        assert leaves[name].grad is None, name

    # OPD alone: zero advantages, no KL/entropy terms.
    logprobs = b["logprobs"].clone().requires_grad_(True)
    opd_only = {
        **b,
        "logprobs": logprobs,
        "advantages": torch.zeros(4),
        "ref_logprobs": None,
        "entropy": None,
    }
    policy_loss(config=config, **opd_only)[0].backward()
    skill_mask = b["action_mask"] & b["has_skill"][:, None]
    gate = torch.sigmoid(5 * (b["teacher_logprobs"] - b["logprobs"]))
    expected = torch.where(skill_mask, -config.opd_coef * gate / skill_mask.sum(), torch.zeros_like(gate))
    torch.testing.assert_close(logprobs.grad, expected)


def test_group_advantages_hand_values():
    returns = [1.0, 0.0, 0.0, 1.0, 0.1, 0.1, 0.1, 3.0]
    groups = [7, 7, 7, 7, 2, 2, 2, 9]  # ids need not be contiguous or sorted
    adv = group_advantages(returns, groups, eps=1e-6)
    std = math.sqrt(4 * 0.25 / 3) + 1e-6  # unbiased std of {1, 0, 0, 1}
    expected = [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv, torch.tensor(expected))
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages([1.0, 2.0], [0], eps=1e-6)


def test_shaped_return_subtracts_per_invalid_action():
    assert shaped_return(10.0, num_invalid=3, penalty=0.1) == pytest.approx(9.7)
    assert shaped_return(-1.5, num_invalid=0, penalty=0.1) == -1.5


def test_bad_shapes_name_the_input():
    b = _batch()
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(config=AlgorithmConfig(preset="grpo"), **{**b, "advantages": torch.zeros(3)})
    with pytest.raises(ValueError, match="action_mask"):
        policy_loss(config=AlgorithmConfig(preset="grpo"), **{**b, "old_logprobs": torch.zeros(4, 5)})
