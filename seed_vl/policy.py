"""The policy wrapper: one object over any HF causal LM or image-text-to-text model and its processor.

A context is a list of chat messages whose content is a string or a list of `{"type": "text", "text": ...}`
and `{"type": "image", "image": PIL.Image}` items. `generate` samples responses to contexts; `score` returns
the per-token log-probs (and entropies) of given response token ids, which follow the templated prompt
(with the generation prompt) directly. Both calls work the same for text-only and vision-language models.

Vision-language models get their image features from the wrapper's `VisionCache` through the
`mm_encoder_outputs` argument that transformers' Qwen-VL `forward` and `generate` accept, so every unique
frame is encoded once until the weights change (`on_weights_updated`).

Precision (DESIGN §5): a trainable policy keeps its weights in float32 and runs every forward under autocast
in `compute_dtype`, so an optimizer step of 1e-6 is not rounded away; a frozen policy (the reference, or the
base weights under LoRA) is held in `compute_dtype` itself, and so is a frozen vision tower. Gradient
checkpointing, when enabled, acts in update passes (`update_mode()`) and nowhere else; the model otherwise
stays in eval mode, so dropout never fires outside LoRA's own.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from packaging.version import Version
from PIL import Image
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    PreTrainedModel,
)
from transformers.utils import is_flash_attn_2_available

from seed_vl.config import ConfigError, GenerationConfig, LoraConfig, ModelConfig
from seed_vl.generation import (
    Generation,
    GenerationBackend,
    GenerationRequest,
    HFBackend,
    Sampling,
    import_vllm,
    make_backend,
)
from seed_vl.processors.images import ImageSettings
from seed_vl.prompt_cache import EncodedPrompt, PromptCache
from seed_vl.vision_cache import ImageEncoding, ImageFeatures, VisionCache, image_key

Context = list[dict[str, Any]]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_MIN_TRANSFORMERS = Version("5.18")  # the first Qwen-VL forward with `mm_encoder_outputs` (pyproject.toml)
_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


@dataclass
class ScoreOutput:
    logprobs: list[torch.Tensor]  # one 1-D tensor per sample, one entry per response token
    entropies: list[torch.Tensor] | None  # same shapes; entropy of the full next-token distribution


@dataclass
class _EncodedBatch:
    """A padded batch of encoded contexts; pixel patches of its images on demand (`pixels`)."""

    tensors: dict[str, torch.Tensor]  # input_ids, attention_mask, [mm_token_type_ids, image_grid_thw]
    image_keys: list[str]  # every image occurrence, in order
    images: dict[str, Image.Image]  # image key -> the image
    fresh_pixels: dict[str, torch.Tensor]  # image key -> patches the processor computed for this batch

    def pixels(self, key: str, processor: Any) -> torch.Tensor:
        if key not in self.fresh_pixels:
            output = processor.image_processor(images=[self.images[key]], return_tensors="pt")
            self.fresh_pixels[key] = output["pixel_values"]
        return self.fresh_pixels[key]


class Policy:
    """An HF model plus its processor (or tokenizer), with batched generation and scoring."""

    def __init__(
        self,
        model: PreTrainedModel,
        processor: Any,
        *,
        compute_dtype: torch.dtype | None = None,
        freeze_vision_tower: bool = True,
        vision_cache_max_entries: int = 4096,
        vision_cache: VisionCache | None = None,
        seed: int = 0,
    ) -> None:
        """`vision_cache` shares another policy's cache, e.g. the reference model's: valid only while both
        vision towers hold the same weights (frozen towers loaded from one checkpoint). `compute_dtype`
        defaults to the weights' dtype (no autocast)."""
        self._model = model
        self.compute_dtype = compute_dtype if compute_dtype is not None else model.dtype
        self._update_mode_modules = [
            m
            for name, m in model.named_modules()
            if getattr(m, "gradient_checkpointing", False)
            or (".lora_dropout." in name and isinstance(m, torch.nn.Dropout))
        ]
        self._forward_module: torch.nn.Module = model
        self._processor = processor
        self._tokenizer = getattr(processor, "tokenizer", processor)
        self.is_vision = hasattr(processor, "image_processor") and hasattr(model, "get_image_features")
        self.cache = vision_cache if vision_cache is not None else VisionCache(vision_cache_max_entries)
        self._prompts = PromptCache()  # encodings do not depend on the weights: never stale
        self._rng = torch.Generator().manual_seed(seed)  # draws per-sample seeds when the caller gives none
        self.vision_tower_trainable = self.is_vision and not freeze_vision_tower
        if self.is_vision:
            if freeze_vision_tower:
                model.get_encoder(modality="image").requires_grad_(False)
            settings = processor.image_processor.to_json_string()
            self._image_settings = hashlib.sha1(settings.encode()).hexdigest()
        tokenizer = self._tokenizer
        self._pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}
        self._eos_ids = sorted(i for i in eos_ids if i is not None)
        unk = tokenizer.unk_token_id
        vision_ids = {tokenizer.convert_tokens_to_ids(t) for t in _VISION_TOKENS} - {None, unk}
        self._vision_token_ids = sorted(vision_ids) if self.is_vision else []
        # Every sampler of the package goes through `generate` and this backend (`generation.backend`).
        self.generation_backend: GenerationBackend = HFBackend(self)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        dtype: str = "float32",
        trainable: bool = True,
        device: str = "auto",
        attn_implementation: str = "sdpa",
        freeze_vision_tower: bool = True,
        gradient_checkpointing: bool = False,
        lora: LoraConfig | None = None,
        adapter_path: str | os.PathLike | None = None,
        vision_cache_max_entries: int = 4096,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        vision_cache: VisionCache | None = None,
        seed: int = 0,
    ) -> Policy:
        """Load a local HF checkpoint (vision-language when its config has a `vision_config`).

        `dtype` is the compute dtype. `trainable` keeps float32 master weights (mixed precision); a policy
        that never steps an optimizer (evaluation, collection, the reference) is loaded in `dtype`. With
        `lora`, the base weights are frozen in `dtype` and fresh adapters train in float32, or the adapters
        saved in `adapter_path` are loaded."""
        path = Path(path)
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"model.path: {path} is not a Hugging Face checkpoint directory (no config.json)"
            )
        if dtype not in _DTYPES:
            raise ConfigError(f"model.dtype: {dtype!r} is not one of {', '.join(_DTYPES)}")
        if attn_implementation == "flash_attention_2" and not is_flash_attn_2_available():
            raise ConfigError(
                "model.attn_implementation: flash_attention_2 needs the flash-attn package and a GPU"
            )
        if Version(transformers.__version__) < _MIN_TRANSFORMERS:
            raise ConfigError(
                f"transformers {transformers.__version__} is too old: seed-vl needs >= {_MIN_TRANSFORMERS} "
                "(earlier Qwen-VL models ignore the image cache's features)"
            )
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        compute_dtype = _DTYPES[dtype]
        lora = lora if trainable else None  # a frozen policy never gets fresh (identity) adapters
        if lora is not None and not freeze_vision_tower:
            raise ConfigError("model.lora: adapters go on the language model only; set model.freeze_vision_tower=true")
        adapted = lora is not None or adapter_path is not None
        weights_dtype = torch.float32 if trainable and not adapted else compute_dtype
        is_vision = hasattr(AutoConfig.from_pretrained(path), "vision_config")
        model_class = AutoModelForImageTextToText if is_vision else AutoModelForCausalLM
        model = model_class.from_pretrained(
            path, dtype=weights_dtype, attn_implementation=attn_implementation, device_map=device
        )
        if gradient_checkpointing:
            _enable_checkpointing(model)
        if adapted:
            model = _with_adapters(model, lora, adapter_path, trainable, exclude_vision_tower=is_vision)
        if is_vision and freeze_vision_tower:  # a frozen tower is held in the compute dtype
            model.get_encoder(modality="image").to(compute_dtype)
        if is_vision:
            processor = AutoProcessor.from_pretrained(path)
            size = processor.image_processor.size  # transformers' names for Qwen's min/max pixels
            if min_pixels is not None:
                size.shortest_edge = min_pixels
            if max_pixels is not None:
                size.longest_edge = max_pixels
        else:
            processor = AutoTokenizer.from_pretrained(path)
        if not trainable:
            model.requires_grad_(False)
        return cls(
            model.eval(),
            processor,
            compute_dtype=compute_dtype,
            freeze_vision_tower=freeze_vision_tower,
            vision_cache_max_entries=vision_cache_max_entries,
            vision_cache=vision_cache,
            seed=seed,
        )

    @classmethod
    def from_config(
        cls,
        config: ModelConfig,
        path: str | os.PathLike | None = None,
        *,
        trainable: bool = True,
        adapter_path: str | os.PathLike | None = None,
        vision_cache: VisionCache | None = None,
        seed: int = 0,
        generation: GenerationConfig | None = None,
    ) -> Policy:
        """`from_pretrained` with a recipe's `model` section (`path` overrides `config.path`), sampling
        through the backend the recipe's `generation` section names (default: hf)."""
        path = config.path if path is None else path
        if generation is not None and generation.backend == "vllm":
            import_vllm()  # a missing extra fails before minutes of model loading
        policy = cls.from_pretrained(
            path,
            dtype=config.dtype,
            trainable=trainable,
            device=config.device,
            attn_implementation=config.attn_implementation,
            freeze_vision_tower=config.freeze_vision_tower,
            gradient_checkpointing=config.gradient_checkpointing and trainable,
            lora=config.lora,
            adapter_path=adapter_path,
            vision_cache_max_entries=config.vision_cache_max_entries,
            min_pixels=config.min_pixels,
            max_pixels=config.max_pixels,
            vision_cache=vision_cache,
            seed=seed,
        )
        policy.generation_backend = make_backend(policy, generation, str(path), seed)
        return policy

    @property
    def image_settings(self) -> ImageSettings | None:
        """The pixel budget frames are resized to before they reach the processor (None: text-only model)."""
        if not self.is_vision:
            return None
        size = self._processor.image_processor.size
        return ImageSettings(min_pixels=size.shortest_edge, max_pixels=size.longest_edge)

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    @property
    def processor(self) -> Any:
        return self._processor

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def device(self) -> torch.device:
        return self._model.device

    @property
    def has_adapters(self) -> bool:
        return hasattr(self._model, "disable_adapter")

    def autocast(self):
        """Forward passes compute in `compute_dtype`, whatever dtype the weights are kept in."""
        if self.compute_dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    @contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Score with the base weights: under LoRA, the reference policy without a second model in memory."""
        if not self.has_adapters:
            raise ValueError("adapters_disabled: this policy has no LoRA adapters")
        with self._model.disable_adapter():
            yield

    @contextmanager
    def update_mode(self) -> Iterator[None]:
        """Wrap an update pass, its forward and its backward: training-mode flags on exactly the modules
        whose behaviour should change there, the checkpointed layers (transformers checkpoints only in
        training mode) and LoRA's dropout, which the backward's recompute must see as the forward did. The
        rest stays in eval mode, so attention and hidden dropout keep their eval semantics."""
        previous = [m.training for m in self._update_mode_modules]
        for m in self._update_mode_modules:
            m.training = True
        try:
            yield
        finally:
            for m, flag in zip(self._update_mode_modules, previous, strict=True):
                m.training = flag

    def set_forward_module(self, module: torch.nn.Module) -> None:
        """Run scoring forwards through `module`, e.g. the DDP wrapper `accelerate` returns for the model,
        so gradients synchronise; generation and image encoding keep using the bare model."""
        self._forward_module = module

    def on_weights_updated(self) -> None:
        """Call after every update step or weight load: cached image features are stale, and so are the
        generation engine's weights (a vLLM engine gets them pushed before it next generates)."""
        self.cache.clear()
        self.generation_backend.weights_updated()

    def save_pretrained(self, out_dir: str | os.PathLike, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Model (safetensors, in the compute dtype) and processor in ordinary Hugging Face format, loadable
        by `from_pretrained`; under LoRA, the adapters only (`seed-vl export` merges them). `state_dict`
        overrides the model's own, e.g. full tensors gathered from FSDP2 shards."""
        if self.has_adapters:
            self._model.save_pretrained(out_dir, state_dict=state_dict, safe_serialization=True)
        else:
            _save_in_dtype(self._model, out_dir, self.compute_dtype, state_dict)
        self._processor.save_pretrained(out_dir)

    def save_merged(self, out_dir: str | os.PathLike) -> None:
        """The LoRA adapters merged into the base weights, saved as a plain checkpoint in the compute dtype."""
        model = self._model.merge_and_unload() if self.has_adapters else self._model
        _save_in_dtype(model, out_dir, self.compute_dtype)
        self._processor.save_pretrained(out_dir)

    # ----------------------------------------------------------------------------------------------
    # generation

    @torch.no_grad()
    def generate(
        self,
        contexts: Sequence[Context],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_strings: Sequence[str] = ("</action>",),
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Sample one response per context (greedy when `temperature == 0`). Sample i depends only on
        context i and `seeds[i]`; without `seeds`, seeds come from the policy's own seeded generator."""
        if not contexts:
            return []
        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(contexts),), generator=self._rng).tolist()
        if len(seeds) != len(contexts):
            raise ValueError(f"seeds: got {len(seeds)} seeds for {len(contexts)} contexts")
        sampling = Sampling(max_new_tokens, temperature, top_p, tuple(stop_strings))
        prompts, images, patches = self._encode_contexts(contexts)
        requests = [
            GenerationRequest(
                prompt=prompt,
                images=[images[key] for key in prompt.image_keys],
                sampling=sampling,
                seed=int(seed),
                patches={key: patches[key] for key in prompt.image_keys if key in patches},
            )
            for prompt, seed in zip(prompts, seeds, strict=True)
        ]
        return self.generation_backend.generate(requests)

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._eos_ids)

    @property
    def pad_token_id(self) -> int:
        return self._pad_id

    @property
    def vision_token_ids(self) -> list[int]:
        """Image and video placeholder tokens: never part of a response."""
        return list(self._vision_token_ids)

    def generation_inputs(self, requests: Sequence[GenerationRequest]) -> dict[str, Any]:
        """Model keyword arguments for transformers' `generate` over `requests` (left-padded prompts, image
        features from the cache)."""
        images = {k: im for r in requests for k, im in zip(r.image_keys, r.images, strict=True)}
        patches = {k: p for r in requests for k, p in r.patches.items()}
        batch = self._batch([r.prompt for r in requests], images, patches)
        return self._model_inputs(batch, with_grad=False)

    def image_embeddings(self, request: GenerationRequest) -> torch.Tensor:
        """A request's image features from the cache, concatenated in image order: [tokens, hidden]."""
        images = dict(zip(request.image_keys, request.images, strict=True))
        batch = _EncodedBatch({}, list(request.image_keys), images, dict(request.patches))
        encodings = self._cached_encodings(batch, request.image_grid_thw.to(self.device), with_grad=False)
        if any(e.deepstack for e in encodings):
            raise ConfigError("generation.image_embeds: not supported for models with deepstack features (Qwen3-VL)")
        return torch.cat([e.embeds for e in encodings])

    def cut_response(
        self, ids: list[int], stop_strings: Sequence[str], logprobs: list[float] | None = None
    ) -> Generation:
        """Cut a generated row at its first completed stop string or its first EOS, whichever comes first
        (both included in `token_ids`; the EOS is not part of the text); `logprobs` are cut alike."""
        eos = next((k for k, token in enumerate(ids) if token in self._eos_ids), len(ids))
        stop_token = ids[eos : eos + 1]
        ids = ids[:eos]

        def has_stop(k: int) -> bool:
            text = self._tokenizer.decode(ids[:k])
            return any(stop in text for stop in stop_strings)

        if stop_strings and has_stop(len(ids)):  # bisect for the shortest prefix holding a stop string
            low, high = 1, len(ids)
            while low < high:
                mid = (low + high) // 2
                low, high = (low, mid) if has_stop(mid) else (mid + 1, high)
            text, token_ids = self._tokenizer.decode(ids[:low]), ids[:low]
        else:
            text, token_ids = self._tokenizer.decode(ids), ids + stop_token
        return Generation(text, token_ids, None if logprobs is None else list(logprobs[: len(token_ids)]))

    def checkpoint_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight under its `save_pretrained` name, as full tensors (FSDP2 shards gathered; inside
        `Runtime.full_weights` they are the gathered ones, valid until it reshards), one at a time: what an
        inference engine loads. Under LoRA the names are the base model's and each adapted weight comes with
        its adapters' delta added, out of place: merging into the frozen base weights and unmerging after
        would not restore them exactly (bf16 rounding), and the error would build up step after step."""
        model, deltas = self._model, {}
        if self.has_adapters:
            model = model.get_base_model()
            deltas = {
                f"{name}.base_layer.weight": module
                for name, module in model.named_modules()
                if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")
            }
        for name, parameter_name, tensor in _checkpoint_named_weights(model):
            layer = deltas.get(parameter_name)
            if layer is not None:
                with torch.no_grad():
                    adapters = [a for a in layer.active_adapters if a in layer.lora_A and not layer.disable_adapters]
                    tensor = sum((layer.get_delta_weight(a) for a in adapters), tensor.float())
            yield name, _full_tensor(tensor)

    # ----------------------------------------------------------------------------------------------
    # scoring

    def score(
        self,
        contexts: Sequence[Context],
        responses: Sequence[Sequence[int]],
        *,
        micro_batch_size: int = 8,
        with_grad: bool = False,
        return_entropy: bool = True,
        temperature: float = 1.0,
    ) -> ScoreOutput:
        """Per-token log-probs (and entropies) of `responses[i]` following `contexts[i]`, under the
        distribution sampled at `temperature` (logits / temperature; 0, greedy, scores at 1). An update
        pass (`with_grad`) and its backward belong inside `update_mode()`."""
        logprobs: list[torch.Tensor] = [torch.empty(0)] * len(contexts)
        entropies: list[torch.Tensor] = [torch.empty(0)] * len(contexts)
        for indices, batch_logprobs, batch_entropies in self.score_batches(
            contexts, responses, micro_batch_size, with_grad=with_grad, return_entropy=return_entropy,
            temperature=temperature,
        ):
            for k, i in enumerate(indices):
                logprobs[i] = batch_logprobs[k]
                if batch_entropies is not None:
                    entropies[i] = batch_entropies[k]
        return ScoreOutput(logprobs=logprobs, entropies=entropies if return_entropy else None)

    def score_batches(
        self,
        contexts: Sequence[Context],
        responses: Sequence[Sequence[int]],
        micro_batch_size: int = 8,
        *,
        with_grad: bool = False,
        return_entropy: bool = True,
        temperature: float = 1.0,
    ) -> Iterator[tuple[list[int], list[torch.Tensor], list[torch.Tensor] | None]]:
        """Score micro-batch by micro-batch, yielding (sample indices, log-probs, entropies or None).
        With `with_grad`, call `backward()` on each micro-batch's loss before asking for the next one."""
        if len(responses) != len(contexts):
            raise ValueError(f"responses: got {len(responses)} responses for {len(contexts)} contexts")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        responses = [self._check_response(i, r) for i, r in enumerate(responses)]
        for start in range(0, len(contexts), micro_batch_size):
            indices = list(range(start, min(start + micro_batch_size, len(contexts))))
            with torch.set_grad_enabled(with_grad):
                logprobs, entropies = self._score_micro_batch(
                    [contexts[i] for i in indices], [responses[i] for i in indices], with_grad, return_entropy,
                    temperature if temperature > 0 else 1.0,
                )
            yield indices, logprobs, entropies

    def _check_response(self, index: int, response: Sequence[int]) -> list[int]:
        ids = [int(t) for t in response]
        vocab = self._model.get_input_embeddings().num_embeddings
        bad = [t for t in ids if not 0 <= t < vocab or t in self._vision_token_ids]
        if bad:
            raise ValueError(
                f"responses[{index}]: token id {bad[0]} is outside the vocabulary or a vision placeholder"
            )
        return ids

    def _score_micro_batch(
        self,
        contexts: list[Context],
        responses: list[list[int]],
        with_grad: bool,
        return_entropy: bool,
        temperature: float,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        # Consecutive samples whose context continues the previous one's context and response (an
        # episode-mode episode) share one row: one forward over the episode's sequence serves all its turns.
        # Left padding lines every row up at the right end; only positions from the first response token
        # on go through the LM head (a 1-D index of them when rows are packed).
        prompts, images, fresh_pixels = self._encode_contexts(contexts)
        chains = _prefix_chains(prompts, responses)
        batch = self._batch(
            [prompts[c[-1]] for c in chains], images, fresh_pixels, [responses[c[-1]] for c in chains]
        )
        inputs = self._model_inputs(batch, with_grad=with_grad)
        if not batch.image_keys:  # positions skip the left padding (with images, M-RoPE's own index does)
            inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        width = inputs["input_ids"].shape[1]
        # Per sample: its row and the positions of the logits that predict its response tokens.
        spans = []
        for row, chain in enumerate(chains):
            pad = width - len(prompts[chain[-1]].input_ids) - len(responses[chain[-1]])
            spans += [(row, pad + len(prompts[i].input_ids) - 1, len(responses[i])) for i in chain]
        packed = len(chains) < len(contexts)
        first = min(start for _, start, _ in spans)
        keep = (
            torch.tensor(sorted({start + j for _, start, n in spans for j in range(n)}), device=self.device)
            if packed
            else width - first  # the last positions, as many as the longest response (+1: see the shift)
        )
        with self.autocast():
            output = self._forward_module(**inputs, use_cache=False, logits_to_keep=keep)
        log_probs = torch.log_softmax(output.logits.float() / temperature, dim=-1)
        kept = keep if packed else torch.arange(first, width, device=self.device)
        logprobs, entropies = [], []
        for (row, start, n), response in zip(spans, responses, strict=True):  # chains keep the samples' order
            where = torch.searchsorted(kept, torch.arange(start, start + n, device=self.device))
            predicted = log_probs[row, where]
            targets = torch.tensor(response, device=self.device)
            logprobs.append(predicted.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
            if return_entropy:
                entropies.append(-(predicted.exp() * predicted).sum(-1))
        return logprobs, entropies if return_entropy else None

    def _encode_contexts(
        self, contexts: Sequence[Context]
    ) -> tuple[list[EncodedPrompt], dict[str, Image.Image], dict[str, torch.Tensor]]:
        """Each context's encoding (`PromptCache`), its images by key, and the patches computed now."""
        prompts, images, fresh_pixels = [], {}, {}
        for i, context in enumerate(contexts):
            context_images = self._images_of(i, context)
            keys = [image_key(image, self._image_settings) for image in context_images]
            images.update(zip(keys, context_images, strict=True))
            prompt, pixels = self._prompts.encode(
                _texts_of(context), keys, functools.partial(self._process, context, context_images)
            )
            prompts.append(prompt)
            fresh_pixels.update(pixels)
        return prompts, images, fresh_pixels

    def _batch(
        self,
        prompts: list[EncodedPrompt],
        images: dict[str, Image.Image],
        fresh_pixels: dict[str, torch.Tensor],
        responses: Sequence[list[int]] | None = None,
    ) -> _EncodedBatch:
        """Encoded prompts (each followed by its response, if given) as one left-padded batch."""
        suffixes = responses if responses is not None else [[] for _ in prompts]
        rows = [p.input_ids + list(r) for p, r in zip(prompts, suffixes, strict=True)]
        width = max(len(row) for row in rows)

        def left_pad(values: list[list[int]], fill: int) -> torch.Tensor:
            return torch.tensor([[fill] * (width - len(v)) + v for v in values], dtype=torch.long)

        tensors = {
            "input_ids": left_pad(rows, self._pad_id),
            "attention_mask": left_pad([[1] * len(row) for row in rows], 0),
        }
        if prompts[0].mm_token_type_ids is not None:
            types = [p.mm_token_type_ids + [0] * len(r) for p, r in zip(prompts, suffixes, strict=True)]
            tensors["mm_token_type_ids"] = left_pad(types, 0)
        keys = [key for p in prompts for key in p.image_keys]
        if keys:
            tensors["image_grid_thw"] = torch.cat([p.image_grid_thw for p in prompts if p.image_keys])
        return _EncodedBatch(tensors, keys, images, fresh_pixels)

    def _process(self, context: Context, images: list[Image.Image]) -> dict[str, Any]:
        """The chat template and the processor on one context."""
        text = self._processor.apply_chat_template(context, tokenize=False, add_generation_prompt=True)
        if self.is_vision:
            return self._processor(
                text=[text], images=images or None, add_special_tokens=False, return_tensors="pt"
            )
        return self._processor([text], add_special_tokens=False, return_tensors="pt")

    def _images_of(self, index: int, context: Context) -> list[Image.Image]:
        if not isinstance(context, list) or not all(isinstance(m, dict) and "role" in m for m in context):
            raise ValueError(
                f"contexts[{index}]: a context is a list of chat messages with 'role' and 'content'"
            )
        images = []
        for message in context:
            content = message.get("content")
            items = [] if isinstance(content, str) else content
            if not isinstance(items, list):
                raise ValueError(f"contexts[{index}]: message content must be a string or a list of items")
            for item in items:
                if not isinstance(item, dict):
                    raise ValueError(f"contexts[{index}]: content items are dicts with a 'type'")
                if item.get("type") != "image":
                    continue
                if not self.is_vision:
                    raise ValueError(f"contexts[{index}] holds an image but the model is text-only")
                if not isinstance(item.get("image"), Image.Image):
                    raise ValueError(f"contexts[{index}]: an image item needs a PIL.Image under 'image'")
                images.append(item["image"])
        return images

    def _model_inputs(self, batch: _EncodedBatch, with_grad: bool) -> dict[str, Any]:
        """Model keyword arguments on the model's device; image features come from the cache, and only the
        images it misses go through the image processor (unless their pixels were just computed)."""
        inputs = {k: v.to(self.device) for k, v in batch.tensors.items()}
        keys = batch.image_keys
        if not keys:
            return inputs
        if not self.cache.enabled:
            self.cache.count_uncached(len(keys))
            pixels = [batch.pixels(key, self._processor) for key in keys]
            inputs["pixel_values"] = torch.cat(pixels).to(self.device)
            return inputs
        encodings = self._cached_encodings(batch, inputs["image_grid_thw"], with_grad)
        inputs["mm_encoder_outputs"] = {"image": ImageFeatures.from_encodings(encodings)}
        return inputs

    def _cached_encodings(self, batch: _EncodedBatch, grids: torch.Tensor, with_grad: bool) -> list[ImageEncoding]:
        """The features of every image occurrence of `batch`; only cache misses reach the vision tower."""
        keys = batch.image_keys
        tower_grad = with_grad and self.vision_tower_trainable  # the student pass through a trainable tower

        def encode(positions: list[int]) -> list[ImageEncoding]:
            pixels = torch.cat([batch.pixels(keys[p], self._processor) for p in positions])
            with torch.set_grad_enabled(tower_grad):
                return self._encode_images(pixels, grids[positions])

        return self.cache.fetch(keys, encode, store=not tower_grad)

    def _encode_images(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> list[ImageEncoding]:
        with self.autocast():
            output = self._model.get_image_features(pixel_values.to(self.device), grid_thw, return_dict=True)
        deepstack = getattr(output, "deepstack_features", None) or []
        return [
            ImageEncoding(embeds, tuple(layer[i] for layer in deepstack))
            for i, embeds in enumerate(output.pooler_output)
        ]


def _prefix_chains(prompts: Sequence[EncodedPrompt], responses: Sequence[list[int]]) -> list[list[int]]:
    """Indices grouped into runs of consecutive samples in which each context's encoding starts with the
    previous sample's context and response, images included: each run is one sequence to score."""
    chains: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if chains:
            last = prompts[chains[-1][-1]]
            before = last.input_ids + responses[chains[-1][-1]]
            if (
                len(prompt.input_ids) > len(before)
                and prompt.input_ids[: len(before)] == before
                and prompt.image_keys[: len(last.image_keys)] == last.image_keys
            ):
                chains[-1].append(i)
                continue
        chains.append([i])
    return chains


def _texts_of(context: Context) -> list[str]:
    """A context's roles and texts in order, image items marked: with the image keys, its cache key."""
    parts = []
    for message in context:
        content = message["content"]
        items = [{"type": "text", "text": content}] if isinstance(content, str) else content
        parts.append(f"<{message['role']}>")
        parts += [item.get("text", "") if item["type"] == "text" else f"<{item['type']}>" for item in items]
    return parts


def _save_in_dtype(model: PreTrainedModel, out_dir: str | os.PathLike, dtype: torch.dtype, state=None) -> None:
    """`save_pretrained` of the model's state (or `state`) cast to `dtype`, with a config.json that names
    `dtype`: what a user's `from_pretrained(dtype="auto")` then gets. Tied weights stay one tensor."""
    tied = _tied_names(model)
    state = model.state_dict() if state is None else state
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items() if k not in tied}
    model.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
    path = Path(out_dir) / "config.json"
    config = json.loads(path.read_text())
    name = str(dtype).removeprefix("torch.")
    for section in [config, *(v for v in config.values() if isinstance(v, dict) and "dtype" in v)]:
        section["dtype"] = name
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _tied_names(model: torch.nn.Module) -> set[str]:
    """Names of parameters that alias an earlier one (a tied LM head): saved and pushed once."""
    first_name: dict[int, str] = {}
    return {
        name
        for name, param in model.named_parameters(remove_duplicate=False)
        if first_name.setdefault(id(param), name) != name
    }


def _checkpoint_named_weights(model: PreTrainedModel) -> list[tuple[str, str | None, torch.Tensor]]:
    """`model`'s weights as (checkpoint name, parameter name, tensor): the names `save_pretrained` writes
    (tied aliases dropped, transformers' load-time renamings reverted, e.g. Qwen-VL's
    `model.language_model.*` back to the checkpoint's `model.*`; PEFT's `base_layer` level and adapter
    tensors removed). The parameter name is None for a tensor a conversion rebuilt. Read through parameters,
    not `state_dict()`, which under FSDP2 would reshard gathered weights; sharded ones stay DTensors."""
    from transformers.core_model_loading import revert_weight_conversion

    tied = _tied_names(model)
    persistent_buffers = [
        (f"{prefix}.{name}" if prefix else name, buffer)
        for prefix, module in model.named_modules()
        for name, buffer in module.named_buffers(recurse=False)
        if buffer is not None and name not in module._non_persistent_buffers_set
    ]
    state, origin = {}, {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *persistent_buffers]:
        if name not in tied and ".lora_" not in name:
            plain = name.replace(".base_layer.", ".")
            state[plain] = tensor.detach()
            origin[id(state[plain])] = name
    return [(key, origin.get(id(t)), t) for key, t in revert_weight_conversion(model, state).items()]


def _full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _enable_checkpointing(model: PreTrainedModel) -> None:
    """Non-reentrant checkpointing of every decoder layer (named `activation_checkpointing_enable` from
    transformers 5.24 on, `gradient_checkpointing_enable` before)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _with_adapters(
    model: PreTrainedModel,
    lora: LoraConfig | None,
    adapter_path: str | os.PathLike | None,
    trainable: bool,
    exclude_vision_tower: bool,
) -> PreTrainedModel:
    """`model` wrapped by PEFT: fresh LoRA adapters from `lora`, or the adapters saved in `adapter_path`."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import PeftModel, get_peft_model
    except ImportError:
        raise ConfigError("model.lora: LoRA needs the peft package (pip install peft)") from None
    if adapter_path is not None:
        if not (Path(adapter_path) / "adapter_config.json").is_file():
            raise ConfigError(f"{adapter_path}: no LoRA adapters here (adapter_config.json is missing)")
        return PeftModel.from_pretrained(model, str(adapter_path), is_trainable=trainable)
    names = [name for name, _ in model.named_modules()]
    exclude = None
    if exclude_vision_tower:
        tower = model.get_encoder(modality="image")
        prefix = next(name for name, module in model.named_modules() if module is tower)
        exclude = rf"{re.escape(prefix)}(\..*)?"
        names = [n for n in names if not re.fullmatch(exclude, n)]
    unknown = [t for t in lora.target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if unknown:
        raise ConfigError(f"model.lora.target_modules: no module named {unknown[0]!r} in the language model")
    config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        exclude_modules=exclude,
    )
    try:
        return get_peft_model(model, config)
    except ValueError as err:  # e.g. a target that is not a layer type LoRA supports
        raise ConfigError(f"model.lora: {str(err).splitlines()[0]}") from None
