"""Typed run configuration: YAML recipes + `section.key=value` overrides.

Every recipe is validated into `Config` (pydantic, unknown keys forbidden). Any problem with a recipe or
an override raises `ConfigError` with one line naming the field or file; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from seed_vl.io import atomic_write_text

REDACTED = "***REDACTED***"
_SECRET_WORD = re.compile(r"(^|_)(key|token|secret|password|apikey)(_|$)", re.IGNORECASE)


class ConfigError(ValueError):
    """A bad recipe, override or file; the message is one line naming the culprit."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(Section):
    """LoRA adapters through PEFT: only the adapters train; the reference policy is the same model with its
    adapters disabled. Targets are module names (suffixes) in the language model; a frozen vision tower
    never gets adapters."""

    r: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0.0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, targets: list[str]) -> list[str]:
        if not targets or any(not t.strip() for t in targets):
            raise ValueError("name one or more module names")
        return targets


class ModelConfig(Section):
    path: str = ".cache/tiny-vl"  # local HF checkpoint directory (no hub access at run time)
    # The compute dtype. Trainable weights and optimizer state stay in float32 whatever it is; forward and
    # backward passes run in it under autocast (a bf16 weight cannot absorb a 1e-6 step). Frozen copies
    # (the reference policy, LoRA's base weights) are held in it. Checkpoints' model/ is saved in it.
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = "auto"  # "auto" = cuda when available, else cpu
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    freeze_vision_tower: bool = True
    vision_cache_max_entries: int = Field(4096, ge=0)  # 0 disables the image-embedding cache
    min_pixels: int = Field(28 * 28, ge=28 * 28)
    max_pixels: int = Field(512 * 28 * 28, ge=28 * 28)
    gradient_checkpointing: bool = False  # recompute decoder layers in backward (update passes only)
    lora: LoraConfig | None = None  # off by default: full fine-tuning

    @model_validator(mode="after")
    def _pixels_ordered(self) -> ModelConfig:
        if self.min_pixels > self.max_pixels:
            raise ValueError("min_pixels must not exceed max_pixels")
        return self


class EnvConfig(Section):
    name: Literal["sokoban_visual", "sokoban_text", "ezpoints_visual", "ezpoints_text", "textworld"] = (
        "sokoban_visual"
    )
    max_steps: int | None = Field(None, ge=1)  # None = the environment's own default
    dim_room: tuple[int, int] = (6, 6)  # Sokoban
    num_boxes: int = Field(1, ge=1, le=4)  # Sokoban
    cell_px: int = Field(16, ge=4, le=64)  # Sokoban frame: pixels per grid cell
    end_on_deadlock: bool = False  # Sokoban: a push that makes the room unsolvable ends the episode (lost)
    min_solution_moves: int = Field(0, ge=0, le=20)  # Sokoban: rooms solved in fewer moves are redrawn
    image_size: int = Field(300, ge=56, le=1024)  # EZPoints frame side
    # EZPoints: "gym_cards" (RL4VLM's deal, where "2 + 10 =" wins 37.5% of deals) or "uniform_pair", a toy
    # departure that deals the seven solvable pairs of values alike (envs/ezpoints.py)
    ezpoints_deal: Literal["gym_cards", "uniform_pair"] = "gym_cards"
    textworld_level: int = Field(1, ge=1, le=30)  # TextWorld tw-treasure_hunter level
    textworld_pool_size: int = Field(16, ge=1)
    train_seed_start: int = Field(0, ge=0)
    eval_seed_start: int = Field(1_000_000, ge=0)  # disjoint from training seeds
    parallel_workers: int = Field(0, ge=0)  # 0 = step environments sequentially


class RolloutConfig(Section):
    num_tasks: int = Field(4, ge=1)  # tasks (groups) per update step
    group_size: int = Field(8, ge=1)
    # K previous turns shown in one user message (the paper's mode), or "episode": the whole episode as one
    # multi-turn chat, each turn's context the previous one's plus its answer and the next observation, so
    # that scoring packs an episode's turns into one sequence (`Policy.score`). For short episodes only.
    history_window: int | Literal["episode"] = 2
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)

    @field_validator("history_window", mode="before")
    @classmethod
    def _turns_or_episode(cls, value: Any) -> Any:
        if value == "episode" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        raise ValueError("expected a number of turns >= 0 or 'episode'")


