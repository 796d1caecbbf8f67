"""Generation backends: one interface for every sampler of the package (rollouts, evaluation, stage-1
collection, the self analyzer), all of which call `Policy.generate`.

A `GenerationRequest` is one context already encoded by the policy's processor (prompt ids with every image
placeholder expanded, the images with their content keys and patch grids), its sampling settings and its own
seed; a `Generation` is the response's token ids, its text and the sampler's log-prob of each token under the
distribution it was drawn from (after temperature and top-p).

- `hf` (`HFBackend`, the default): transformers' `generate` on the policy's own weights, CPU or GPU.
- `vllm` (`VLLMBackend`): a colocated offline vLLM engine in the training process (GPU, the `vllm` extra,
  one pinned version). It starts from the checkpoint on disk; the policy's weights are pushed to it by name
  before the first generation and once after every update step (lazily, before the next generation), then
  its prefix and encoder caches are reset. With sleep mode it frees the GPU while the trainer scores and
  updates. Its prompts are the processor's ids with each image's placeholder run collapsed to one token,
  which vLLM's Qwen-VL processor expands again; the ids it reports back must equal ours (checked), or the
  trainer would score other positions than the engine sampled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image
from transformers import GenerationConfig as HFGenerationConfig
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from seed_vl.config import ConfigError, GenerationConfig
from seed_vl.prompt_cache import EncodedPrompt

if TYPE_CHECKING:
    from seed_vl.policy import Policy

logger = logging.getLogger(__name__)

VLLM_VERSION = "0.33.0"  # the one version the vLLM backend is written against (pyproject.toml's extra)
_SUPPRESSED_BIAS = -100.0  # vLLM clamps logit biases to [-100, 100]: e^-100 is as good as a ban


@dataclass
class Generation:
    """One sampled response. `token_ids` end at the token that completes the first stop string, or at the
    EOS token (kept: the choice to stop is an action token too, trained as in verl), or at
    `max_new_tokens`; `text` is their decoding without the EOS. `logprobs` (one per token, when the sampler
    reports them) are the sampler's own: rollout log-probs for the off-policy guard."""

    text: str
    token_ids: list[int]
    logprobs: list[float] | None = None


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling settings (greedy when `temperature == 0`)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()


@dataclass
class GenerationRequest:
    """One context for a backend: the processor's encoding, its images in order (aligned with the prompt's
    image keys), sampling settings and the request's own seed."""

    prompt: EncodedPrompt
    images: list[Image.Image]
    sampling: Sampling
    seed: int
    patches: dict[str, torch.Tensor] = field(default_factory=dict)  # pixel patches computed while encoding

    @property
    def prompt_ids(self) -> list[int]:
        return self.prompt.input_ids

    @property
    def image_keys(self) -> tuple[str, ...]:
        return self.prompt.image_keys

    @property
    def image_grid_thw(self) -> torch.Tensor | None:
        return self.prompt.image_grid_thw


class GenerationBackend:
    """What `Policy.generate` hands its requests to. Results come back in request order."""

    name = "base"

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        raise NotImplementedError

    def weights_updated(self) -> None:
        """The policy's weights changed (an update step, a weight load)."""

    def sleep(self) -> None:
        """Generation is over until the next `generate`: free what the engine holds on the device."""


