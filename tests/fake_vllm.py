"""A recording stand-in for the part of vLLM 0.33.0 that `seed_vl.generation.VLLMBackend` uses, so the
backend and the trainer run end to end on the CPU. Installed as the `vllm` module (`install`).

It does what the real engine does with what it is given, on the tiny HF model loaded from the same
checkpoint path: expands each image's single `<|image_pad|>` to grid_thw.prod() // merge_size**2 tokens with
its own image processor (or from the `image_grid_thw` of passed embeddings) and reports the expanded ids in
`RequestOutput.prompt_token_ids`; samples with its own seeded generator after logit bias, temperature and
top-p, returning the processed log-prob of each token (`logprobs_mode="processed_logprobs"`); stops at stop
token ids (kept) and stop strings (the token completing one is the last); loads pushed weights by checkpoint
name. It records every engine construction, generation, weight load, cache reset, sleep and wake in `events`,
and refuses to generate asleep or to load weights into slept weights.

Surface mirrored (signatures copied from the vllm-0.33.0 wheel; tests/test_generation.py compares them with
`inspect.signature` wherever vllm is importable):
- `LLM.__init__`            vllm/entrypoints/llm.py:177
- `LLM.generate`            vllm/entrypoints/llm.py:417
- `LLM.apply_model`         vllm/entrypoints/llm.py:604
- `LLM.reset_prefix_cache`  vllm/entrypoints/llm.py:832
- `LLM.sleep`               vllm/entrypoints/llm.py:839
- `LLM.wake_up`             vllm/entrypoints/llm.py:872
- `LLM.llm_engine`          vllm/entrypoints/llm.py:341, a `vllm.v1.engine.llm_engine.LLMEngine`
- `LLMEngine.reset_encoder_cache`  vllm/v1/engine/llm_engine.py:412
- `model.load_weights`      vllm/model_executor/models/qwen2_5_vl.py:2121 (what `apply_model` hands over)
- `SamplingParams`          vllm/sampling_params.py:271 (a msgspec Struct; the fields used here, same defaults)
- `RequestOutput`           vllm/outputs.py:137 (`__init__` at :169)
- `CompletionOutput`        vllm/outputs.py:58
- `Logprob`                 vllm/logprobs.py:13
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    LogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)
from transformers.core_model_loading import revert_weight_conversion

from seed_vl.vision_cache import ImageEncoding, ImageFeatures

__version__ = "0.33.0"
_SAMPLING_EPS = 1e-5  # vllm/sampling_params.py: below it, greedy


def install(monkeypatch) -> Any:
    """Make `import vllm` return this module for the test's duration."""
    module = sys.modules[__name__]
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: Sequence[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    routed_experts: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any = None
    sampling_mask: Any = None
    spec_decode_metrics: Any = None
    weight_versions: Any = None


class RequestOutput:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int] | None,
        prompt_logprobs: Any,
        outputs: list[CompletionOutput],
        finished: bool,
        metrics: Any = None,
        lora_request: Any = None,
        encoder_prompt: str | None = None,
        encoder_prompt_token_ids: list[int] | None = None,
        num_cached_tokens: int | None = None,
        num_cache_creation_tokens: int | None = None,
        *,
        prompt_token_id_logprobs: Any = None,
        kv_transfer_params: dict[str, Any] | None = None,
        ec_transfer_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished


