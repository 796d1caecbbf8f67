"""Launched on two CPU processes by test_distributed: DDP weight copies are checked equal, and a copy that
drifted on one process is caught by name."""

from __future__ import annotations

import sys

import torch

from seed_vl.distributed import Runtime, leave_process_group
from seed_vl.policy import Policy

runtime = Runtime(cpu=True)
policy = Policy.from_pretrained(sys.argv[1], device="cpu", trainable=True)
runtime.prepare(policy, lr=1e-3, weight_decay=0.0)
runtime.check_replicas_in_sync()  # the same weights everywhere: passes
name, param = next((n, p) for n, p in runtime.model.named_parameters() if p.requires_grad)
if runtime.process_index == 1:
    with torch.no_grad():
        param.view(-1)[0] += 1e-3
try:
    runtime.check_replicas_in_sync()
except RuntimeError as error:
    assert name in str(error), error
    print(f"caught on process {runtime.process_index}")
else:
    raise SystemExit("a drifted copy went unnoticed")
leave_process_group()