class AnalyzerConfig(Section):
    backend: Literal["self", "external", "scripted"] = "self"
    attempts: int = Field(2, ge=1)
    min_skill_words: int = Field(5, ge=1)
    max_new_tokens: int = Field(96, ge=8)  # self analyzer
    temperature: float = Field(0.7, ge=0.0)
    base_url: str = ""  # external: OpenAI-compatible endpoint, e.g. http://host:8000/v1
    model: str = ""  # external: model name sent with each request
    api_key_env: str = "OPENAI_API_KEY"  # external: the *name* of the variable holding the key
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(3, ge=0)
    retry_backoff_s: float = Field(1.0, ge=0.0)  # external: first retry's wait, doubled each retry (+ jitter)
    max_concurrency: int = Field(8, ge=1)
    max_steps_shown: int = Field(15, ge=1)  # analyzer prompt: the last N steps in full, earlier ones as actions


class AlgorithmConfig(Section):
    preset: Literal["grpo", "opsd", "sdar", "seed"] = "seed"
    opd_coef: float = Field(0.01, ge=0.0)  # lambda
    pg_coef: float = Field(1.0, ge=0.0)  # policy-gradient weight; 0: the distillation term alone (diagnostic)
    gate_beta: float = Field(5.0, ge=0.0)
    clip_eps: float = Field(0.2, gt=0.0, lt=1.0)
    dual_clip: float = Field(3.0, gt=1.0)
    kl_coef: float = Field(0.01, ge=0.0)
    entropy_coef: float = Field(0.001, ge=0.0)
    invalid_action_penalty: float = Field(0.1, ge=0.0)
    adv_eps: float = Field(1e-6, gt=0.0)
    skill_bank: str = ""  # SDAR: YAML/JSON file of static skills per task type
    # Truncated importance sampling against the rollout engine's own log-probs (verl, TRL): each action
    # token's policy-gradient term is weighted by min(exp(l_old - l_rollout), cap). None: off.
    rollout_is_cap: float | None = Field(None, gt=0.0)
    # Where l_old comes from. "rescore": the trainer scores every action before the update (the paper, verl).
    # "sampler": the hf backend's own log-probs of the sampled tokens, the same numbers when it samples the
    # trainer's weights at top_p 1 (fp32 on CPU: |l_old - l_rollout| ~2e-5 nats), which saves that pass.
    old_logprobs: Literal["rescore", "sampler"] = "rescore"


class GenerationConfig(Section):
    """Which engine samples rollouts, evaluation episodes and the self analyzer's answers. `hf` is
    transformers' `generate` on the policy's own weights (CPU or GPU); `vllm` is a colocated offline vLLM
    engine (GPU, the `vllm` extra) that gets the trained weights pushed once per update step."""

    backend: Literal["hf", "vllm"] = "hf"
    # vllm only below
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0)  # share of the GPU the engine may take
    enable_sleep_mode: bool = True  # engine offloads its weights and frees its KV cache while training
    max_model_len: int | None = Field(None, ge=16)  # None: the model config's context length
    max_images_per_prompt: int = Field(16, ge=1)  # vLLM's limit_mm_per_prompt for images
    image_embeds: bool = False  # send our cached image features instead of pixels (frozen tower only)
    enforce_eager: bool = False  # no CUDA graphs: slower decoding, faster start, less memory