# ------------------------------------------------------------------------------------------------- hf
class PerSampleGumbel(LogitsProcessor):
    """Exact categorical sampling as argmax(scores + Gumbel noise), with one generator per row, so a
    row's sample depends only on its own context and seed, never on what else is in the batch."""

    def __init__(self, seeds: Sequence[int], device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        uniform = torch.stack(
            [torch.rand(scores.shape[-1], generator=g, device=scores.device) for g in self.generators]
        )
        tiny = torch.finfo(uniform.dtype).tiny
        return scores + -torch.log(-torch.log(uniform.clamp(tiny, 1.0 - 1e-7)))


class SamplerLogprobs(LogitsProcessor):
    """Records the log-prob of each sampled token under the processed scores it sees (placed after the
    temperature and top-p warpers, before the Gumbel noise), without changing them. The token drawn at a
    step is known at the next call (or, for the last step, from the output): one step's scores are kept."""

    def __init__(self) -> None:
        self._columns: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self._gather(input_ids[:, -1])
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _gather(self, tokens: torch.Tensor) -> None:
        self._columns.append(self._pending.gather(-1, tokens[:, None].to(self._pending.device))[:, 0])
        self._pending = None

    def finish(self, new_tokens: torch.Tensor) -> list[list[float]]:
        """Per-row log-probs of `new_tokens` [B, T], the generated part of the output."""
        if self._pending is not None:
            self._gather(new_tokens[:, len(self._columns)])
        if not self._columns:
            return [[] for _ in range(new_tokens.shape[0])]
        return torch.stack(self._columns, dim=1).cpu().tolist()


class HFBackend(GenerationBackend):
    """transformers' `generate` on the policy's own model, one batched call per distinct sampling setting.
    Sampling is the Gumbel warper's argmax, seeded per row."""

    name = "hf"

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        results: list[Generation | None] = [None] * len(requests)
        groups: dict[Sampling, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(request.sampling, []).append(i)
        for sampling, indices in groups.items():
            for i, generation in zip(indices, self._generate([requests[i] for i in indices], sampling), strict=True):
                results[i] = generation
        return results

    @torch.no_grad()
    def _generate(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Generation]:
        policy = self.policy
        inputs = policy.generation_inputs(requests)
        warpers = LogitsProcessorList()
        if sampling.temperature > 0:
            warpers.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_p < 1.0:
                warpers.append(TopPLogitsWarper(sampling.top_p))
        recorder = SamplerLogprobs()
        warpers.append(recorder)
        if sampling.temperature > 0:
            warpers.append(PerSampleGumbel([r.seed for r in requests], policy.device))
        config = HFGenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=False,  # sampling is the Gumbel warper's argmax, seeded per row
            num_beams=1,
            repetition_penalty=1.0,
            eos_token_id=policy.eos_token_ids,
            pad_token_id=policy.pad_token_id,
            suppress_tokens=policy.vision_token_ids or None,  # a response never holds image placeholders
            stop_strings=list(sampling.stop_strings) or None,
        )
        with policy.autocast():
            # Each process generates on its own, however many turns its episodes take (FSDP2 shards are
            # gathered beforehand: `Runtime.full_weights`), so transformers must not lock-step processes.
            output = policy.model.generate(
                **inputs, generation_config=config, logits_processor=warpers, tokenizer=policy.tokenizer,
                synced_gpus=False,
            )
        new_tokens = output[:, inputs["input_ids"].shape[1] :]
        logprobs = recorder.finish(new_tokens)
        return [
            policy.cut_response(ids, sampling.stop_strings, lps)
            for ids, lps in zip(new_tokens.tolist(), logprobs, strict=True)
        ]


# ----------------------------------------------------------------------------------------------- vllm
def import_vllm() -> Any:
    """The `vllm` module, imported only when the backend is chosen; a one-line error when it is missing."""
    try:
        import vllm
    except ImportError:
        raise ConfigError(
            f"generation.backend: vllm is not installed (pip install 'seed-vl[vllm]', vllm=={VLLM_VERSION}, GPU only)"
        ) from None
    version = getattr(vllm, "__version__", "unknown")
    if version != VLLM_VERSION:
        logger.warning("generation.backend=vllm is written against vllm %s; found %s", VLLM_VERSION, version)
    return vllm


class VLLMBackend(GenerationBackend):
    """A colocated offline vLLM engine (`vllm.LLM`, in this process) sampling for the policy."""

    name = "vllm"

    def __init__(self, policy: Policy, config: GenerationConfig, model_path: str, seed: int = 0) -> None:
        self.policy = policy
        self.config = config
        self.model_path = str(model_path)
        self.seed = seed
        self._vllm = import_vllm()
        self._engine: Any = None  # built on first use
        self._stale = True  # the engine loads the checkpoint on disk; the policy may differ (resume, adapters)
        self._asleep = False
        self.pushes = 0  # weight pushes so far
        tokenizer = policy.tokenizer
        self._image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>") if policy.is_vision else None
        self._bias = {int(t): _SUPPRESSED_BIAS for t in policy.vision_token_ids} or None

    @property
    def engine(self) -> Any:
        if self._engine is None:
            self._engine = self._build_engine()
        return self._engine

    def _engine_kwargs(self) -> dict[str, Any]:
        cfg, policy = self.config, self.policy
        kwargs: dict[str, Any] = {
            "model": self.model_path,
            "tokenizer": self.model_path,
            "dtype": str(policy.compute_dtype).removeprefix("torch."),
            "seed": self.seed,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "enforce_eager": cfg.enforce_eager,
            "enable_sleep_mode": cfg.enable_sleep_mode,
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",  # after temperature and top-p: what the token was drawn from
            "generation_config": "vllm",  # the checkpoint's sampling defaults never apply
        }
        if cfg.max_model_len is not None:
            kwargs["max_model_len"] = cfg.max_model_len
        if policy.is_vision:
            settings = policy.image_settings
            kwargs["limit_mm_per_prompt"] = {"image": cfg.max_images_per_prompt, "video": 0}
            # The same pixel budget as our processor: the same patch grids, so the same placeholder counts.
            kwargs["mm_processor_kwargs"] = {"min_pixels": settings.min_pixels, "max_pixels": settings.max_pixels}
            kwargs["enable_mm_embeds"] = cfg.image_embeds
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one engine per training process, in its process group
            kwargs["distributed_executor_backend"] = "external_launcher"
        return kwargs

    def _build_engine(self) -> Any:
        # In-process engine core: `apply_model` then runs our weight loader directly, with no pickling.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        with _preserved_rng():  # the engine seeds the global RNGs; the trainer's stream must not move
            return self._vllm.LLM(**self._engine_kwargs())

    # ----------------------------------------------------------------------------------- weights
    def weights_updated(self) -> None:
        self._stale = True

    def sleep(self) -> None:
        if self.config.enable_sleep_mode and self._engine is not None and not self._asleep:
            self._engine.sleep(level=1)
            self._asleep = True

    def _ready(self) -> Any:
        """Awake, with the policy's current weights, caches from older weights dropped."""
        engine = self.engine
        if self._asleep:
            engine.wake_up(tags=["weights"])  # weights first: the push needs them, the KV cache not yet
        pushed = self._stale
        if pushed:
            self._push(engine)
        if self._asleep:
            engine.wake_up(tags=["kv_cache"])
            self._asleep = False
        if pushed:
            engine.reset_prefix_cache()  # KV blocks computed with the old weights
            engine.llm_engine.reset_encoder_cache()  # vision embeddings computed with the old weights
        return engine

    def _push(self, engine: Any) -> None:
        dtype = self.policy.compute_dtype
        weights = ((name, tensor.to(dtype)) for name, tensor in self.policy.checkpoint_weights())
        engine.apply_model(lambda model: model.load_weights(weights))  # in process: one worker, no pickling
        self._stale = False
        self.pushes += 1

    # -------------------------------------------------------------------------------- generation
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        engine = self._ready()
        prompts = [self._prompt(r) for r in requests]
        params = [self._params(r) for r in requests]
        outputs = engine.generate(prompts, params, use_tqdm=False)
        results = []
        for request, output in zip(requests, outputs, strict=True):
            _check_prompt(list(output.prompt_token_ids), request.prompt_ids)
            completion = output.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            logprobs = [float(position[t].logprob) for t, position in zip(ids, completion.logprobs, strict=True)]
            results.append(self.policy.cut_response(ids, request.sampling.stop_strings, logprobs))
        return results

    def _prompt(self, request: GenerationRequest) -> dict[str, Any]:
        prompt: dict[str, Any] = {"prompt_token_ids": collapse_placeholders(request.prompt_ids, self._image_pad)}
        if request.image_keys:
            if self.config.image_embeds:
                embeds = self.policy.image_embeddings(request)
                data: Any = {"image_embeds": embeds, "image_grid_thw": request.image_grid_thw}
            else:
                data = list(request.images)
            prompt["multi_modal_data"] = {"image": data}
            # Our content keys stand in for vLLM's hashes: its processor and encoder caches hit across
            # turns and across a group without hashing pixels again.
            prompt["multi_modal_uuids"] = {"image": list(request.image_keys)}
        return prompt

    def _params(self, request: GenerationRequest) -> Any:
        s = request.sampling
        return self._vllm.SamplingParams(
            n=1,
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_new_tokens,
            seed=int(request.seed),
            logprobs=0,  # the sampled token's own log-prob
            stop=list(s.stop_strings) or None,
            include_stop_str_in_output=True,
            stop_token_ids=list(self.policy.eos_token_ids),
            skip_special_tokens=True,
            logit_bias=self._bias,  # a response never holds image placeholders (the hf path suppresses them)
        )


def collapse_placeholders(ids: Sequence[int], image_pad: int | None) -> list[int]:
    """The processor's ids with each run of image placeholders cut to one token: the chat template's form,
    which vLLM's Qwen-VL processor expands to grid_thw.prod() // merge_size**2 tokens per image itself
    (given expanded ids, it would expand them again)."""
    if image_pad is None:
        return list(ids)
    out: list[int] = []
    for token in ids:
        if token != image_pad or not out or out[-1] != image_pad:
            out.append(int(token))
    return out


def _check_prompt(engine_ids: list[int], ours: list[int]) -> None:
    if engine_ids != ours:
        at = next((k for k, (a, b) in enumerate(zip(engine_ids, ours, strict=False)) if a != b), min(len(engine_ids), len(ours)))
        raise RuntimeError(
            f"vllm: the engine's prompt ({len(engine_ids)} ids) differs from the processor's ({len(ours)} ids) "
            f"from position {at}: image placeholders were expanded differently (model.min_pixels/max_pixels?)"
        )


@contextlib.contextmanager
def _preserved_rng() -> Iterator[None]:
    """Python's, NumPy's and torch's global RNG states are restored on exit."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def make_backend(policy: Policy, config: GenerationConfig | None, model_path: str, seed: int = 0) -> GenerationBackend:
    """The backend `generation.backend` names, for `policy`."""
    if config is None or config.backend == "hf":
        return HFBackend(policy)
    return VLLMBackend(policy, config, model_path, seed)
