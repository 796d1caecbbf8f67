"""End to end on the tiny models: every preset, resume equality, numerical safety, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seed_vl.checkpoint import list_checkpoints
from seed_vl.config import ConfigError, load_config
from seed_vl.trainer import NonFiniteError, Trainer, train

REPO = Path(__file__).resolve().parents[1]
SKILL_BANK = str(REPO / "configs" / "skill_bank.yaml")


def _overrides(model_path: str, out: Path, env: str, **extra) -> list[str]:
    base = {
        "model.path": model_path,
        "model.device": "cpu",
        "env.name": env,
        "env.max_steps": 3,
        "env.cell_px": 28,
        "rollout.num_tasks": 2,
        "rollout.group_size": 2,
        "rollout.max_new_tokens": 12,
        "analyzer.max_new_tokens": 24,
        "train.steps": 2,
        "train.lr": 1e-3,
        "train.mini_batch_size": 8,
        "train.micro_batch_size": 8,
        "train.output_dir": str(out),
        "train.run_name": "run",
        "eval.num_tasks": 2,
        "logging.progress": False,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("env", "preset", "backend"),
    [
        ("sokoban_visual", "seed", "self"),
        ("sokoban_visual", "grpo", "self"),
        ("sokoban_visual", "opsd", "scripted"),
        ("sokoban_visual", "sdar", "self"),
        ("ezpoints_text", "seed", "scripted"),
        ("ezpoints_text", "grpo", "self"),
        ("ezpoints_text", "opsd", "self"),
        ("ezpoints_text", "sdar", "self"),
    ],
)
def test_two_update_steps_of_each_preset(tmp_path, tiny_vl_path, tiny_text_path, env, preset, backend):
    model = tiny_vl_path if env.endswith("visual") else tiny_text_path
    extra = {"algorithm.preset": preset, "analyzer.backend": backend}
    if preset == "sdar":
        extra["algorithm.skill_bank"] = SKILL_BANK
    cfg = load_config(None, _overrides(model, tmp_path, env, **extra))
    train(cfg)

    run_dir = tmp_path / "run"
    records = _metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2]
    last = records[-1]
    for key in (
        "train/success_rate",
        "train/return",
        "train/episode_length",
        "train/invalid_action_rate",
        "analyzer/success_rate",
        "pg_loss",
        "clip_frac",
        "entropy",
        "time/rollout",
        "time/update",
        "rollout/tokens_generated",
        "eval/success_rate",
    ):
        assert key in last, key
    if preset != "grpo":
        assert "gate_mean" in last and "opd_loss" in last
    if backend == "scripted" or preset == "sdar":
        assert last["analyzer/success_rate"] == 1.0  # scripted skills and the bank always give a skill
    if preset == "seed" and backend == "scripted":
        assert 0.0 < last["gate_mean"] < 1.0
    assert (run_dir / "config.yaml").is_file()
    assert list(run_dir.glob("trajectories/step_000002/frames/*.png")) or env.endswith("text")
    (final,) = list_checkpoints(run_dir / "checkpoints")
    assert (final / "model" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("env", "preset", "backend", "kl_coef"),
    [("sokoban_visual", "seed", "scripted", 0.0), ("ezpoints_visual", "opsd", "self", 0.01)],
)
def test_resume_reproduces_the_uninterrupted_run(tmp_path, tiny_vl_path, env, preset, backend, kl_coef):
    common = _overrides(
        tiny_vl_path,
        tmp_path,
        env,
        **{
            "train.steps": 3,
            "checkpoint.every": 1,
            "checkpoint.keep_last": 3,
            "algorithm.preset": preset,
            "analyzer.backend": backend,
            "algorithm.kl_coef": kl_coef,
            "eval.num_tasks": 1,
        },
    )
    train(load_config(None, common))
    full = _metrics(tmp_path / "run")

    # An "interrupted" run: the same recipe resumed from the step-1 checkpoint into another directory.
    step1 = tmp_path / "run" / "checkpoints" / "step_000001"
    train(load_config(None, [*common, "train.run_name=resumed"]), resume=str(step1))
    resumed = _metrics(tmp_path / "resumed")

    def comparable(record):
        return {k: v for k, v in record.items() if not k.startswith("time/")}

    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    for a, b in zip(full[2:], resumed[2:], strict=True):
        assert comparable(a) == pytest.approx(comparable(b), rel=1e-6, abs=1e-7)


def test_nonfinite_updates_stop_the_run_with_a_checkpoint(tmp_path, tiny_text_path):
    cfg = load_config(None, _overrides(tiny_text_path, tmp_path, "ezpoints_text", **{
        "train.steps": 6, "train.max_nonfinite_in_a_row": 2, "algorithm.preset": "grpo", "eval.num_tasks": 1,
        "train.mini_batch_size": 64,  # one update per step
    }))
    trainer = Trainer(cfg)
    # A gradient that overflows (as an fp16 overflow would): every update must be skipped, none applied.
    embedding = trainer.policy.model.get_input_embeddings().weight
    embedding.register_hook(lambda grad: grad * float("inf"))
    before = {name: p.detach().clone() for name, p in trainer.policy.model.named_parameters()}

    with pytest.raises(NonFiniteError, match="2 non-finite updates in a row at step 2"):
        trainer.train()
    records = _metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[-1]["nonfinite_skipped"] == 2
    (checkpoint,) = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert checkpoint.name == "step_000002"
    for name, param in trainer.policy.model.named_parameters():  # the last good state is the initial one
        assert torch.equal(param, before[name]), name


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "seed_vl.cli", *args], capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("train", "--config", "no/such/recipe.yaml"), "no/such/recipe.yaml"),
        (("train", "rollout.group_size=0"), "rollout.group_size"),
        (("train", "algorithm.preset=sdar"), "algorithm.skill_bank"),
        (("train", "model.path=/nonexistent/model"), "/nonexistent/model"),
        (("eval", "rollout.temperature=hot"), "rollout.temperature"),
        (("train", "--resume", "/nonexistent/run"), "/nonexistent/run"),
        (("reproduce", "--quick", "--only", "sokoban-sdar-seed0"), "--only: 'sokoban-sdar-seed0'"),
    ],
)
def test_bad_cli_input_is_one_line_exit_2(args, named):
    proc = _cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_two_process_cpu_ddp_run(tmp_path, tiny_vl_path):
    launch = [sys.executable, "-m", "accelerate.commands.launch",
              "--config_file", str(REPO / "configs/accelerate/cpu_ddp.yaml"), "-m", "seed_vl.cli", "train"]
    # 3 tasks on 2 processes: one plays 2 groups, the other 1, so they hold different numbers of turns
    # and micro-batches, yet take the same optimizer steps.
    overrides = _overrides(tiny_vl_path, tmp_path, "sokoban_visual", **{
        "analyzer.backend": "scripted", "rollout.num_tasks": 3, "train.mini_batch_size": 4,
        "train.micro_batch_size": 2,
    })
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*launch, *overrides], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    records = _metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1, 2]
    # Whole groups stay on one process (the main one saves its own: tasks 0 and 2); metrics are reduced.
    assert records[1]["env_steps"] == 3 * 2 * 3
    lines = (tmp_path / "run/trajectories/step_000001/trajectories.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["group_id"] for line in lines) == [0, 0, 2, 2]
    assert len(list_checkpoints(tmp_path / "run" / "checkpoints")) == 1


def test_eval_command_reports_held_out_success(tiny_vl_path):
    proc = _cli("eval", f"model.path={tiny_vl_path}", "model.device=cpu", "env.cell_px=28", "env.max_steps=2",
                "eval.num_tasks=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    values = dict(line.split(": ") for line in proc.stdout.splitlines())
    assert set(values) >= {"eval/success_rate", "eval/return", "eval/episode_length", "eval/invalid_action_rate"}
    assert 0.0 <= float(values["eval/success_rate"]) <= 1.0
    assert float(values["eval/episode_length"]) <= 2.0


def test_a_second_run_into_the_same_directory_needs_resume_or_overwrite(tmp_path, tiny_text_path):
    args = ["train", *_overrides(tiny_text_path, tmp_path, "ezpoints_text", **{"train.steps": 0, "eval.num_tasks": 1})]
    assert _cli(*args).returncode == 0
    first = (tmp_path / "run" / "metrics.jsonl").read_text()

    proc = _cli(*args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--resume" in proc.stderr and "--overwrite" in proc.stderr and str(tmp_path / "run") in proc.stderr
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == first  # untouched

    assert _cli(*args, "--overwrite").returncode == 0
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == first  # one run's records, not two


def test_a_damaged_checkpoint_is_named_and_resume_falls_back_to_an_intact_one(tmp_path, tiny_text_path):
    args = ["train", *_overrides(tiny_text_path, tmp_path, "ezpoints_text", **{
        "checkpoint.every": 1, "checkpoint.keep_last": 3, "eval.num_tasks": 1})]
    assert _cli(*args).returncode == 0
    newest = tmp_path / "run" / "checkpoints" / "step_000002"
    weights = newest / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated, as by a full disk

    proc = _cli(*args, "--resume", str(newest))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert str(weights) in proc.stderr and "damaged" in proc.stderr

    proc = _cli(*args, "--resume", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "skipping damaged checkpoint step_000002" in proc.stderr
    assert [r["step"] for r in _metrics(tmp_path / "run")] == [0, 1, 2]  # step 2 done again from step 1
    assert list_checkpoints(tmp_path / "run" / "checkpoints")[-1].name == "step_000002"


def test_the_image_cache_encodes_each_unique_frame_once_per_step(tmp_path, tiny_vl_path):
    """A step's encoder calls are its unique frames (rollout, scoring and update share one encoding);
    evaluation is counted on its own line, not in the next step."""
    records = train(load_config(None, _overrides(tiny_vl_path, tmp_path, "sokoban_visual", **{
        "analyzer.backend": "scripted", "eval.every": 1, "eval.num_tasks": 2,
    })))
    for record in records[1:]:
        frames = tmp_path / "run" / "trajectories" / f"step_{record['step']:06d}" / "frames"
        assert record["cache/encoder_calls"] == len(list(frames.glob("*.png"))) > 0
        assert record["cache/hits"] == record["cache/images_seen"] - record["cache/encoder_calls"] > 0
    for record in records:
        assert record["eval/cache/encoder_calls"] > 0


def test_the_samplers_log_probs_stand_in_for_the_old_policy_pass(tmp_path, tiny_vl_path, monkeypatch):
    """algorithm.old_logprobs=sampler: l_old is the hf sampler's own log-probs, the numbers the rescoring
    pass computes, and scoring runs over the skill contexts only."""
    def trainer(mode: str) -> Trainer:
        return Trainer(load_config(None, _overrides(tiny_vl_path, tmp_path, "sokoban_visual", **{
            "analyzer.backend": "scripted", "algorithm.kl_coef": 0.0, "algorithm.old_logprobs": mode,
            "train.run_name": mode,
        })))

    rescoring, sampler = trainer("rescore"), trainer("sampler")
    trajectories = rescoring.rollout(step=1)
    rescoring._attach_skills(trajectories, step=1)
    rescored, reused = rescoring._action_samples(trajectories), sampler._action_samples(trajectories)
    rescoring._paired_scores(rescored)
    scored = []
    score = sampler.policy.score
    monkeypatch.setattr(sampler.policy, "score", lambda contexts, *a, **k: scored.append(len(contexts)) or score(
        contexts, *a, **k))
    sampler._paired_scores(reused)

    assert scored == [sum(s.skill is not None for s in reused)] and 0 < scored[0] < 2 * len(reused)
    for a, b in zip(rescored, reused, strict=True):
        assert torch.allclose(a.old_logprobs, b.old_logprobs, atol=1e-3)
        assert torch.allclose(a.teacher_logprobs, b.teacher_logprobs, atol=1e-5)
    assert sampler._logprob_gap_metrics(reused) == {}


def test_sampler_log_probs_need_the_hf_sampler_at_top_p_1():
    for overrides in (["rollout.top_p=0.9"], ["generation.backend=vllm"]):
        with pytest.raises(ConfigError, match="algorithm.old_logprobs"):
            load_config(None, ["algorithm.old_logprobs=sampler", *overrides])
