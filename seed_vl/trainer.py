"""The SEED trainer: one update step reads top to bottom like DESIGN §1 stage 2.

    1. actor      the frozen current policy plays G episodes per task            (rollout.collect_rollouts)
    2. analyzer   the same frozen policy writes one hindsight skill per episode  (analyzer.Analyzer)
    3. re-score   old / skill-augmented teacher / reference log-probs, batched   (Policy.score, skills.insert_skill)
    4. update     GRPO + lambda * gated OPD on the student's log-probs           (losses.policy_loss)

Baselines are the same loop with another preset: grpo (lambda = 0), opsd (gate = 1), sdar (skills from a
static bank), seed. Runs under `accelerate launch` (`distributed.Runtime`: one device, DDP or FSDP2): each
process plays whole groups of its share of the tasks, gradients are averaged once per optimizer step, metrics
are reduced, only the main process writes files.
"""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed

from seed_vl import checkpoint as ckpt
from seed_vl.analyzer import make_analyzer
from seed_vl.config import Config, ConfigError, TrainConfig, save_config
from seed_vl.distributed import Runtime
from seed_vl.envs.group import EnvGroup
from seed_vl.evaluation import episode_stats, evaluate
from seed_vl.losses import group_advantages, opd_gate, policy_loss, resolve_preset, shaped_return
from seed_vl.policy import Policy
from seed_vl.rollout import SamplingSettings, collect_rollouts, save_trajectories
from seed_vl.skills import insert_skill, load_skill_bank
from seed_vl.tracking import MetricsLogger, Phase
from seed_vl.trajectory import Trajectory, Turn


class NonFiniteError(RuntimeError):
    """Too many non-finite losses or gradients in a row: the run stops after checkpointing the last good state."""


@dataclass
class ActionSample:
    """One turn's sampled response, the unit of scoring, with its trajectory's advantage and skill, and the
    per-token log-probs step 3 gives it at the rollout weights: l_old always, l_skill only when it has a
    skill (and the preset distils), l_ref only when the KL term is on."""

    turn: Turn
    advantage: float
    skill: str | None
    episode: int = 0  # its trajectory's index in the batch
    old_logprobs: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None

    @property
    def rollout_logprobs(self) -> torch.Tensor | None:
        """The sampler's log-probs of the response (None when the actor reported none)."""
        values = self.turn.rollout_logprobs
        if values is None or self.old_logprobs is None:
            return None
        return torch.tensor(values, dtype=self.old_logprobs.dtype, device=self.old_logprobs.device)

    @property
    def context(self) -> list[dict[str, Any]]:
        return self.turn.context

    @property
    def response_ids(self) -> list[int]:
        return self.turn.response_ids


def run_finished(train: TrainConfig, step: int, env_steps: int) -> bool:
    """A run stops after `train.steps` updates, or once `train.env_step_budget` environment steps are spent."""
    return step >= train.steps or bool(train.env_step_budget and env_steps >= train.env_step_budget)


def run_dir_for(config: Config) -> Path:
    name = config.train.run_name or f"{config.algorithm.preset}-{config.env.name}-seed{config.train.seed}"
    return Path(config.train.output_dir) / name