@dataclass(kw_only=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        if self.stop and not self.detokenize:  # sampling_params.py:737
            raise ValueError("stop strings are only supported when detokenize is True")
        if self.logit_bias:
            self.logit_bias = {int(t): min(100.0, max(-100.0, b)) for t, b in self.logit_bias.items()}


class LLMEngine:
    def __init__(self, llm: LLM) -> None:
        self._llm = llm

    def reset_encoder_cache(self) -> None:
        self._llm.events.append(("reset_encoder_cache",))


class _Model:
    """What `apply_model` hands a function: vLLM's model, here only its weight loader."""

    def __init__(self, llm: LLM) -> None:
        self._llm = llm

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        llm = self._llm
        if "weights" in llm.asleep:
            raise RuntimeError("fake vllm: weights loaded while the engine's weights sleep")
        loaded, shapes = set(), {}
        for name, tensor in weights:
            if name not in llm.weights:
                raise ValueError(f"fake vllm: no parameter named {name}")
            target = llm.weights[name]
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(f"fake vllm: {name} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
            with torch.no_grad():
                target.copy_(tensor)
            loaded.add(name)
            shapes[name] = tuple(tensor.shape)
        llm.events.append(("load_weights", shapes))
        return loaded


class _Sampler(LogitsProcessor):
    """Draws one token per step from the processed scores with the request's own generator, records its
    processed log-prob, and leaves only that token finite (so `generate`'s argmax takes it)."""

    def __init__(self, seed: int | None, greedy: bool) -> None:
        self.generator = torch.Generator().manual_seed(seed if seed is not None else 0)
        self.greedy = greedy
        self.logprobs: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logprobs = torch.log_softmax(scores.float(), dim=-1)[0]
        if self.greedy:
            token = int(logprobs.argmax())
        else:
            token = int(torch.multinomial(logprobs.exp(), 1, generator=self.generator))
        self.logprobs.append(float(logprobs[token]))
        out = torch.full_like(scores, float("-inf"))
        out[0, token] = 0.0
        return out


class _Bias(LogitsProcessor):
    def __init__(self, bias: dict[int, float]) -> None:
        self.bias = bias

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        for token, value in self.bias.items():
            scores[:, token] += value
        return scores


class LLM:
    def __init__(
        self,
        model: str,
        *,
        runner: Any = "auto",
        convert: Any = "auto",
        tokenizer: str | None = None,
        tokenizer_mode: Any = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        allowed_local_media_path: str = "",
        allowed_media_domains: list[str] | None = None,
        tensor_parallel_size: int = 1,
        dtype: Any = "auto",
        quantization: Any = None,
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        chat_template: Any = None,
        seed: int = 0,
        gpu_memory_utilization: float = 0.92,
        cpu_offload_gb: float = 0,
        offload_group_size: int = 0,
        offload_num_in_group: int = 1,
        offload_prefetch_step: int = 1,
        offload_params: set[str] | None = None,
        enforce_eager: bool = False,
        enable_return_routed_experts: bool = False,
        return_sampling_mask: bool = False,
        disable_custom_all_reduce: bool = False,
        hf_token: bool | str | None = None,
        hf_overrides: Any = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        pooler_config: Any = None,
        structured_outputs_config: Any = None,
        profiler_config: Any = None,
        attention_config: Any = None,
        kv_cache_memory_bytes: int | None = None,
        compilation_config: Any = None,
        quantization_config: Any = None,
        logits_processors: Any = None,
        spec_method: str | None = None,
        spec_model: str | None = None,
        spec_tokens: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.init_kwargs = {
            "model": model, "tokenizer": tokenizer, "dtype": dtype, "seed": seed,
            "gpu_memory_utilization": gpu_memory_utilization, "enforce_eager": enforce_eager,
            "mm_processor_kwargs": mm_processor_kwargs, **kwargs,
        }
        self.events: list[tuple] = [("init",)]
        self.asleep: set[str] = set()
        self.llm_engine = LLMEngine(self)
        torch.manual_seed(seed)  # as the real engine does, in process: callers must protect their RNG
        is_vision = hasattr(AutoConfig.from_pretrained(model), "vision_config")
        self.processor = (AutoProcessor if is_vision else AutoTokenizer).from_pretrained(tokenizer or model)
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        if is_vision and mm_processor_kwargs:
            size = self.processor.image_processor.size
            size.shortest_edge = mm_processor_kwargs.get("min_pixels", size.shortest_edge)
            size.longest_edge = mm_processor_kwargs.get("max_pixels", size.longest_edge)
        model_class = AutoModelForImageTextToText if is_vision else AutoModelForCausalLM
        self.model = model_class.from_pretrained(model, dtype=torch.float32, device_map="cpu").eval()
        self.model.requires_grad_(False)
        self.is_vision = is_vision
        # Checkpoint names -> this model's tensors (renamings only: the same storage).
        self.weights = revert_weight_conversion(self.model, dict(self.model.state_dict()))
        self.limit_images = (kwargs.get("limit_mm_per_prompt") or {}).get("image", 999)

    # ------------------------------------------------------------------------------------ control
    def apply_model(self, func: Callable[[torch.nn.Module], Any]) -> list[Any]:
        return [func(_Model(self))]

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.events.append(("reset_prefix_cache",))
        return True

    def sleep(self, level: int = 1, mode: str = "abort"):
        self.events.append(("sleep", level))
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.events.append(("wake_up", tuple(tags) if tags else None))
        self.asleep -= set(tags) if tags else set(self.asleep)
        return not self.asleep

    def count(self, kind: str) -> int:
        return sum(event[0] == kind for event in self.events)

    # --------------------------------------------------------------------------------- generation
    def generate(
        self,
        prompts: Any,
        sampling_params: Any = None,
        *,
        use_tqdm: Any = True,
        lora_request: Any = None,
        priority: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        if self.asleep:
            raise RuntimeError(f"fake vllm: generate while asleep ({sorted(self.asleep)})")
        prompts = list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        self.events.append(("generate", [dict(p.get("multi_modal_uuids") or {}) for p in prompts]))
        self.last_outputs = [self._one(str(i), prompt, p) for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))]
        return self.last_outputs

    @torch.no_grad()
    def _one(self, request_id: str, prompt: dict[str, Any], params: SamplingParams) -> RequestOutput:
        ids, inputs = self._expand(prompt)
        greedy = params.temperature < _SAMPLING_EPS
        sampler = _Sampler(params.seed, greedy)
        processors = [_Bias(params.logit_bias)] if params.logit_bias else []
        if not greedy:
            processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
        eos = [] if params.ignore_eos else list(params.stop_token_ids or []) + [self.tokenizer.eos_token_id]
        output = self.model.generate(
            **inputs, max_new_tokens=params.max_tokens, do_sample=False, num_beams=1,
            logits_processor=[*processors, sampler], eos_token_id=eos or None,
            pad_token_id=self.tokenizer.pad_token_id or 0,
        )
        tokens = output[0, len(ids) :].tolist()
        finish, stop_reason = "length", None
        if tokens and tokens[-1] in eos:
            finish = "stop"
        text = self.tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens)
        stops = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        for k in range(1, len(tokens) + 1):  # the first token whose text completes a stop string ends it
            partial = self.tokenizer.decode(tokens[:k], skip_special_tokens=params.skip_special_tokens)
            hit = next((s for s in stops if s in partial), None)
            if hit is not None:
                end = partial.index(hit) + (len(hit) if params.include_stop_str_in_output else 0)
                tokens, text, finish, stop_reason = tokens[:k], partial[:end], "stop", hit
                break
        logprobs = [{t: Logprob(lp, rank=1)} for t, lp in zip(tokens, sampler.logprobs, strict=False)]
        completion = CompletionOutput(
            index=0, text=text, token_ids=tokens, cumulative_logprob=sum(sampler.logprobs[: len(tokens)]),
            logprobs=logprobs, finish_reason=finish, stop_reason=stop_reason,
        )
        return RequestOutput(request_id, None, ids, None, [completion], True)

    def _expand(self, prompt: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
        """The prompt as the engine runs it: each image's one placeholder expanded to its feature count."""
        ids = list(prompt["prompt_token_ids"])
        data = (prompt.get("multi_modal_data") or {}).get("image")
        if data is None:
            tensor = torch.tensor([ids])
            return ids, {"input_ids": tensor, "attention_mask": torch.ones_like(tensor)}
        extra: dict[str, Any] = {}
        if isinstance(data, dict):  # precomputed features: vllm needs enable_mm_embeds
            if not self.init_kwargs.get("enable_mm_embeds"):
                raise ValueError("You must set --enable-mm-embeds to input image_embeds")
            grid = data["image_grid_thw"]
            per_image = (grid.prod(-1) // self.processor.image_processor.merge_size**2).tolist()
            embeds = data["image_embeds"].split(per_image)
            extra["mm_encoder_outputs"] = {"image": ImageFeatures.from_encodings([ImageEncoding(e, ()) for e in embeds])}
        else:
            images = data if isinstance(data, list) else [data]
            processed = self.processor.image_processor(images=images, return_tensors="pt")
            grid = processed["image_grid_thw"]
            extra["pixel_values"] = processed["pixel_values"]
        uuids = (prompt.get("multi_modal_uuids") or {}).get("image")
        if uuids is not None and len(uuids) != len(grid):
            raise ValueError("fake vllm: one uuid per image")
        if len(grid) > self.limit_images:
            raise ValueError(f"fake vllm: {len(grid)} images exceed limit_mm_per_prompt {self.limit_images}")
        pad = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        merge = self.processor.image_processor.merge_size**2
        if ids.count(pad) != len(grid):
            raise RuntimeError(
                f"Expected there to be {len(grid)} prompt updates corresponding to {len(grid)} image items, "
                f"but instead found {ids.count(pad)} prompt updates!"
            )
        expanded, k = [], 0
        for token in ids:
            if token == pad:
                expanded += [pad] * (int(grid[k].prod()) // merge)
                k += 1
            else:
                expanded.append(token)
        tensor = torch.tensor([expanded])
        inputs = {
            "input_ids": tensor,
            "attention_mask": torch.ones_like(tensor),
            "mm_token_type_ids": (tensor == pad).long(),
            "image_grid_thw": grid,
            **extra,
        }
        return expanded, inputs

