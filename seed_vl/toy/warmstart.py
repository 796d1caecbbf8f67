"""The tiny model's warm start: a stand-in for pretraining, NOT part of SEED.

A real run starts from a pretrained instruct model that already follows the answer format and uses a hint
in its context. No weights can be downloaded here, so `seed-vl warmstart` gives the randomly initialised
tiny model a short, documented substitute, one shuffled SFT over every `warmstart.envs` environment:

  * behaviour cloning on solver demonstrations (`demonstration_examples`): canonical plans with no skill,
    and a `demo_skill_fraction` share of episodes that play another winning plan (another move order, a
    detour) with the scripted skill naming it in every context, so the skill decides moves the frame
    alone does not, which is what makes skill text worth reading;
  * stage-1 analyzer SFT: analyzer prompt -> scripted-analyzer JSON on solver episodes (workflow skills)
    and random-action episodes (mostly avoidance rules), so that the model can write skills;
  * optionally, lookup pretraining before it and lookup drills within it (`lookup_steps`,
    `lookup_drills`: `seed_vl.toy.lookup_pretraining`), the in-context retrieval that following a route needs;
  * optionally, perception pretraining after the lookup and drills within the SFT (`perception_steps`,
    `perception_skill_turns`, `perception_drills`, `skill_drills`, and for EZPoints' cards
    `perception_first_numbers`, `first_number_drills`: `seed_vl.toy.perception_pretraining`), the sight that
    acting on a frame needs and the reading of a skill in the policy's own prompt;
  * optionally, a second SFT after it, stage 1's analyzer SFT with the decoder's attention trained
    (`analyzer_sft_episodes`): the first SFT freezes attention to keep the lookup, and its analyzer then
    quotes routes of one or two moves only; the second, on unseen episodes and Sokoban rooms of 3+ moves
    beside replays of the first's data, teaches the copy of longer ones; with `analyzer_sft_policy_episodes`,
    also on episodes the warm-started policy plays itself, the lost ones it will be asked about.

It stops early on purpose (few demonstrations, few epochs): the base policy should solve a minority of
held-out episodes and leave room for RL. `warmstart.json` records the settings, the SFT loss curve, the
base success rates measured like the trainer's evaluation, whether the base follows a skill
(`skill_probe`), and the wall time.

Cache: `warmstart.out_dir` holds `model/` and `warmstart.json`. It is reused while its key - a hash of the
settings, the base model's weights and config and the package source - matches, and is otherwise rebuilt in a
temporary directory that replaces it in one rename, so an interrupted warm start is simply redone.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

import seed_vl
import seed_vl.envs
import seed_vl.processors
from seed_vl.analyzer import build_analyzer_prompt, format_analysis, make_analyzer
from seed_vl.config import Config, ConfigError, EnvConfig, WarmstartConfig
from seed_vl.envs.group import EnvGroup
from seed_vl.evaluation import EVAL_STEP, episode_stats
from seed_vl.io import atomic_directory, atomic_write_text, content_digest, model_digest
from seed_vl.policy import Policy
from seed_vl.processors.images import ImageSettings
from seed_vl.rollout import SamplingSettings, collect_rollouts, derive_seed
from seed_vl.sft import SFTExample, SFTSettings, train_sft
from seed_vl.toy.demonstrations import (
    demonstration_examples,
    play_demonstrations,
    play_random_episodes,
    skill_turns,
    terse_answers,
    terse_response,
)
from seed_vl.toy.lookup_pretraining import SUMMARY_FILE as LOOKUP_SUMMARY
from seed_vl.toy.lookup_pretraining import copy_drill, lookup_drill, lookup_pretrained
from seed_vl.toy.perception_pretraining import final_push_turns, first_number_turns, perception_pretrained
from seed_vl.toy.perception_probe import measure_perception
from seed_vl.toy.skill_probe import analyzer_agreement, measure_skill_following
from seed_vl.toy.tiny_model import build_tiny_model, built_by_another_version
from seed_vl.tracking import Phase
from seed_vl.trajectory import Trajectory

SUMMARY_FILE, MODEL_DIR = "warmstart.json", "model"
# Seed streams of the warm start's own draws (demonstration phrasing, random-action episodes).
_DEMO_STREAM, _ANALYZER_STREAM, _LOOKUP_STREAM, _PERCEPTION_STREAM, _SKILL_STREAM = 0x3A12, 0x3A13, 0x3A14, 0x3A15, 0x3A16
_STAGE1_STREAM, _POLICY_EPISODE_STREAM, _FIRST_NUMBER_STREAM = 0x3A17, 0x3A18, 0x3A19
_STAGE1_SEED_OFFSET = 100_000  # the analyzer SFT's episodes: beyond the first SFT's, far below evaluation seeds
_POLICY_SEED_OFFSET = 200_000  # the policy's own episodes in it: beyond those
# Below this final move accuracy the lookup is not learnt: on one machine 2,000 steps reached 75% and the base
# built on it lost EZPoints' skill reading; on another they reached 98% (docs/TOY.md, "The lookup must be learnt").
LOOKUP_LEARNT = 0.9


def run_warmstart(config: Config) -> Path:
    """The warm-started model directory: reused from `warmstart.out_dir` when its key matches, else built
    (the untrained tiny model first, when `warmstart.base_model` is missing)."""
    ws = config.warmstart
    out_dir = Path(ws.out_dir)
    base = ensure_base_model(config)  # built (and pretrained) once: its cache checks replay their data
    key = warmstart_key(config, base)
    if cached_key(out_dir) == key:
        print(f"[seed-vl] warm start: reusing {out_dir / MODEL_DIR}", file=sys.stderr)
        return out_dir / MODEL_DIR
    settings = warmstart_settings(config)

    start = time.perf_counter()
    model = config.model.model_copy(update={"freeze_vision_tower": not ws.train_vision_tower})
    policy = Policy.from_config(model, path=base, seed=ws.seed)
    layers = decoder_layers(policy.model)
    if missing := sorted(set(ws.analyzer_sft_attention_layers or ()) - layers):
        raise ConfigError(
            f"warmstart.analyzer_sft_attention_layers: no decoder layer {missing[0]} (the model has {len(layers)})"
        )
    if ws.freeze_attention:
        freeze_decoder_attention(policy.model)
    envs = [env_config(config, name) for name in ws.envs]
    demonstrations, analysis = warmstart_examples(config, envs, policy.image_settings)
    losses: list[float] = []
    result = train_sft(
        policy,
        demonstrations + analysis,
        _sft_settings(config, epochs=ws.epochs, lr=ws.lr),
        log=lambda step, metrics: losses.append(metrics["sft/loss"]),
        show_progress=config.logging.progress,
    )
    stage1 = analyzer_sft(policy, config, envs) if ws.analyzer_sft_episodes or ws.analyzer_sft_policy_episodes else None
    summary = {
        "key": key,
        "note": "the tiny model's warm start: a stand-in for pretraining, not part of SEED",
        "settings": settings,
        "examples": {
            "demonstration_turns": len(demonstrations),
            "analyzer_pairs": len(analysis),
            "skipped_too_long": result.skipped_too_long,
        },
        "sft": {"steps": result.steps, "loss_curve": loss_curve(losses)},
        **({"analyzer_sft": stage1} if stage1 else {}),
        "base": {env.name: measure_base_policy(policy, config, env) for env in envs},
        "wall_time_s": round(time.perf_counter() - start, 1),
        "torch_threads": torch.get_num_threads(),  # the weights depend on it: another count, other bytes
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernels' instruction set: may, too
    }
    with atomic_directory(out_dir) as tmp:
        policy.save_pretrained(tmp / MODEL_DIR)
        atomic_write_text(tmp / SUMMARY_FILE, json.dumps(summary, indent=1) + "\n")
    return out_dir / MODEL_DIR


def warmstart_examples(
    config: Config, envs: list[EnvConfig], images: ImageSettings | None
) -> tuple[list[SFTExample], list[SFTExample]]:
    """(demonstration turns, analyzer pairs) of every environment, each drawn from its own seeded stream."""
    ws = config.warmstart
    demonstrations, analysis = [], []
    with Phase("warm start: data", len(envs), "environment", enabled=config.logging.progress) as bar:
        for index, env in enumerate(envs):
            turns = demonstration_examples(
                env,
                ws.demonstrations_for(env.name),
                seed=env.train_seed_start,
                history_window=config.rollout.history_window,
                image_settings=images,
                skill_fraction=ws.demo_skill_fraction,
                rng=random.Random(derive_seed(_DEMO_STREAM, ws.seed, index)),
            )
            demonstrations += [
                replace(turn, context=terse_answers(turn.context), response=terse_response(turn.response))
                for turn in turns
            ]
            rng = random.Random(derive_seed(_ANALYZER_STREAM, ws.seed, index))
            analysis += analyzer_examples(config, env, ws.analyzer_episodes, images, rng)
            bar.update()
    rng = random.Random(derive_seed(_LOOKUP_STREAM, ws.seed))
    demonstrations += [(copy_drill if k % 2 else lookup_drill)(rng) for k in range(ws.lookup_drills)]
    sokoban = env_config(config, "sokoban_visual")
    if ws.perception_drills:
        demonstrations += final_push_turns(
            sokoban, ws.perception_drills, seed=sokoban.train_seed_start, image_settings=images,
            rng=random.Random(derive_seed(_PERCEPTION_STREAM, ws.seed)),
        )
    if ws.skill_drills:
        demonstrations += skill_turns(
            sokoban, ws.skill_drills, seed=sokoban.train_seed_start, history_window=config.rollout.history_window,
            image_settings=images, rng=random.Random(derive_seed(_SKILL_STREAM, ws.seed)),
        )
    if ws.first_number_drills:
        ezpoints = env_config(config, "ezpoints_visual")
        demonstrations += first_number_turns(
            ezpoints, ws.first_number_drills, seed=ezpoints.train_seed_start, image_settings=images,
            rng=random.Random(derive_seed(_FIRST_NUMBER_STREAM, ws.seed)),
        )
    return demonstrations, analysis


def analyzer_sft(policy: Policy, config: Config, envs: list[EnvConfig]) -> dict[str, Any]:
    """Stage 1's analyzer SFT on the warm-started policy, its decoder attention trained (in the layers
    `warmstart.analyzer_sft_attention_layers` names, all by default): one epoch over
    `analyzer_sft_examples` and `policy_analyzer_examples`. Returns its example count, the policy episodes'
    success rates, steps and loss curve for `warmstart.json`."""
    own, success = policy_analyzer_examples(policy, config, envs)
    freeze_decoder_attention(policy.model, frozen=False, layers=config.warmstart.analyzer_sft_attention_layers)
    examples = analyzer_sft_examples(config, envs, policy.image_settings) + own
    losses: list[float] = []
    result = train_sft(
        policy,
        examples,
        _sft_settings(config, epochs=1, lr=config.warmstart.analyzer_sft_lr),
        log=lambda step, metrics: losses.append(metrics["sft/loss"]),
        show_progress=config.logging.progress,
    )
    return {
        "examples": len(examples),
        **({"policy_episodes": {"pairs": len(own), "success_rate": success}} if own else {}),
        "steps": result.steps,
        "loss_curve": loss_curve(losses),
    }


def policy_analyzer_examples(
    policy: Policy, config: Config, envs: list[EnvConfig]
) -> tuple[list[SFTExample], dict[str, float]]:
    """(pairs, success rate per environment) of `warmstart.analyzer_sft_policy_episodes` training episodes per
    environment that the policy plays with no skill at the rollout's sampling, labelled by the scripted
    analyzer: DESIGN's stage-1 data. Solver and random-action episodes alone left the skills it wrote for its
    own lost episodes invalid."""
    count = config.warmstart.analyzer_sft_policy_episodes
    if not count:
        return [], {}
    chunk = config.rollout.num_tasks * config.rollout.group_size  # the batch a training update plays
    sampling = SamplingSettings.from_config(config.rollout)
    seed = derive_seed(_POLICY_EPISODE_STREAM, config.warmstart.seed)
    examples, success = [], {}
    with Phase("warm start: policy episodes", count * len(envs), "episode", enabled=config.logging.progress) as bar:
        for env in envs:
            seeds = [env.train_seed_start + _POLICY_SEED_OFFSET + k for k in range(count)]
            played = []
            for start in range(0, count, chunk):
                group = EnvGroup.of_seeds(env, seeds[start : start + chunk])
                played += collect_rollouts(policy, group, sampling, seed=seed, step=start, on_episode_end=bar.update)
            examples += analyzer_pairs(config, env, played, policy.image_settings)
            success[env.name] = round(statistics.fmean(t.won for t in played), 4)
    return examples, success


def _sft_settings(config: Config, *, epochs: int, lr: float) -> SFTSettings:
    return SFTSettings(
        epochs=epochs,
        lr=lr,
        batch_size=config.warmstart.batch_size,
        micro_batch_size=config.train.micro_batch_size,
        max_length=config.sft.max_length,
        max_grad_norm=config.train.max_grad_norm,
        seed=config.warmstart.seed,
    )


def analyzer_sft_examples(config: Config, envs: list[EnvConfig], images: ImageSettings | None) -> list[SFTExample]:
    """The stage-1 analyzer SFT's examples (`warmstart.analyzer_sft_episodes`): analyzer pairs of episodes
    beyond the first SFT's seeds, on every environment and on Sokoban rooms of 3+ moves (whose winning
    routes the short default rooms rarely show), with replays of the first SFT's drills and demonstrations."""
    ws, replay = config.warmstart, config.warmstart.analyzer_sft_replay
    streams = (random.Random(derive_seed(_STAGE1_STREAM, ws.seed, k)) for k in itertools.count())
    fresh = [env.model_copy(update={"train_seed_start": env.train_seed_start + _STAGE1_SEED_OFFSET}) for env in envs]
    fresh += [env.model_copy(update={"min_solution_moves": 3}) for env in fresh if env.name.startswith("sokoban")]
    examples = []
    for env in fresh:
        examples += analyzer_examples(config, env, ws.analyzer_sft_episodes, images, next(streams))
    for env in envs:
        turns = demonstration_examples(
            env, min(replay // 2, ws.demonstrations_for(env.name)), seed=env.train_seed_start,
            history_window=config.rollout.history_window, image_settings=images,
            skill_fraction=ws.demo_skill_fraction, rng=next(streams),
        )
        examples += [replace(t, context=terse_answers(t.context), response=terse_response(t.response)) for t in turns]
    drills = next(streams)
    if ws.lookup_drills:
        examples += [(copy_drill if k % 2 else lookup_drill)(drills) for k in range(replay)]
    sokoban = env_config(config, "sokoban_visual")
    if ws.perception_drills:
        examples += final_push_turns(sokoban, replay, seed=sokoban.train_seed_start, image_settings=images, rng=drills)
    if ws.skill_drills:
        examples += skill_turns(
            sokoban, replay, seed=sokoban.train_seed_start, history_window=config.rollout.history_window,
            image_settings=images, rng=drills,
        )
    if ws.first_number_drills:
        ezpoints = env_config(config, "ezpoints_visual")
        examples += first_number_turns(ezpoints, replay, seed=ezpoints.train_seed_start, image_settings=images, rng=drills)
    return examples


def freeze_decoder_attention(model: torch.nn.Module, frozen: bool = True, layers: Iterable[int] | None = None) -> None:
    """Exclude the language model's attention weights from training (`frozen=False`: include them again;
    `layers`: only those decoder layers'): the SFT then builds on the retrieval that lookup pretraining put
    there instead of overwriting it (the MLPs, embeddings and tower still learn)."""
    chosen = None if layers is None else set(layers)
    for name, param in model.named_parameters():
        layer = _decoder_attention_layer(name)
        if layer is not None and (chosen is None or layer in chosen):
            param.requires_grad_(not frozen)


def decoder_layers(model: torch.nn.Module) -> set[int]:
    """The indices of the language model's decoder layers."""
    return {layer for name, _ in model.named_parameters() if (layer := _decoder_attention_layer(name)) is not None}


def _decoder_attention_layer(name: str) -> int | None:
    """The decoder layer a parameter name belongs to when it is the language model's attention, else None."""
    match = re.search(r"\.layers\.(\d+)\.self_attn\.", name)
    return int(match.group(1)) if match and "visual" not in name else None


def loss_curve(losses: list[float], points: int = 10) -> list[float]:
    """The SFT loss averaged over `points` equal stretches of the steps: the curve's shape, in brief."""
    bounds = [round(k * len(losses) / points) for k in range(points + 1)]
    return [round(statistics.fmean(losses[a:b]), 4) for a, b in itertools.pairwise(bounds) if b > a]


def ensure_base_model(config: Config) -> Path:
    """The model the warm start trains: `warmstart.base_model`, built as the tiny model (VL or text, as the
    environments need) if missing or written by another version of the builder, after
    `warmstart.lookup_steps` of lookup pretraining and `warmstart.perception_steps` of perception
    pretraining (each cached)."""
    ws = config.warmstart
    base = Path(ws.base_model)
    if not (base / "config.json").is_file() or built_by_another_version(base):
        build_tiny_model(base, text_only=ws.text_only, seed=ws.tiny_model_seed)
    if ws.lookup_steps:
        base = lookup_pretrained(
            base, ws.lookup_steps, seed=ws.seed, device=config.model.device, show_progress=config.logging.progress
        )
        accuracy = json.loads((base / LOOKUP_SUMMARY).read_text())["move_accuracy"]["lookup"][-1]
        if accuracy < LOOKUP_LEARNT:
            print(f"[seed-vl] warning: lookup pretraining ended at {accuracy:.0%} move accuracy (a learnt lookup "
                  f"reaches {LOOKUP_LEARNT:.0%}+), so the base may not read skills; raise warmstart.lookup_steps "
                  f"(it ran {ws.lookup_steps})", file=sys.stderr)
    if ws.perception_steps:
        base = perception_pretrained(
            base, ws.perception_steps, ws.perception_states, config.model, env_config(config, "sokoban_visual"),
            seed=ws.seed, skill_turns=ws.perception_skill_turns, history_window=config.rollout.history_window,
            first_numbers=ws.perception_first_numbers, ezpoints=env_config(config, "ezpoints_visual"),
            show_progress=config.logging.progress,
        )
    return base


def env_config(config: Config, name: str) -> EnvConfig:
    """The recipe's environment settings (frame sizes, seed ranges) for environment `name`; the step
    budget belongs to the recipe's own environment, the others keep their defaults."""
    own = name == config.env.name
    return config.env.model_copy(update={"name": name, "max_steps": config.env.max_steps if own else None})


def warmstart_settings(config: Config) -> dict[str, Any]:
    """Everything the warm start reads from the config, for its cache key (with the base model and the
    code); the RL sections of a recipe do not change it."""

    def fields(section: BaseModel, *names: str) -> dict[str, Any]:
        return section.model_dump(mode="json", include=set(names))

    ws = config.warmstart
    return {
        "warmstart": ws.model_dump(mode="json", exclude={"base_model", "out_dir"}),  # where: no effect
        "envs": [env_config(config, name).model_dump(mode="json") for name in ws.envs],
        "model": fields(config.model, "dtype", "attn_implementation", "min_pixels", "max_pixels"),
        "rollout": fields(config.rollout, "history_window", "max_new_tokens", "top_p"),
        "analyzer": fields(
            config.analyzer, "max_steps_shown", "min_skill_words", "attempts", "max_new_tokens", "temperature"
        ),
        "eval": fields(config.eval, "num_tasks", "temperature"),
        "train": fields(config.train, "micro_batch_size", "max_grad_norm"),
        "sft": fields(config.sft, "max_length"),
        "version": seed_vl.__version__,
    }


def same_warmstart_settings(recorded: dict[str, Any] | None, config: Config) -> bool:
    """Whether a warm start recorded with `recorded` settings is `config`'s. Fields added to the warm-start or
    environment settings since it was recorded count at their defaults: a code update keeps its base."""
    if not recorded:
        return False
    env_defaults, ws_defaults = EnvConfig().model_dump(mode="json"), WarmstartConfig().model_dump(mode="json")
    recorded = {
        **recorded,
        "warmstart": {key: value for key, value in {**ws_defaults, **recorded["warmstart"]}.items()
                      if key not in ("base_model", "out_dir")},
        "envs": [{**env_defaults, **env} for env in recorded["envs"]],
    }
    return recorded == json.loads(json.dumps(warmstart_settings(config)))


def warmstart_key(config: Config, base: Path | None = None) -> str:
    """What a finished warm start must match to be reused: settings, base model (weights and config) and
    package source. `base`: the result of `ensure_base_model(config)`, when the caller has it already."""
    base = ensure_base_model(config) if base is None else base
    settings = json.dumps(warmstart_settings(config), sort_keys=True)
    return content_digest(settings, model_digest(base), source_digest())


def cached_key(out_dir: Path) -> str | None:
    """The key of a finished warm start in `out_dir`, None when there is none."""
    summary = out_dir / SUMMARY_FILE
    if not (summary.is_file() and (out_dir / MODEL_DIR / "config.json").is_file()):
        return None
    try:
        return json.loads(summary.read_text()).get("key")
    except (json.JSONDecodeError, AttributeError):
        return None


# ----------------------------------------------------------------------------------------- analyzer pairs
def analyzer_examples(
    config: Config, env: EnvConfig, num_episodes: int, images: ImageSettings | None, rng: random.Random
) -> list[SFTExample]:
    """Stage-1 pairs (analyzer prompt -> scripted-analyzer JSON) on `num_episodes` episodes: half solver
    episodes (successes: workflow skills), half random-action episodes (mostly failures: avoidance rules)."""
    solved = play_demonstrations(
        env,
        num_episodes - num_episodes // 2,
        seed=env.train_seed_start,
        history_window=config.rollout.history_window,
        image_settings=images,
        rng=rng,
    )
    for turn in (turn for episode in solved for turn in episode.turns):
        turn.response_text = terse_response(turn.response_text)
    random_seeds = [env.train_seed_start + k for k in range(num_episodes // 2)]
    episodes = solved + play_random_episodes(
        env, random_seeds, history_window=config.rollout.history_window, image_settings=images, rng=rng
    )
    return analyzer_pairs(config, env, episodes, images)


def analyzer_pairs(
    config: Config, env: EnvConfig, episodes: list[Trajectory], images: ImageSettings | None
) -> list[SFTExample]:
    """(analyzer prompt -> scripted-analyzer JSON) for every episode the scripted analyzer writes a skill for."""
    scripted = config.analyzer.model_copy(update={"backend": "scripted"})
    make_analyzer(scripted, env, seed=config.warmstart.seed).analyze(episodes)
    return [
        SFTExample(
            build_analyzer_prompt(
                t, with_images=images is not None, max_steps=config.analyzer.max_steps_shown
            ),
            format_analysis(t.summary, t.skill),
            end_of_turn=True,
        )
        for t in episodes
        if t.skill is not None
    ]


# --------------------------------------------------------------------------------------------- evaluation
def measure_base_policy(policy: Policy, config: Config, env: EnvConfig) -> dict[str, float]:
    """Success rate and friends on the held-out tasks the trainer's evaluation plays (same seeds and
    sampling) and a uniformly random policy's success on them; whether the policy sees its observation
    (`perception_probe`); how often the self-analyzer writes a usable skill for those episodes and one that
    agrees with the scripted analyzer's; and whether the policy follows a skill (`skill_probe`: success with
    no, the correct and a wrong skill; gap and gate)."""
    group = EnvGroup(env, num_tasks=config.eval.num_tasks, group_size=1, split="eval")
    sampling = SamplingSettings.from_config(config.rollout, temperature=config.eval.temperature)
    with Phase(f"warm start: eval {env.name}", len(group), "episode", enabled=config.logging.progress) as bar:
        trajectories = collect_rollouts(
            policy, group, sampling, seed=config.warmstart.seed, step=EVAL_STEP, on_episode_end=bar.update
        )
    analyzer = config.analyzer.model_copy(update={"backend": "self"})
    make_analyzer(analyzer, env, policy=policy, seed=config.warmstart.seed).analyze(trajectories)
    metrics = {key.removeprefix("eval/"): s / n for key, (s, n) in episode_stats(trajectories, "eval").items()}
    # The floor a base must clear to be said to play: uniformly random admissible actions on the same tasks.
    random_play = play_random_episodes(
        env, group.seeds, history_window=config.rollout.history_window, image_settings=None,
        rng=random.Random(config.warmstart.seed),
    )
    metrics["random_success_rate"] = statistics.fmean(t.won for t in random_play)
    metrics.update(measure_perception(policy, config, env, num_tasks=config.eval.num_tasks))
    metrics.update({f"analyzer/{key}": value for key, value in analyzer_agreement(env, trajectories).items()})
    following = measure_skill_following(policy, config, env, num_tasks=config.eval.num_tasks)
    metrics.update({f"skills/{key}": value for key, value in following.items()})
    return metrics


# ------------------------------------------------------------------------------------------------ hashing
def source_digest() -> str:
    """A digest of the package's Python source (envs and processors included): a code change that could
    change the warm start's result invalidates the cache."""
    roots = [Path(p) for pkg in (seed_vl, seed_vl.envs, seed_vl.processors) for p in pkg.__path__]
    files = sorted({f for root in roots for f in root.rglob("*.py")})
    return content_digest(*(f.read_bytes() for f in files))