class Trainer:
    def __init__(self, config: Config, resume: str | None = None, overwrite: bool = False) -> None:
        """`resume`: a run directory or checkpoint to continue from. Otherwise the run directory must be empty
        or absent, unless `overwrite` (its old contents are deleted): two runs never share one."""
        self.config = config
        self.preset = resolve_preset(config.algorithm)  # validates the preset before anything is loaded
        self.runtime = Runtime(cpu=config.model.device == "cpu")
        self.is_main = self.runtime.is_main
        self.run_dir = run_dir_for(config)
        set_seed(config.train.seed, device_specific=False)

        self.resume_from = ckpt.resolve_resume(resume) if resume else None
        if self.resume_from is None:
            self._claim_run_dir(overwrite)
        # The trainable policy starts from the base weights; a resume then restores its float32 weights.
        self.policy = self._load_policy(trainable=True)
        # The reference policy exists only when the KL term does. Under LoRA it is the policy with its
        # adapters disabled; otherwise a frozen copy in the compute dtype, sharing the image cache when
        # both vision towers are the same frozen weights.
        self.reference = None
        if config.algorithm.kl_coef > 0 and config.model.lora is None:
            self.reference = self._load_policy(trainable=False, shared_cache=config.model.freeze_vision_tower)
        self.skill_bank = load_skill_bank(config.algorithm.skill_bank) if self.preset.skill_source == "bank" else None
        self.analyzer = (
            make_analyzer(config.analyzer, config.env, policy=self.policy, seed=config.train.seed)
            if self.preset.skill_source == "analyzer"
            else None
        )
        if self.runtime.is_fsdp and config.rollout.num_tasks < self.runtime.num_processes:
            raise ConfigError(
                f"rollout.num_tasks: {config.rollout.num_tasks} tasks for {self.runtime.num_processes} FSDP2 "
                "processes; each process needs at least one"
            )
        self.optimizer, self.scheduler = self.runtime.prepare(
            self.policy, lr=config.train.lr, weight_decay=config.train.weight_decay,
            warmup_steps=config.train.warmup_steps,
        )

        self._timings: dict[str, float] = {}  # seconds per phase of the current step
        counters = {"nonfinite_skipped": 0, "nonfinite_in_a_row": 0, "env_steps": 0}
        self.state = ckpt.TrainerState(step=0, metrics=[], counters=counters)
        if self.resume_from:
            self.state = ckpt.load_checkpoint(self.resume_from, self.runtime, self.optimizer, self.scheduler)
            self.policy.on_weights_updated()
        self.logger = MetricsLogger(
            self.run_dir,
            config,
            enabled=self.is_main,
            use_wandb=config.logging.wandb,
            project=config.logging.wandb_project,
            run_name=self.run_dir.name,
        )
        if self.is_main:
            save_config(config, self.run_dir / "config.yaml")
            if self.resume_from:  # steps after the checkpoint will be logged again: keep only those before it
                self.logger.rewrite(self.state.metrics)

    def _claim_run_dir(self, overwrite: bool) -> None:
        if self.run_dir.is_dir() and any(self.run_dir.iterdir()):
            if not overwrite:
                raise ConfigError(
                    f"{self.run_dir} already holds a run: pass --resume {self.run_dir} to continue it, "
                    "--overwrite to replace it, or set train.run_name"
                )
            self.runtime.wait_for_everyone()  # every process has looked before the main one deletes
            if self.is_main:
                shutil.rmtree(self.run_dir)
        self.runtime.wait_for_everyone()

    def _load_policy(self, trainable: bool, shared_cache: bool = False) -> Policy:
        model_config = self.config.model.model_copy(update={"device": str(self.runtime.device)})
        return Policy.from_config(
            model_config,
            trainable=trainable,
            vision_cache=self.policy.cache if shared_cache else None,
            seed=self.config.train.seed,
            generation=self.config.generation if trainable else None,  # the reference never samples
        )

    # ------------------------------------------------------------------------------------------------ loop
    def train(self) -> list[dict[str, Any]]:
        cfg = self.config
        if self.state.step == 0 and cfg.eval.num_tasks:
            self._log(0, self.evaluate(prefix="eval"))
        step = self.state.step
        while not self._finished(step):
            step += 1
            metrics = self.train_step(step)
            last = self._finished(step)
            if (cfg.eval.every and step % cfg.eval.every == 0) or last:
                metrics.update(self.evaluate(prefix="eval"))
            self.state.step = step
            self._log(step, metrics)
            in_a_row = self.state.counters["nonfinite_in_a_row"]
            if in_a_row >= cfg.train.max_nonfinite_in_a_row:
                self.save_checkpoint(step)
                raise NonFiniteError(
                    f"{in_a_row} non-finite updates in a row at step {step}; "
                    f"the last good weights are in {self.run_dir / 'checkpoints'}"
                )
            if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or last:
                self.save_checkpoint(step)
        self.logger.close()
        return self.state.metrics

    def _finished(self, step: int) -> bool:
        return run_finished(self.config.train, step, self.state.counters["env_steps"])

    def train_step(self, step: int) -> dict[str, float]:
        self._timings = {}
        return self.learn(step, self.rollout(step))

    def rollout(self, step: int) -> list[Trajectory]:
        """1. Actor: the frozen current policy plays `group_size` episodes per task (same start in a group)."""
        group = self._env_group(step, split="train")
        with self._phase(step, "rollout", len(group), "episodes") as bar, self.runtime.full_weights():
            return collect_rollouts(
                self.policy, group, self._sampling(self.config.rollout.temperature),
                seed=self.config.train.seed, step=step, on_episode_end=bar.update,
            )

    def learn(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        """Steps 2-4 on one batch of trajectories; returns the step's metrics."""
        # 2. Analyzer: one hindsight skill per trajectory (SEED, OPSD) or a static skill (SDAR).
        with self._phase(step, "analysis", len(trajectories), "trajectories") as bar, self.runtime.full_weights():
            self._attach_skills(trajectories, step)
            bar.update(len(trajectories))

        # 3. Paired re-scoring: l_old (ordinary context) and l_skill (skill inserted), l_ref when KL > 0.
        self.policy.generation_backend.sleep()  # no sampling until the next step: a vLLM engine frees the GPU
        samples = self._action_samples(trajectories)
        with self._phase(step, "scoring", len(samples), "actions") as bar, self.runtime.full_weights():
            self._paired_scores(samples)
            bar.update(len(samples))
        self._record_gates(samples)
        gap_metrics = self._logprob_gap_metrics(samples)
        if self.is_main:
            save_trajectories(
                trajectories, self.run_dir / "trajectories" / f"step_{step:06d}", tokenizer=self.policy.tokenizer
            )

        # 4. Update: GRPO + lambda * gated OPD, token-mean over action tokens, gradients on the student only.
        with self._phase(step, "update", None, "mini-batches") as bar:
            loss_metrics = self._update(samples, on_minibatch=bar.update)
        cache_metrics = self._cache_metrics()
        self.policy.on_weights_updated()  # cached image embeddings belong to the old weights

        self.state.counters["env_steps"] += self.runtime.reduce_sum(sum(t.length for t in trajectories))
        metrics = {
            **self._rollout_metrics(trajectories, prefix="train"),
            **loss_metrics,
            **gap_metrics,
            **cache_metrics,
            **self._timings,
            "env_steps": self.state.counters["env_steps"],
            "nonfinite_skipped": self.state.counters["nonfinite_skipped"],
        }
        return metrics

    # ------------------------------------------------------------------------------------------- phases
    def _env_group(self, step: int, split: str, num_tasks: int | None = None, group_size: int | None = None):
        """This process's share of the step's tasks; whole groups stay on one process."""
        cfg = self.config
        num_tasks = num_tasks or cfg.rollout.num_tasks
        rank, world = self.runtime.process_index, self.runtime.num_processes
        tasks = [t for t in range(num_tasks) if t % world == rank]
        return EnvGroup(
            cfg.env, num_tasks=num_tasks, group_size=group_size or cfg.rollout.group_size,
            split=split, step=step, task_indices=tasks,
        )

    def _sampling(self, temperature: float) -> SamplingSettings:
        return SamplingSettings.from_config(self.config.rollout, temperature=temperature)

    def _attach_skills(self, trajectories: list[Trajectory], step: int) -> None:
        if self.preset.skill_source == "analyzer":
            self.analyzer.analyze(trajectories, step=step)
        elif self.preset.skill_source == "bank":
            for traj in trajectories:
                traj.skill = self.skill_bank.skill_for(traj.env_name)
                traj.analyzer_status = "ok" if traj.skill else "no_skill"

    def _action_samples(self, trajectories: list[Trajectory]) -> list[ActionSample]:
        a = self.config.algorithm
        returns = [shaped_return(t.episode_return, t.invalid_actions, a.invalid_action_penalty) for t in trajectories]
        advantages = group_advantages(
            torch.tensor(returns), torch.tensor([t.group_id for t in trajectories]), eps=a.adv_eps
        ).tolist()
        return [
            ActionSample(turn, advantages[i], traj.skill, episode=i)
            for i, traj in enumerate(trajectories)
            for turn in traj.turns
            if turn.response_ids
        ]

    @torch.no_grad()
    def _paired_scores(self, samples: list[ActionSample]) -> None:
        """Ordinary and skill-augmented contexts share padded batches and the image-embedding cache."""
        mb, temperature = self.config.train.micro_batch_size, self.config.rollout.temperature
        responses = [s.response_ids for s in samples]
        if self.config.algorithm.old_logprobs == "sampler":  # l_old = the sampler's own log-probs
            for sample in samples:
                if sample.turn.rollout_logprobs is not None:
                    sample.old_logprobs = torch.tensor(sample.turn.rollout_logprobs, device=self.policy.device)
        rescore = [s for s in samples if s.old_logprobs is None]
        with_skill = [s for s in samples if s.skill and self.preset.opd_coef > 0]
        scored = self.policy.score(
            [s.context for s in rescore] + [insert_skill(s.context, s.skill) for s in with_skill],
            [s.response_ids for s in rescore + with_skill],
            micro_batch_size=mb, return_entropy=False, temperature=temperature,
        ).logprobs
        for sample, logprobs in zip(rescore + with_skill, scored, strict=True):
            if sample.old_logprobs is None:
                sample.old_logprobs = logprobs
            else:
                sample.teacher_logprobs = logprobs
        if self.config.algorithm.kl_coef > 0:
            reference = self.reference or self.policy  # LoRA: the policy with its adapters disabled
            with nullcontext() if self.reference else self.policy.adapters_disabled():
                scored = reference.score(
                    [s.context for s in samples], responses, micro_batch_size=mb, return_entropy=False,
                    temperature=temperature,
                ).logprobs
            for sample, logprobs in zip(samples, scored, strict=True):
                sample.ref_logprobs = logprobs

    def _record_gates(self, samples: list[ActionSample]) -> None:
        """The OPD gate of every action token at the rollout weights (where the update starts), for reports."""
        if not self.preset.opd_coef:
            return
        beta = self.config.algorithm.gate_beta
        for sample in samples:
            if sample.teacher_logprobs is not None:
                old, teacher = sample.old_logprobs, sample.teacher_logprobs
                gate = opd_gate(old, teacher, beta) if self.preset.use_gate else torch.ones_like(old)
                sample.turn.gates = gate.tolist()

    def _logprob_gap_metrics(self, samples: list[ActionSample]) -> dict[str, float]:
        """|l_old - l_rollout| over the action tokens whose sampler reported log-probs, mean and max over
        every process: how far the sampling engine is from the trainer on the same weights (nothing to
        compare when l_old is the sampler's)."""
        if self.config.algorithm.old_logprobs == "sampler":
            return {}
        gaps = [(s.old_logprobs - s.rollout_logprobs).abs() for s in samples if s.rollout_logprobs is not None]
        gaps = [g for g in gaps if len(g)]
        total = float(sum(g.sum() for g in gaps)) if gaps else 0.0
        count = sum(len(g) for g in gaps)
        largest = max((float(g.max()) for g in gaps), default=0.0)
        mean = self.runtime.reduce_mean_pairs({"rollout/logprob_gap_mean": (total, count)})
        largest = self.runtime.reduce_max(largest)
        if not self.runtime.reduce_sum(count):
            return {}
        return {**mean, "rollout/logprob_gap_max": largest}

    @contextmanager
    def _phase(self, step: int, name: str, total: int | None, unit: str) -> Iterator[Phase]:
        """A progress bar for one phase; its seconds land in the step's `time/<name>` metric."""
        with Phase(f"step {step} {name}", total, unit, enabled=self.is_main and self.config.logging.progress) as bar:
            yield bar
        self._timings[f"time/{name}"] = bar.seconds

    def _update(self, samples: list[ActionSample], on_minibatch) -> dict[str, float]:
        cfg, runtime = self.config, self.runtime
        generator = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + self.state.step)
        mb = cfg.train.mini_batch_size
        # Processes hold different numbers of turns; all take the same number of optimizer steps (some
        # mini-batches may be empty), accumulating locally and averaging gradients once per step.
        num_minibatches = int(runtime.reduce_max(math.ceil(len(samples) / mb)))
        totals: dict[str, float] = {}
        for _ in range(cfg.train.ppo_epochs):
            order = self._minibatch_order(samples, generator)
            for k in range(num_minibatches):
                batch = order[k * mb : (k + 1) * mb]
                loss_sum, stats = self._accumulate_gradients([samples[i] for i in batch], filler=samples[:1])
                grad_norm, applied = runtime.optimizer_step(
                    self.optimizer, self.scheduler, loss_sum, cfg.train.max_grad_norm
                )
                if applied:
                    self.state.counters["nonfinite_in_a_row"] = 0
                else:  # the weights stay the last good ones
                    self.state.counters["nonfinite_skipped"] += 1
                    self.state.counters["nonfinite_in_a_row"] += 1
                    if self.is_main:
                        print(f"[seed-vl] step {self.state.step + 1}: non-finite loss or gradient "
                              f"(loss {loss_sum}, grad norm {grad_norm}), update skipped", file=sys.stderr)
                on_minibatch()
                for key, value in {"grad_norm": grad_norm, **stats}.items():
                    totals[key] = totals.get(key, 0.0) + value
        # Per optimizer step, averaged over steps: each process holds its share of the token-mean loss terms
        # (the shares add up over processes) and the same global gradient norm.
        steps = num_minibatches * cfg.train.ppo_epochs
        pairs = {key: (value, steps / runtime.num_processes) for key, value in totals.items()}
        if "grad_norm" in totals:
            pairs["grad_norm"] = (totals["grad_norm"], steps)
        return runtime.reduce_mean_pairs(pairs)

    def _minibatch_order(self, samples: list[ActionSample], generator: torch.Generator) -> list[int]:
        """A random order of the samples; in episode mode of whole episodes, each in turn order, so that
        a micro-batch scores an episode's turns as one sequence."""
        if self.config.rollout.history_window != "episode":
            return torch.randperm(len(samples), generator=generator).tolist()
        episodes: dict[int, list[int]] = {}
        for k, sample in enumerate(samples):
            episodes.setdefault(sample.episode, []).append(k)
        blocks = list(episodes.values())
        return [k for b in torch.randperm(len(blocks), generator=generator).tolist() for k in blocks[b]]

    def _accumulate_gradients(
        self, batch: list[ActionSample], filler: list[ActionSample]
    ) -> tuple[float, dict[str, float]]:
        """Backward of one mini-batch, micro-batch by micro-batch; returns its loss and metrics."""
        cfg, runtime = self.config, self.runtime
        # Token-mean over the mini-batch of every process together: processes average their gradients, so
        # each scales its share by their number (a process with fewer or no tokens weighs accordingly).
        num_tokens = runtime.reduce_sum(sum(len(s.response_ids) for s in batch))
        num_skill_tokens = runtime.reduce_sum(
            sum(len(s.response_ids) for s in batch if s.teacher_logprobs is not None)
        )
        loss_sum, stats_sum = 0.0, {}
        # Under FSDP2 a process out of micro-batches runs zero-weight passes over `filler`.
        for rows, weight in runtime.micro_batches(batch, cfg.train.micro_batch_size, filler=filler):
            with self.policy.update_mode():
                scores = self.policy.score(
                    [s.context for s in rows], [s.response_ids for s in rows],
                    micro_batch_size=len(rows), with_grad=True, temperature=cfg.rollout.temperature,
                )
                logprobs, mask = pad_sequences(scores.logprobs)
                device = logprobs.device
                has_skill = [s.teacher_logprobs is not None for s in rows]
                loss, stats = policy_loss(
                    logprobs,
                    pad_sequences([s.old_logprobs for s in rows])[0],
                    torch.tensor([s.advantage for s in rows], device=device),
                    mask,
                    cfg.algorithm,
                    # Rows without a skill carry l_old as a placeholder that `has_skill` masks out.
                    teacher_logprobs=pad_sequences(
                        [s.old_logprobs if s.teacher_logprobs is None else s.teacher_logprobs for s in rows]
                    )[0],
                    has_skill=torch.tensor(has_skill, device=device),
                    ref_logprobs=pad_sequences([s.ref_logprobs for s in rows])[0]
                    if cfg.algorithm.kl_coef > 0
                    else None,
                    entropy=pad_sequences(scores.entropies)[0],
                    num_tokens=num_tokens,
                    num_skill_tokens=num_skill_tokens,
                    # Rows whose sampler reported no log-probs carry l_old: importance weight 1.
                    rollout_logprobs=pad_sequences(
                        [s.old_logprobs if s.rollout_logprobs is None else s.rollout_logprobs for s in rows]
                    )[0]
                    if cfg.algorithm.rollout_is_cap is not None
                    else None,
                )
                runtime.backward(loss, weight)
            if weight:
                loss_sum += loss.item()
                for key, value in stats.items():
                    stats_sum[key] = stats_sum.get(key, 0.0) + float(value)
        return runtime.reduce_sum(loss_sum), stats_sum

    # ------------------------------------------------------------------------------------------ metrics
    def evaluate(self, prefix: str = "eval") -> dict[str, float]:
        cfg = self.config
        group = self._env_group(self.state.step, split="eval", num_tasks=cfg.eval.num_tasks, group_size=1)
        with self.runtime.full_weights():
            metrics = evaluate(
                self.policy, group, self._sampling(cfg.eval.temperature),
                seed=cfg.train.seed, prefix=prefix, reduce=self.runtime.reduce_mean_pairs,
            )
        # Evaluation frames are counted here, not in the next training step's cache metrics.
        metrics.update({f"{prefix}/{k}": v for k, v in self._cache_metrics().items()})
        self.policy.cache.clear()
        return metrics

    def _rollout_metrics(self, trajectories: list[Trajectory], prefix: str) -> dict[str, float]:
        turns = [t for traj in trajectories for t in traj.turns]
        with_skill = [t for t in trajectories if t.skill]
        penalty = self.config.algorithm.invalid_action_penalty
        groups: dict[int, set[float]] = {}  # the returns GRPO sees, per group
        for traj in trajectories:
            groups.setdefault(traj.group_id, set()).add(
                shaped_return(traj.episode_return, traj.invalid_actions, penalty)
            )
        pairs = {
            **episode_stats(trajectories, prefix),
            # Groups whose returns are all equal have zero advantage: there only the OPD term teaches.
            "rollout/equal_return_groups": (sum(len(r) == 1 for r in groups.values()), len(groups)),
            "analyzer/success_rate": (len(with_skill), len(trajectories)),
            "analyzer/skill_words": (sum(len(t.skill.split()) for t in with_skill), len(with_skill)),
        }
        return {
            **self.runtime.reduce_mean_pairs(pairs),
            "rollout/tokens_generated": self.runtime.reduce_sum(sum(len(t.response_ids) for t in turns)),
        }

    def _cache_metrics(self) -> dict[str, float]:
        stats = self.policy.cache.stats()
        return {f"cache/{k}": float(self.runtime.reduce_sum(v)) for k, v in stats.items()}

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **metrics}
        self.state.metrics.append(record)
        self.logger.log(step, metrics)

    def save_checkpoint(self, step: int) -> None:
        ckpt.save_checkpoint(
            self.run_dir / "checkpoints",
            step=step,
            runtime=self.runtime,
            policy=self.policy,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            config=self.config,
            state=self.state,
            keep_last=self.config.checkpoint.keep_last,
        )


def pad_sequences(values: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D per-token tensors into `[B, T]` plus the action-token mask."""
    length = max(len(v) for v in values)
    padded = torch.zeros(len(values), length, dtype=values[0].dtype, device=values[0].device)
    mask = torch.zeros(len(values), length, dtype=torch.bool, device=values[0].device)
    for row, v in enumerate(values):
        padded[row, : len(v)] = v
        mask[row, : len(v)] = True
    return padded, mask


def train(config: Config, resume: str | None = None, overwrite: bool = False) -> list[dict[str, Any]]:
    return Trainer(config, resume=resume, overwrite=overwrite).train()
