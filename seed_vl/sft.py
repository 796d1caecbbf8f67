"""Supervised fine-tuning with the loss on the response tokens only (DESIGN §1 stage 1 step 3).

The loss is the token-mean NLL of each mini-batch's response tokens, taken from `Policy.score_batches`: the
same templated prompt + response layout the RL later scores, so SFT trains exactly those tokens and the
prompt tokens carry no loss. `train_sft` takes in-memory examples; building them (analyzer datasets, solver
demonstrations) is the caller's business.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seed_vl.checkpoint import load_checkpoint
from seed_vl.config import ConfigError
from seed_vl.distributed import Runtime
from seed_vl.policy import Policy
from seed_vl.tracking import progress

Context = list[dict[str, Any]]


@dataclass(frozen=True)
class SFTExample:
    """A context and the response to learn. `end_of_turn` appends the tokenizer's EOS token: an analyzer
    answer must end there (the self-analyzer stops on EOS), an action ends at its `</action>` stop string."""

    context: Context
    response: str
    end_of_turn: bool = False


@dataclass(frozen=True)
class EncodedExample:
    context: Context
    response_ids: list[int]


@dataclass(frozen=True)
class SFTSettings:
    epochs: int = 3
    lr: float = 2e-6
    batch_size: int = 8  # examples per optimizer step
    micro_batch_size: int = 8  # sequences per forward pass
    max_length: int = 4096  # prompt + response tokens; longer examples are skipped
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    seed: int = 0  # shuffling


@dataclass(frozen=True)
class SFTResult:
    steps: int
    examples: int  # examples trained on
    skipped_too_long: int


def encode_examples(
    policy: Policy, examples: Sequence[SFTExample], max_length: int
) -> tuple[list[EncodedExample], int]:
    """Tokenized responses, without the examples whose prompt + response exceed `max_length` tokens
    (returned as a count: a long trajectory costs its example, not the run)."""
    tokenizer = policy.tokenizer
    encoded, too_long = [], 0
    for example in examples:
        ids = tokenizer.encode(example.response, add_special_tokens=False)
        if example.end_of_turn:
            ids.append(tokenizer.eos_token_id)
        if prompt_length(policy, example.context) + len(ids) > max_length:
            too_long += 1
        else:
            encoded.append(EncodedExample(example.context, ids))
    return encoded, too_long


def prompt_length(policy: Policy, context: Context) -> int:
    """Tokens of the templated context with its generation prompt (image placeholders expanded)."""
    batch = policy.processor.apply_chat_template(
        context, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    return batch["input_ids"].shape[-1]


@torch.no_grad()
def response_nll(
    policy: Policy, examples: Sequence[EncodedExample], micro_batch_size: int = 8
) -> tuple[float, int]:
    """(summed NLL, number of response tokens) over `examples`: the quantity SFT minimises, per token."""
    total, tokens = 0.0, 0
    for _, logprobs, _ in policy.score_batches(
        [e.context for e in examples],
        [e.response_ids for e in examples],
        micro_batch_size,
        return_entropy=False,
    ):
        total -= sum(float(lp.sum()) for lp in logprobs)
        tokens += sum(len(lp) for lp in logprobs)
    return total, tokens


def train_sft(
    policy: Policy,
    examples: Sequence[SFTExample],
    settings: SFTSettings,
    *,
    runtime: Runtime | None = None,
    resume_from: Path | None = None,
    log: Callable[[int, dict[str, float]], None] | None = None,
    checkpoint: Callable[[int, Runtime, Any, Any], None] | None = None,
    checkpoint_every: int = 0,
    show_progress: bool = True,
) -> SFTResult:
    """`settings.epochs` passes of AdamW over the examples, reshuffled every epoch by a seeded generator.

    Runs on `runtime` (one process, DDP or FSDP2; default: one process on the policy's device): every
    process sees the same shuffled mini-batches and trains on its share. `resume_from` (a checkpoint
    written through `checkpoint`) restores weights, optimizer and RNG and skips the steps already taken.
    `log(step, metrics)` sees every optimizer step; `checkpoint(step, runtime, optimizer, scheduler)` runs
    every `checkpoint_every` steps (0: never) and after the last step. A step whose loss or gradient is not
    finite is skipped (and counted) instead of corrupting the weights.
    """
    encoded, too_long = encode_examples(policy, examples, settings.max_length)
    if not encoded:
        raise ConfigError(
            f"sft.max_length: all {len(examples)} examples are longer than {settings.max_length} tokens"
            if examples
            else "sft: no training examples"
        )
    runtime = runtime or Runtime(cpu=policy.device.type == "cpu")
    optimizer, scheduler = runtime.prepare(policy, lr=settings.lr, weight_decay=settings.weight_decay)
    first_step = 0
    if resume_from is not None:
        first_step = load_checkpoint(resume_from, runtime, optimizer, scheduler).step
        policy.on_weights_updated()
    total_steps = settings.epochs * math.ceil(len(encoded) / settings.batch_size)
    skipped_nonfinite = 0
    batches = _shuffled_batches(len(encoded), settings)
    bar = progress(batches, "sft", total=total_steps, unit="step", enabled=show_progress and runtime.is_main)
    for step, (epoch, batch) in enumerate(bar, 1):
        if step <= first_step:
            continue
        loss, tokens = _accumulate_gradients(policy, runtime, [encoded[i] for i in batch], settings)
        grad_norm, applied = runtime.optimizer_step(optimizer, scheduler, loss, settings.max_grad_norm)
        policy.on_weights_updated()  # cached image features belong to the old weights
        skipped_nonfinite += not applied
        metrics = {
            "sft/loss": loss,
            "sft/tokens": float(tokens),
            "sft/grad_norm": grad_norm,
            "sft/epoch": float(epoch + 1),
            "sft/nonfinite_skipped": float(skipped_nonfinite),
        }
        if log is not None:
            log(step, metrics)
        if checkpoint is not None and (
            step == total_steps or (checkpoint_every and step % checkpoint_every == 0)
        ):
            checkpoint(step, runtime, optimizer, scheduler)
    return SFTResult(steps=total_steps, examples=len(encoded), skipped_too_long=too_long)


def _shuffled_batches(num_examples: int, settings: SFTSettings) -> Iterator[tuple[int, list[int]]]:
    generator = torch.Generator().manual_seed(settings.seed)
    for epoch in range(settings.epochs):
        order = torch.randperm(num_examples, generator=generator).tolist()
        for start in range(0, num_examples, settings.batch_size):
            yield epoch, order[start : start + settings.batch_size]


def _accumulate_gradients(
    policy: Policy, runtime: Runtime, batch: list[EncodedExample], settings: SFTSettings
) -> tuple[float, int]:
    """Backward of one mini-batch's token-mean NLL, this process's share micro-batch by micro-batch.
    Returns (the mini-batch loss over all processes, its response tokens)."""
    num_tokens = sum(len(e.response_ids) for e in batch)
    loss_sum = 0.0
    # Under FSDP2 a process out of micro-batches runs zero-weight passes over one example.
    for chunk, weight in runtime.micro_batches(runtime.shard(batch), settings.micro_batch_size, batch[:1]):
        with policy.update_mode():
            logprobs = policy.score(
                [e.context for e in chunk],
                [e.response_ids for e in chunk],
                micro_batch_size=len(chunk),
                with_grad=True,
                return_entropy=False,
            ).logprobs
            loss = -torch.cat(logprobs).sum() / num_tokens
            runtime.backward(loss, weight)
        loss_sum += weight * loss.item()
    return runtime.reduce_sum(loss_sum), num_tokens
