"""RL objective of stage 2 (DESIGN §1 stage 2 step 4): GRPO advantages, PPO clip with dual clip, k3 KL to
the reference, entropy bonus and the gated on-policy distillation (OPD) term.

Everything works on padded `[B, T]` per-token tensors aligned with an action mask: only the tokens the
policy sampled as its response count; prompt, observation and padding tokens never enter a mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from seed_vl.config import AlgorithmConfig, ConfigError

SkillSource = Literal["none", "analyzer", "bank"]

# verl's low-variance KL guards: the log-ratio and the k3 value are clamped so one outlier token cannot
# produce an inf; in the normal range (|log-ratio| < 20, k3 < 10) nothing changes.
_KL_LOG_RATIO_CLAMP = 20.0
_KL_VALUE_CLAMP = 10.0


@dataclass(frozen=True)
class Preset:
    """What a preset changes in the objective (DESIGN §1, "Baselines in the same trainer")."""

    opd_coef: float  # lambda; 0 turns the OPD term off
    use_gate: bool  # False: g = 1 on every token (GRPO+OPSD)
    skill_source: SkillSource  # where the teacher context's skill comes from


def resolve_preset(config: AlgorithmConfig) -> Preset:
    """grpo: lambda 0; opsd: no gate; sdar: gated, static skill bank; seed: gated, the self analyzer."""
    if config.preset == "grpo":
        return Preset(opd_coef=0.0, use_gate=False, skill_source="none")
    if config.preset == "opsd":
        return Preset(opd_coef=config.opd_coef, use_gate=False, skill_source="analyzer")
    if config.preset == "sdar":
        if not config.skill_bank:
            raise ConfigError("algorithm.skill_bank: preset 'sdar' needs a skill bank file (YAML/JSON)")
        return Preset(opd_coef=config.opd_coef, use_gate=True, skill_source="bank")
    return Preset(opd_coef=config.opd_coef, use_gate=True, skill_source="analyzer")


def shaped_return(episode_return: float, num_invalid: int, penalty: float) -> float:
    """The return GRPO sees: `penalty` is subtracted once per invalid action (DESIGN §1 stage 2 step 4).

    The trainer applies it to every trajectory before `group_advantages`; environments' own step rewards
    (e.g. Sokoban's -0.1 for a bad move) are already inside `episode_return` and are not touched.
    """
    return episode_return - penalty * num_invalid


def group_advantages(
    returns: torch.Tensor | Sequence[float], group_ids: torch.Tensor | Sequence[int], eps: float
) -> torch.Tensor:
    """GRPO outcome advantages `A = (R - mean_group(R)) / (std_group(R) + eps)` (DESIGN §1 stage 2 step 4).

    `std` is the unbiased (n - 1) estimate, as `torch.std` in verl's GRPO. A group of identical returns
    gets advantage 0, and so does a group of one (it has nothing to be compared with).
    """
    returns = torch.as_tensor(returns, dtype=torch.float64)
    group_ids = torch.as_tensor(group_ids)
    if returns.ndim != 1 or returns.shape != group_ids.shape:
        raise ValueError(
            f"returns {tuple(returns.shape)} and group_ids {tuple(group_ids.shape)} must be 1-D, same length"
        )
    _, member_of = torch.unique(group_ids, return_inverse=True)
    num_groups = int(member_of.max()) + 1 if len(member_of) else 0
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, member_of, torch.ones_like(returns))
    mean = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, member_of, returns) / count
    centered = returns - mean[member_of]
    sq_sum = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, member_of, centered**2)
    std = (sq_sum / (count - 1).clamp(min=1)).sqrt()
    return (centered / (std[member_of] + eps)).float()


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    config: AlgorithmConfig,
    *,
    teacher_logprobs: torch.Tensor | None = None,
    has_skill: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_skill_tokens: float | None = None,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss `L = L_grpo + lambda * L_opd` and detached metrics (DESIGN §1 stage 2 step 4); the policy-
    gradient part of `L_grpo` is weighted by `pg_coef` (1, except in the distillation-only diagnostic).

    Per-token inputs are `[B, T]`: `logprobs` (student, ordinary context: the only input gradients flow
    through, with `entropy`), `old_logprobs` (l_old), `teacher_logprobs` (l_skill), `ref_logprobs` (l_ref),
    `entropy` (of the student's distribution), `rollout_logprobs` (the sampler's own, l_rollout);
    `advantages` and `has_skill` are per sequence `[B]` (`has_skill=None`: every sequence has a skill).

    Off-policy guard: with `config.rollout_is_cap` set and `rollout_logprobs` given, each token's policy-
    gradient term is weighted by the truncated importance ratio `min(exp(l_old - l_rollout), cap)` (the
    sampler, e.g. vLLM, and the trainer disagree slightly on the same weights).

    Token-mean normalisers: `num_tokens` is the number of action tokens of the whole mini-batch (PG, KL,
    entropy); `num_skill_tokens` those of its sequences with a skill (OPD). With gradient accumulation the
    trainer passes both mini-batch totals, so the micro-batch losses and metrics *sum* to the mini-batch
    value; left at None they are this call's own counts (a plain token-mean).
    """
    preset = resolve_preset(config)
    mask = action_mask.to(torch.bool)
    if mask.ndim != 2:
        raise ValueError(f"action_mask must be [B, T], got {tuple(mask.shape)}")
    if advantages.shape != mask.shape[:1]:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be per sequence: ({mask.shape[0]},)")
    if num_tokens is None:
        num_tokens = float(mask.sum())
    # Zero the non-action positions up front: padding may hold inf/nan scores, which would otherwise turn
    # into nan gradients through exp() even though those tokens are excluded from every mean.
    logprobs = _action_tokens(logprobs, mask)
    old_logprobs = _action_tokens(old_logprobs.detach(), mask)

    adv = advantages.detach().float()[:, None].expand_as(logprobs)
    pg, ratio, clipped, dual_clipped = ppo_dual_clip(
        logprobs, old_logprobs, adv, config.clip_eps, config.dual_clip
    )
    is_weight = None
    if config.rollout_is_cap is not None and rollout_logprobs is not None:
        rollout = _action_tokens(rollout_logprobs.detach(), mask)
        is_weight = torch.exp(old_logprobs - rollout).clamp(max=config.rollout_is_cap)
        pg = pg * is_weight
    pg_loss = _token_mean(pg, mask, num_tokens)
    loss = config.pg_coef * pg_loss
    metrics = {
        "pg_loss": pg_loss,
        "clip_frac": _token_mean(clipped.float(), mask, num_tokens),
        "dual_clip_frac": _token_mean(dual_clipped.float(), mask, num_tokens),
        "ratio": _token_mean(ratio, mask, num_tokens),
    }
    if is_weight is not None:
        metrics["rollout_is_weight"] = _token_mean(is_weight, mask, num_tokens)
        metrics["rollout_is_capped_frac"] = _token_mean(
            (is_weight >= config.rollout_is_cap).float(), mask, num_tokens
        )
    if ref_logprobs is not None:
        kl = _token_mean(k3_kl(logprobs, _action_tokens(ref_logprobs.detach(), mask)), mask, num_tokens)
        loss = loss + config.kl_coef * kl
        metrics["kl"] = kl
    if entropy is not None:
        mean_entropy = _token_mean(_action_tokens(entropy, mask), mask, num_tokens)
        loss = loss - config.entropy_coef * mean_entropy
        metrics["entropy"] = mean_entropy

    if preset.opd_coef > 0:
        if teacher_logprobs is None:
            raise ValueError(f"preset '{config.preset}' needs teacher_logprobs (the skill-context scores)")
        skill_mask = mask if has_skill is None else mask & has_skill.to(torch.bool)[:, None]
        if num_skill_tokens is None:
            num_skill_tokens = float(skill_mask.sum())
        teacher = _action_tokens(teacher_logprobs.detach(), mask)
        gate = opd_gate(logprobs, teacher, config.gate_beta) if preset.use_gate else torch.ones_like(teacher)
        # L_opd = mean(g * (sg(l_skill) - l_theta)) over the action tokens of sequences with a skill.
        opd_loss = _token_mean(gate * (teacher - logprobs), skill_mask, num_skill_tokens)
        loss = loss + preset.opd_coef * opd_loss
        metrics["opd_loss"] = opd_loss
        metrics["gate_mean"] = _token_mean(gate, skill_mask, num_skill_tokens)
        metrics["gate_open_frac"] = _token_mean((gate > 0.5).float(), skill_mask, num_skill_tokens)

    metrics = {name: value.detach() for name, value in metrics.items()}
    metrics["loss"] = loss.detach()
    return loss, metrics


def ppo_dual_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    dual_clip: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss with dual clip, as verl's `compute_policy_loss`; also the ratio and where each clip bit.

    `max(-A r, -A clip(r, 1-eps, 1+eps))`, and for A < 0 additionally capped at `-c A`, so a token whose
    ratio exploded cannot dominate a negative update.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * dual_clip
    dual_clipped = (advantages < 0) & (loss > dual_bound)
    loss = torch.where(dual_clipped, dual_bound, loss)
    return loss, ratio, clipped > unclipped, dual_clipped


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref): `exp(l_ref - l) - (l_ref - l) - 1`, always >= 0."""
    log_ratio = (ref_logprobs - logprobs).clamp(-_KL_LOG_RATIO_CLAMP, _KL_LOG_RATIO_CLAMP)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(max=_KL_VALUE_CLAMP)


def opd_gate(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float) -> torch.Tensor:
    """`g = sigmoid(beta * sg(l_skill - l_theta))`: open where the skill makes the sampled token likelier.

    Detached: the gate only weights the distillation term, it is never trained itself.
    """
    return torch.sigmoid(beta * (teacher_logprobs - logprobs).detach())


def _action_tokens(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if values.shape != mask.shape:
        raise ValueError(f"per-token input {tuple(values.shape)} must match action_mask {tuple(mask.shape)}")
    return values.float().masked_fill(~mask, 0.0)


def _token_mean(values: torch.Tensor, mask: torch.Tensor, num_tokens: float) -> torch.Tensor:
    """Sum over action tokens / `num_tokens` (the token-mean normaliser, see `policy_loss`)."""
    return (values * mask).sum() / max(num_tokens, 1.0)
