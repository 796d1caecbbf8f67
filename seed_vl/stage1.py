"""Stage 1 (DESIGN §1): teach the policy to analyze.

`collect` rolls out the policy (no skill) on training tasks, labels every trajectory with the configured
analyzer and writes a dataset directory:

    trajectories.jsonl   one trajectory per line (`save_trajectories`), frames in frames/<frame_id>.png
    sft.jsonl            one line per trajectory that got a valid skill: the analyzer prompt (`messages`,
                         image items as frame ids into frames/) and the answer JSON (`target`)
    dataset.json         counts: trajectories, labelled, no skill, analyzer errors, success rate
    config.yaml          the resolved config, secrets redacted

`sft` fine-tunes on the analyzer pairs of `sft.data` (loss on the answer tokens), writing metrics,
checkpoints and the final model in `sft.out_dir`.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from PIL import Image

from seed_vl.analyzer import build_analyzer_prompt, format_analysis, make_analyzer
from seed_vl.checkpoint import TrainerState, load_trainer_state, resolve_resume, save_checkpoint
from seed_vl.config import Config, ConfigError, save_config
from seed_vl.distributed import Runtime
from seed_vl.envs.group import EnvGroup
from seed_vl.io import atomic_directory, atomic_write_text
from seed_vl.policy import Policy
from seed_vl.rollout import SamplingSettings, collect_rollouts, derive_seed, frame_id, save_trajectories
from seed_vl.sft import SFTExample, SFTResult, SFTSettings, train_sft
from seed_vl.tracking import MetricsLogger, Phase
from seed_vl.trajectory import Trajectory, map_images

# Seed streams of stage 1's own draws: never equal to a stage 2 rollout seed of the same run.
_COLLECT_STREAM = 0x5F1C
SFT_FILE, TRAJECTORIES_FILE, FRAMES_DIR = "sft.jsonl", "trajectories.jsonl", "frames"


# ------------------------------------------------------------------------------------------------ collect
def collect(config: Config) -> Path:
    """Roll out `collect.num_tasks x collect.group_size` training episodes, `rollout.num_tasks` tasks at a
    time (the batch size stage 2 is sized for), label them and write the dataset to `collect.out_dir`
    (replaced as a whole once complete: an interrupted collect leaves no partial dataset behind)."""
    c = config.collect
    policy = Policy.from_config(
        config.model, trainable=False, seed=config.train.seed, generation=config.generation
    )
    analyzer = make_analyzer(config.analyzer, config.env, policy=policy, seed=config.train.seed)
    r = config.rollout
    sampling = SamplingSettings.from_config(r)
    rollout_seed = derive_seed(_COLLECT_STREAM, config.train.seed)
    chunks = [list(range(t, min(t + r.num_tasks, c.num_tasks))) for t in range(0, c.num_tasks, r.num_tasks)]
    counts: Counter[str] = Counter()
    episodes = Phase(
        "collect", total=c.num_tasks * c.group_size, unit="episode", enabled=config.logging.progress
    )
    with atomic_directory(c.out_dir) as out, episodes:
        for chunk, tasks in enumerate(chunks):
            group = EnvGroup(config.env, num_tasks=c.num_tasks, group_size=c.group_size, task_indices=tasks)
            trajectories = collect_rollouts(
                policy, group, sampling, seed=rollout_seed, step=chunk, on_episode_end=episodes.update
            )
            analyzer.analyze(trajectories, step=chunk)
            first_index = counts["trajectories"]
            _append_trajectories(out, trajectories)
            _append_sft_records(
                out, trajectories, first_index, policy.is_vision, config.analyzer.max_steps_shown
            )
            counts.update(
                trajectories=len(trajectories),
                won=sum(t.won for t in trajectories),
                **Counter(t.analyzer_status for t in trajectories),
            )
        summary = {
            "env": config.env.name,
            "analyzer": config.analyzer.backend,
            "trajectories": counts["trajectories"],
            "labelled": counts["ok"],
            "no_skill": counts["no_skill"],
            "analyzer_errors": counts["error"],
            "success_rate": counts["won"] / max(1, counts["trajectories"]),
        }
        atomic_write_text(out / "dataset.json", json.dumps(summary, indent=1) + "\n")
        save_config(config, out / "config.yaml")
    return Path(c.out_dir)


def _append_trajectories(out: Path, trajectories: list[Trajectory]) -> None:
    """Add a chunk to trajectories.jsonl (and its frames), so only one chunk is ever held in memory."""
    part = save_trajectories(trajectories, out, name=".chunk")
    with (out / TRAJECTORIES_FILE).open("a", encoding="utf-8") as f:
        f.write(part.read_text(encoding="utf-8"))
    part.unlink()


def _append_sft_records(
    out: Path, trajectories: list[Trajectory], first_index: int, with_images: bool, max_steps: int
) -> None:
    """One (analyzer prompt, answer JSON) pair per labelled trajectory. The prompt's images are the turns'
    observation frames (`Turn.images`), which `save_trajectories` has just stored under their frame ids."""
    with (out / SFT_FILE).open("a", encoding="utf-8") as f:
        for index, traj in enumerate(trajectories, first_index):
            if traj.skill is None:
                continue
            prompt = build_analyzer_prompt(traj, with_images=with_images, max_steps=max_steps)
            record = {
                "trajectory": index,
                "won": traj.won,
                "messages": map_images(prompt, frame_id),
                "target": format_analysis(traj.summary, traj.skill),
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------------- sft
def sft(config: Config, resume: str | None = None) -> Path:
    """Fine-tune `model.path` on the analyzer datasets of `sft.data`; returns the final model's directory, `sft.out_dir/model`. Runs under `accelerate
    launch` like `train`. Without `resume`, a rerun replaces the previous run's metrics, checkpoints and
    model in `sft.out_dir`; with it (`sft.out_dir` or one of its checkpoints), training continues."""
    s = config.sft
    if not s.data:
        raise ConfigError("sft.data: nothing to train on (give dataset directories written by `seed-vl collect`)")
    out_dir = Path(s.out_dir)
    resume_from = resolve_resume(resume) if resume else None
    datasets = {directory: load_analysis_examples(directory) for directory in s.data}  # before the model
    runtime = Runtime(cpu=config.model.device == "cpu")
    model_config = config.model.model_copy(update={"device": str(runtime.device)})
    policy = Policy.from_config(model_config, seed=config.train.seed)
    for directory, pairs in datasets.items():
        if not policy.is_vision and any(_has_images(e.context) for e in pairs):
            raise ConfigError(
                f"sft.data: {directory} holds image prompts but {config.model.path} is a text-only model"
            )
    analysis = [example for pairs in datasets.values() for example in pairs]

    metrics: list[dict[str, Any]] = load_trainer_state(resume_from).metrics if resume_from else []
    if runtime.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        if resume_from is None:
            (out_dir / "metrics.jsonl").unlink(missing_ok=True)
            shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
        save_config(config, out_dir / "config.yaml")
    logger = MetricsLogger(
        out_dir, config, enabled=runtime.is_main, use_wandb=config.logging.wandb,
        project=config.logging.wandb_project, run_name="sft",
    )
    if resume_from is not None and runtime.is_main:
        logger.rewrite(metrics)

    def log(step: int, values: dict[str, float]) -> None:
        metrics.append({"step": step, **values})
        logger.log(step, values)

    def checkpoint(step: int, runtime: Runtime, optimizer, scheduler) -> None:
        save_checkpoint(
            out_dir / "checkpoints",
            step=step,
            runtime=runtime,
            policy=policy,
            optimizer=optimizer,
            scheduler=scheduler,
            config=config,
            state=TrainerState(step=step, metrics=metrics, counters={}),
            keep_last=config.checkpoint.keep_last,
        )

    settings = SFTSettings(
        epochs=s.epochs,
        lr=s.lr,
        batch_size=s.batch_size,
        micro_batch_size=config.train.micro_batch_size,
        max_length=s.max_length,
        max_grad_norm=config.train.max_grad_norm,
        weight_decay=config.train.weight_decay,
        seed=config.train.seed,
    )
    result = train_sft(
        policy,
        analysis,
        settings,
        runtime=runtime,
        resume_from=resume_from,
        log=log,
        checkpoint=checkpoint,
        checkpoint_every=config.checkpoint.every,
        show_progress=config.logging.progress,
    )
    logger.close()
    model_state = runtime.model_state_for_export()
    if runtime.is_main:
        _write_summary(out_dir, result, analysis=len(analysis))
        with atomic_directory(out_dir / "model") as tmp:
            policy.save_pretrained(tmp, state_dict=model_state)
    runtime.wait_for_everyone()
    return out_dir / "model"


def _write_summary(out_dir: Path, result: SFTResult, *, analysis: int) -> None:
    summary = {
        "analyzer_examples": analysis,
        "trained_on": result.examples,
        "skipped_too_long": result.skipped_too_long,
        "steps": result.steps,
    }
    atomic_write_text(out_dir / "sft.json", json.dumps(summary, indent=1) + "\n")


def load_analysis_examples(directory: str | Path) -> list[SFTExample]:
    """The (analyzer prompt -> answer JSON) pairs of a `collect` dataset, images loaded from its frames."""
    directory = Path(directory)
    path = directory / SFT_FILE
    if not directory.is_dir():
        raise ConfigError(f"sft.data: dataset directory not found: {directory}")
    if not path.is_file():
        raise ConfigError(f"sft.data: {directory} has no {SFT_FILE} (write datasets with `seed-vl collect`)")
    frames: dict[str, Image.Image] = {}  # a frame shared by several prompts is loaded once

    def load_frame(lineno: int, fid: Any) -> Image.Image:
        if fid not in frames:
            frame = directory / FRAMES_DIR / f"{fid}.png"
            if not (isinstance(fid, str) and fid.isalnum() and frame.is_file()):
                raise ConfigError(
                    f"sft.data: {path} line {lineno}: frame {fid!r} not found in {frame.parent}"
                )
            with Image.open(frame) as image:
                frames[fid] = image.convert("RGB")
        return frames[fid]

    examples = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"sft.data: {path} line {lineno} is not valid JSON") from None
        problem = _record_problem(record)
        if problem:
            raise ConfigError(f"sft.data: {path} line {lineno}: {problem}")
        context = map_images(record["messages"], lambda fid, n=lineno: load_frame(n, fid))
        examples.append(SFTExample(context, record["target"], end_of_turn=True))
    return examples


def _record_problem(record: Any) -> str:
    """What is wrong with an sft.jsonl record, or '' when nothing is."""
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("target"), str)
        or not record["target"].strip()
    ):
        return "needs a non-empty 'target' string"
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        return "needs a non-empty 'messages' list"
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return "every message needs a 'role'"
        if not isinstance(content, str) and not (
            isinstance(content, list)
            and all(isinstance(item, dict) and item.get("type") in ("text", "image") for item in content)
        ):
            return "a message's content must be a string or a list of text and image items"
    return ""


def _has_images(context: list[dict[str, Any]]) -> bool:
    return any(
        isinstance(m["content"], list) and any(item["type"] == "image" for item in m["content"])
        for m in context
    )