class TrainConfig(Section):
    seed: int = 0
    steps: int = Field(150, ge=0)
    env_step_budget: int = Field(0, ge=0)  # > 0: also stop once this many environment steps are spent
    lr: float = Field(1e-6, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    warmup_steps: int = Field(0, ge=0)
    mini_batch_size: int = Field(8, ge=1)  # sampled turns (action samples) per optimizer step
    micro_batch_size: int = Field(8, ge=1)  # sequences per forward pass
    ppo_epochs: int = Field(1, ge=1)
    max_grad_norm: float = Field(1.0, gt=0.0)
    max_nonfinite_in_a_row: int = Field(10, ge=1)
    output_dir: str = "runs"
    run_name: str = ""  # empty: derived from preset, env and seed


class EvalConfig(Section):
    every: int = Field(0, ge=0)  # 0 = only before and after training
    num_tasks: int = Field(16, ge=1)
    temperature: float = Field(0.4, ge=0.0)


class CheckpointConfig(Section):
    every: int = Field(0, ge=0)  # 0 = only at the end
    keep_last: int = Field(2, ge=1)


class LoggingConfig(Section):
    wandb: bool = False
    wandb_project: str = "seed-vl"
    progress: bool = True


class CollectConfig(Section):
    """Stage 1, step 1-2: roll out the base policy (no skill) and label each trajectory with an analyzer."""

    num_tasks: int = Field(180, ge=1)
    group_size: int = Field(8, ge=1)
    out_dir: str = "runs/stage1-data"


class SFTConfig(Section):
    """Stage 1, step 3: supervised fine-tuning on analyzer pairs, loss on answer tokens only."""

    data: list[str] = []  # dataset directories written by `seed-vl collect`
    epochs: int = Field(3, ge=1)
    lr: float = Field(2e-6, gt=0.0)
    batch_size: int = Field(8, ge=1)
    max_length: int = Field(4096, ge=16)
    out_dir: str = "runs/sft"


_VISUAL_SUFFIX = "_visual"


class WarmstartConfig(Section):
    """The tiny model's warm start (`seed-vl warmstart`). It stands in for pretraining and is not part of
    SEED: behaviour cloning on solver demonstrations (a share of them with the episode's scripted skill in
    context) plus analyzer SFT on scripted labels, stopped early so that the base policy leaves room for RL."""

    base_model: str = ".cache/tiny-vl"  # the untrained tiny model; built with `tiny_model_seed` when missing
    tiny_model_seed: int = 0
    # Lookup pretraining first (seed_vl/toy/lookup_pretraining.py): steps of finding a step in a route and
    # copying its move, what following a skill needs; 0 = none. Cached in `<base_model>-lookup/`. The warm
    # start warns when it ends below 90% move accuracy: too few steps for this machine (docs/TOY.md).
    lookup_steps: int = Field(0, ge=0)
    lookup_drills: int = Field(0, ge=0)  # lookup and copy documents (half each) as chat examples in the SFT
    freeze_attention: bool = False  # SFT leaves the decoder's attention (where the lookup lives) as it is
    # Perception pretraining next (seed_vl/toy/perception_pretraining.py): steps of frame -> winning move on
    # rooms one push from solved, what acting on the frame needs; 0 = none. Needs sokoban_visual in `envs`.
    perception_steps: int = Field(0, ge=0)
    perception_states: int = Field(3000, ge=1)  # final pushes (solver episodes' last states) it trains on
    perception_drills: int = Field(0, ge=0)  # final pushes as chat examples mixed into the SFT
    # EZPoints first turns (the cards, an empty formula -> the first number) it trains on beside them, what
    # reading the cards needs; and as chat examples in the SFT. Need ezpoints_visual in `envs`.
    perception_first_numbers: int = Field(0, ge=0)
    first_number_drills: int = Field(0, ge=0)
    # Skill turns (a varied plan's turn, the skill naming it in context) it trains on beside the final
    # pushes, what reading a skill in the policy's own prompt needs; and as chat examples in the SFT.
    perception_skill_turns: int = Field(0, ge=0)
    skill_drills: int = Field(0, ge=0)
    # Stage-1 analyzer SFT after that SFT, with the decoder's attention trained (quoting a long route from the
    # analyzer prompt needs it; the first SFT keeps it frozen for the lookup): analyzer pairs of this many
    # unseen episodes per environment, and as many on Sokoban rooms of 3+ moves; 0 = none. Beside them,
    # `analyzer_sft_replay` examples of each drill kind the first SFT had and up to half as many of its
    # demonstration episodes, so that acting and reading are kept. `analyzer_sft_attention_layers`: the
    # decoder layers whose attention it trains (None: all); the others keep the lookup skills are read with.
    # `analyzer_sft_policy_episodes`: besides, this many episodes per environment that the warm-started policy
    # plays itself (no skill, the rollout's sampling), labelled by the scripted analyzer, as DESIGN's stage 1
    # collects: the episodes the analyzer will be asked about, most of them lost, unlike solver episodes.
    analyzer_sft_episodes: int = Field(0, ge=0)
    analyzer_sft_policy_episodes: int = Field(0, ge=0)
    analyzer_sft_replay: int = Field(600, ge=0)
    analyzer_sft_lr: float = Field(1e-3, gt=0.0)
    analyzer_sft_attention_layers: list[int] | None = None
    out_dir: str = ".cache/warmstart-vl"  # model/ and warmstart.json; reused while the settings match
    envs: list[str] = ["sokoban_visual", "ezpoints_visual"]  # all visual (VL model) or all text
    seed: int = 0  # demonstrations, shuffling, evaluation sampling
    # solver episodes per environment, or per environment name (EZPoints episodes are short and its cards
    # must be learnt from pixels: it needs more of them than Sokoban)
    demonstrations: int | dict[str, int] = 120
    demo_skill_fraction: float = Field(0.5, ge=0.0, le=1.0)  # share of demo episodes: varied plan + its skill
    analyzer_episodes: int = Field(96, ge=0)  # labelled episodes per environment: half solver, half random
    train_vision_tower: bool = True  # pretraining teaches the tower to see; RL keeps it frozen by default
    epochs: int = Field(2, ge=1)  # stopped early on purpose (see warmstart.json for the base success rates)
    lr: float = Field(2e-3, gt=0.0)  # from random weights: far above a fine-tuning rate
    batch_size: int = Field(8, ge=1)

    @field_validator("envs")
    @classmethod
    def _known_and_one_modality(cls, envs: list[str]) -> list[str]:
        known = get_args(EnvConfig.model_fields["name"].annotation)
        if not envs or any(name not in known for name in envs):
            raise ValueError(f"name one or more environments among {', '.join(known)}")
        if len({name.endswith(_VISUAL_SUFFIX) for name in envs}) > 1:
            raise ValueError("mixes visual and text environments; one model learns them all")
        return envs

    @model_validator(mode="after")
    def _perception_on_visual_sokoban(self) -> WarmstartConfig:
        for name in ("perception_steps", "perception_drills", "perception_skill_turns", "skill_drills"):
            if getattr(self, name) and "sokoban_visual" not in self.envs:
                raise ValueError(f"{name}: perception pretraining plays sokoban_visual; add it to envs or set 0")
        for name in ("perception_first_numbers", "first_number_drills"):
            if getattr(self, name) and "ezpoints_visual" not in self.envs:
                raise ValueError(f"{name}: first numbers are EZPoints turns; add ezpoints_visual to envs or set 0")
        if self.perception_first_numbers and not self.perception_steps:
            raise ValueError("perception_first_numbers: trained in perception pretraining; set perception_steps")
        return self

    @model_validator(mode="after")
    def _demonstrations_for_every_env(self) -> WarmstartConfig:
        if any(self.demonstrations_for(name) < 1 for name in self.envs):
            raise ValueError(f"demonstrations: give a positive count for every environment ({', '.join(self.envs)})")
        return self

    def demonstrations_for(self, env_name: str) -> int:
        if isinstance(self.demonstrations, int):
            return self.demonstrations
        return self.demonstrations.get(env_name, 0)

    @property
    def text_only(self) -> bool:
        return not self.envs[0].endswith(_VISUAL_SUFFIX)


class Config(Section):
    model: ModelConfig = ModelConfig()
    env: EnvConfig = EnvConfig()
    rollout: RolloutConfig = RolloutConfig()
    analyzer: AnalyzerConfig = AnalyzerConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    generation: GenerationConfig = GenerationConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    collect: CollectConfig = CollectConfig()
    sft: SFTConfig = SFTConfig()
    warmstart: WarmstartConfig = WarmstartConfig()

    @model_validator(mode="after")
    def _sampler_logprobs_are_the_trainers(self) -> Config:
        if self.algorithm.old_logprobs == "sampler" and (self.generation.backend != "hf" or self.rollout.top_p < 1):
            raise ValueError(
                "algorithm.old_logprobs: 'sampler' needs generation.backend=hf and rollout.top_p=1 (otherwise the "
                "sampler's log-probs are not the trainer's l_old); use 'rescore'"
            )
        return self

    @model_validator(mode="after")
    def _embeds_need_a_frozen_tower(self) -> Config:
        if self.generation.image_embeds and not self.model.freeze_vision_tower:
            raise ValueError(
                "generation.image_embeds: cached image features need model.freeze_vision_tower=true"
            )
        return self


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = (), schema=Config):
    """Read a YAML recipe (or start from defaults), apply `a.b=value` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    for item in overrides:
        key, value = _parse_override(item)
        _set_nested(data, key, value)
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_first_error(err)) from None


def to_dict(config: BaseModel, redact: bool = True) -> dict[str, Any]:
    """Plain dict of a config, with secret-looking keys redacted (for files, logs and trackers)."""
    data = config.model_dump(mode="json")
    return redact_secrets(data) if redact else data


def save_config(config: BaseModel, path: str | os.PathLike) -> None:
    """Write the resolved config (secrets redacted) atomically beside a run's outputs."""
    atomic_write_text(Path(path), yaml.safe_dump(to_dict(config), sort_keys=False))


def is_secret_key(name: str) -> bool:
    """`api_key`, `hf_token`, `client_secret`...; not `max_new_tokens` (words are matched whole)."""
    return bool(_SECRET_WORD.search(name))


def redact_secrets(data: Any) -> Any:
    if isinstance(data, dict):
        return {
            k: (REDACTED if is_secret_key(str(k)) and v not in (None, "") else redact_secrets(v))
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [redact_secrets(v) for v in data]
    return data


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections")
    return data


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
        raise ConfigError(f"bad override '{item}': expected section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _set_nested(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "config"
    kind = first["type"]
    if kind == "extra_forbidden":
        return f"{loc}: unknown key"
    if kind == "missing":
        return f"{loc}: required key is missing"
    msg = first["msg"].removeprefix("Value error, ")
    given = first.get("input")
    shown = "" if isinstance(given, (dict, list)) else f" (got {given!r})"
    return f"{loc}: {msg}{shown}"
