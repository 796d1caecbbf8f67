"""Launched on two CPU processes under FSDP2 by test_generation: the weights a generation engine gets are
whole (shards gathered), under checkpoint names, inside `full_weights` (where generation runs) and outside."""

from __future__ import annotations

import sys

import torch

from seed_vl.distributed import Runtime, leave_process_group
from seed_vl.policy import Policy

runtime = Runtime(cpu=True)
policy = Policy.from_pretrained(sys.argv[1], device="cpu", trainable=True)
reference = {name: tensor.clone() for name, tensor in policy.checkpoint_weights()}
runtime.prepare(policy, lr=1e-3, weight_decay=0.0)
assert runtime.is_fsdp and runtime.num_processes == 2


def check(weights: list[tuple[str, torch.Tensor]]) -> None:
    """Inside the context only: gathered storage is freed when `full_weights` reshards."""
    assert [name for name, _ in weights] == list(reference)
    for name, tensor in weights:
        assert type(tensor) is torch.Tensor and torch.equal(tensor, reference[name]), name


check(list(policy.checkpoint_weights()))
with runtime.full_weights():
    check(list(policy.checkpoint_weights()))
print(f"full weights pushed on process {runtime.process_index}")
leave_process_group()
