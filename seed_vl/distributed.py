"""The optimizer side that RL and SFT share, on one process or many (`accelerate launch`).

`Runtime` owns the `Accelerator` and answers four questions the training loops should not have to:
- where the weights live: a single device, DDP replicas, or FSDP2 shards. FSDP2 is applied here with
  `fully_shard` (wrap units: the loaded model's `_no_split_modules`; `MixedPrecisionPolicy(param_dtype =
  model.dtype, reduce_dtype = float32)`; float32 master weights and optimizer state), the same code on GPUs
  over NCCL and on CPUs over gloo, where accelerate itself offers no FSDP. `accelerate launch` with an FSDP
  config selects it;
- how one optimizer step is taken: micro-batches accumulate locally, gradients are averaged once, clipped,
  and a non-finite loss or gradient skips the step on every process;
- how metrics are reduced over processes;
- how the training state is checkpointed: `torch.distributed.checkpoint` (each process writes its shard),
  trainable weights in float32 beside the optimizer state, so a resume continues bit for bit.

Under FSDP2 every forward is a collective. Generation, scoring and image encoding (no gradients) run inside
`full_weights()`, which gathers the weights once so each process runs as many forwards as its own episodes
need; update passes run in lock step (`micro_batches`).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, gather_object

from seed_vl.config import ConfigError
from seed_vl.policy import Policy


class Runtime:
    def __init__(self, cpu: bool = False) -> None:
        # Precision is the recipe's `model.dtype`, applied by the policy's autocast (and FSDP2's policy
        # below), never by accelerate's own mixed precision: one knob, fp32 master weights either way.
        self.accelerator = Accelerator(cpu=cpu, mixed_precision="no")
        kind = self.accelerator.distributed_type
        if kind == DistributedType.DEEPSPEED:
            raise ConfigError("accelerate config: DeepSpeed is not supported; FSDP2 is the sharded path")
        # accelerate turns an FSDP launch on CPUs into plain multi-CPU; the launcher's flag still says FSDP.
        self.is_fsdp = kind == DistributedType.FSDP or (
            kind == DistributedType.MULTI_CPU and os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"
        )
        if self.is_fsdp and os.environ.get("FSDP_VERSION", "2") != "2":
            raise ConfigError("accelerate config: fsdp_version must be 2 (FSDP2)")
        for key, instead in (("FSDP_OFFLOAD_PARAMS", "offloading is not supported"),
                             ("FSDP_ACTIVATION_CHECKPOINTING", "use model.gradient_checkpointing")):
            if self.is_fsdp and os.environ.get(key, "").lower() == "true":
                raise ConfigError(f"accelerate config: fsdp_{key[5:].lower()}: {instead}")
        # DDP: gradients are averaged by hand once per optimizer step, so processes may run different numbers
        # of micro-batches. FSDP2 reduces inside backward and needs every process in lock step instead.
        self.is_ddp = kind in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU) and not self.is_fsdp
        self.model: torch.nn.Module | None = None
        self.policy: Policy | None = None

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def num_processes(self) -> int:
        return self.accelerator.num_processes

    @property
    def process_index(self) -> int:
        return self.accelerator.process_index

    def prepare(self, policy: Policy, *, lr: float, weight_decay: float, warmup_steps: int = 0):
        """Wrap the policy's model for this launch and build AdamW over its trainable weights.
        Returns (optimizer, scheduler); the policy's scoring passes then run through the wrapper."""
        if self.is_fsdp:
            _fully_shard(policy)  # in place, before the optimizer sees the parameters
        params = [p for p in policy.model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError("model: nothing to train (every parameter is frozen)")
        # foreach: one kernel per op over all tensors. PyTorch picks it by default on GPU only; on the CPU
        # the per-tensor loop made each AdamW step of the tiny model ~25x slower (benchmarks/bench_step.py).
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)
        warmup = max(1, warmup_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
        model = policy.model
        if not self.is_fsdp:  # the scheduler stays ours: accelerate would step it once per process under DDP
            model, optimizer = self.accelerator.prepare(model, optimizer)
        policy.set_forward_module(model)
        self.model, self.policy = model, policy
        return optimizer, scheduler

    # ---------------------------------------------------------------------------------------- steps
    def shard(self, items: list) -> list:
        """This process's share of a mini-batch that every process sees whole."""
        return items[self.process_index :: self.num_processes]

    def micro_batches(self, items: list, size: int, filler: list) -> Iterator[tuple[list, float]]:
        """This process's mini-batch `items` in micro-batches of `size`, as (micro-batch, loss weight); the
        backward of each belongs in the loop body. Gradients stay local until the last micro-batch. Under
        FSDP2 every process runs the largest count (each forward and backward is a collective): the extra
        ones are zero-weight passes over `filler`."""
        chunks = [items[k : k + size] for k in range(0, len(items), size)]
        count = int(self.reduce_max(len(chunks))) if self.is_fsdp and self.num_processes > 1 else len(chunks)
        for k in range(count):
            with self._accumulating(last=k == count - 1):
                yield (chunks[k], 1.0) if k < len(chunks) else (filler, 0.0)

    @contextmanager
    def _accumulating(self, last: bool) -> Iterator[None]:
        if self.is_ddp:
            with self.accelerator.no_sync(self.model):
                yield
        elif self.is_fsdp and self.num_processes > 1:
            self.model.set_requires_gradient_sync(last)
            yield
        else:
            yield

    def backward(self, loss: torch.Tensor, weight: float = 1.0) -> None:
        """Backward of this process's share of a loss normalised over all processes' tokens: processes
        average their gradients, so the share is scaled by their number."""
        (loss * (weight * self.num_processes)).backward()

    def optimizer_step(self, optimizer, scheduler, loss: float, max_grad_norm: float) -> tuple[float, bool]:
        """Average gradients (DDP), clip, and step unless any process saw a non-finite loss or gradient
        norm. Returns (gradient norm before clipping, whether the step was taken)."""
        if self.is_ddp:
            self._average_gradients()
        grad_norm = _clip_grad_norm(self.model, max_grad_norm)
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        applied = self.reduce_sum(not finite) == 0
        if applied:
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, applied

    def _average_gradients(self) -> None:
        """Mean of the gradients over processes, in place (a process without micro-batches adds zeros)."""
        for param in self.model.parameters():
            if param.requires_grad:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                torch.distributed.all_reduce(param.grad)
                param.grad /= self.num_processes

    @contextmanager
    def full_weights(self) -> Iterator[None]:
        """Gathered weights for passes without gradients under FSDP2: there each forward through sharded
        weights is a collective, while processes generate different numbers of tokens and turns; and
        generation may enter the model below the root (PEFT's `generate` does), skipping the root's gather."""
        if not self.is_fsdp:
            yield
            return
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(unit is not self.model, recurse=False)

    # -------------------------------------------------------------------------------------- metrics
    def reduce_sum(self, value: float) -> float:
        if self.num_processes == 1:
            return value
        t = torch.tensor([float(value)], device=self.device)
        return float(self.accelerator.reduce(t, reduction="sum").item())

    def reduce_max(self, value: float) -> float:
        if self.num_processes == 1:
            return value
        t = torch.tensor([float(value)], device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t.item())

    def reduce_mean_pairs(self, pairs: dict[str, tuple[float, float]]) -> dict[str, float]:
        """Each metric as (sum, count) per process -> global sum / global count."""
        keys = sorted(pairs)
        if self.num_processes > 1:  # a process may lack a metric (e.g. it had nothing to update)
            keys = sorted(set().union(*gather_object([keys])))
        t = torch.tensor([[float(s), float(n)] for s, n in (pairs.get(k, (0.0, 0.0)) for k in keys)])
        if self.num_processes > 1:
            t = self.accelerator.reduce(t.to(self.device), reduction="sum").cpu()
        return {k: (float(s) / float(n) if n else 0.0) for k, (s, n) in zip(keys, t.tolist(), strict=True)}

    def wait_for_everyone(self) -> None:
        self.accelerator.wait_for_everyone()

    # ---------------------------------------------------------------------------------- checkpoints
    def check_replicas_in_sync(self) -> None:
        """Under DDP each process holds its own copy of the weights, kept equal only by applying identical
        averaged gradients, and a checkpoint stores the main process's copy: verify, from two fingerprints
        per trainable tensor compared across processes, that every copy is the same."""
        if not self.is_ddp or self.num_processes == 1:
            return
        named = [(n, p.detach()) for n, p in self.model.named_parameters() if p.requires_grad]
        prints = torch.stack([torch.stack([p.double().sum(), p.double().square().sum()]) for _, p in named])
        low, high = prints.clone(), prints.clone()
        torch.distributed.all_reduce(low, op=torch.distributed.ReduceOp.MIN)
        torch.distributed.all_reduce(high, op=torch.distributed.ReduceOp.MAX)
        diverged = [name for (name, _), differs in zip(named, (low != high).any(dim=1).tolist(), strict=True) if differs]
        if diverged:
            raise RuntimeError(
                f"DDP processes hold different weights ({len(diverged)} tensors, first {diverged[0]}): "
                "their updates diverged; the checkpoint was not written"
            )

    def model_state_for_export(self) -> dict[str, torch.Tensor] | None:
        """The full model state (every process must call this under FSDP2; only the main one gets it)."""
        if not self.is_fsdp:
            return None  # the policy saves its own (unwrapped) state
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.is_main else None

    def save_training_state(self, directory: Path, optimizer) -> None:
        """Trainable weights (float32) and optimizer state; every process writes its shard."""
        from torch.distributed.checkpoint import save

        with _quiet_single_process():
            save(_training_state(self.policy.model, optimizer), checkpoint_id=str(directory))

    def load_training_state(self, directory: Path, optimizer) -> None:
        from torch.distributed.checkpoint import load
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = _training_state(self.policy.model, optimizer)
        with _quiet_single_process():
            load(state, checkpoint_id=str(directory))
        set_state_dict(
            self.policy.model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=_state_options(strict=False),
        )


def leave_process_group() -> None:
    """Destroy the process group before the interpreter exits: gloo's threads outliving it can abort a
    finished process at exit ('terminate called without an active exception', pytorch/pytorch#190489)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _fully_shard(policy: Policy) -> None:
    """FSDP2 over the policy's model: one unit per `_no_split_modules` layer (decoder layers; vision blocks
    of a trainable tower), the rest in the root; parameters all-gathered in the compute dtype, gradients reduced in
    float32, float32 shards for the optimizer."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    model = policy.model
    unit_names = set(getattr(model, "_no_split_modules", None) or [])
    if not unit_names:
        raise ConfigError(f"FSDP2: {type(model).__name__} names no layer classes (_no_split_modules) to shard")
    mp_policy = MixedPrecisionPolicy(param_dtype=policy.compute_dtype, reduce_dtype=torch.float32)
    # A frozen vision tower stays whole on every process, outside FSDP: image encoding (on cache misses,
    # which differ between processes) then never needs a collective.
    tower = model.get_encoder(modality="image") if policy.is_vision and not policy.vision_tower_trainable else None
    in_tower = set(tower.modules()) if tower is not None else set()
    units = [m for m in model.modules() if type(m).__name__ in unit_names and m not in in_tower]
    for unit in units:
        fully_shard(unit, mp_policy=mp_policy)
    ignored = set(tower.parameters()) if tower is not None else None
    fully_shard(model, mp_policy=mp_policy, reshard_after_forward=False, ignored_params=ignored)
    if policy.vision_tower_trainable:
        # The image cache calls the vision tower outside `forward`: through the root's hooks, so that the
        # root's own parameters (patch embedding, merger) are gathered first. (Processes must then miss the
        # cache alike: a trainable tower under FSDP2 is untested.)
        register_fsdp_forward_method(model, "get_image_features")
    # FSDP2 initialises itself in the first forward through the root, a collective; run it now, while every
    # process is here, rather than in the first generation, which some processes may not reach.
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=policy.device), use_cache=False)
    model.reshard()  # the root keeps its gathered weights after a forward; the optimizer needs the shards


def _clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the gradients' global norm (over every process's shard); return the norm before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _state_options(strict: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def _training_state(model: torch.nn.Module, optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    model_state, optimizer_state = get_state_dict(model, optimizer, options=_state_options())
    return {"model": model_state, "optimizer": optimizer_state}


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    """torch.distributed.checkpoint warns when it runs without a process group, which is what we mean."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
