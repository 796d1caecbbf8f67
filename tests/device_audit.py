"""A device audit that runs on the CPU: tensors are tagged "on the accelerator" and checked at every op.

On a CPU-only machine every tensor is on the same device, so a tensor that a CUDA run would find on the
wrong device (`RuntimeError: Expected all tensors to be on the same device`) goes unnoticed. This torch
function mode gives the model's device an identity of its own and follows it through every torch call:

- the model's parameters, buffers and gradients are ON the device, and so is the output of any op with an
  input on it, and of `.cuda()`;
- a tensor made with an explicit device (`torch.tensor(..., device=d)`, `.to(d)`) is PLACED: on a GPU it is
  wherever `d` says, which a CPU run cannot tell, so it may meet either side;
- anything else is OFF the device: built by a factory without `device=`, by the processor, by `.cpu()`.
  A `.to(...)` that is a no-op on the CPU returns a fresh alias, so the original CPU-side object stays OFF,
  as it would on a GPU (the bug this audit was written for: targets read from the CPU batch instead of its
  moved copy).

Every op that takes an ON tensor and an OFF tensor of one or more dimensions raises `DeviceMismatch`
(CUDA accepts 0-dim CPU scalars, cross-device copies, slice assignment and CPU index tensors; so does the
audit). Blind spot: a tensor placed explicitly on the wrong device.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

ON, PLACED = "on", "placed"


class DeviceMismatch(RuntimeError):
    pass


_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu}
# What CUDA itself accepts across devices: copies, slice assignment, CPU index tensors.
_UNCHECKED = _MOVES | {
    torch.Tensor.copy_,
    torch.Tensor.__getitem__,
    torch.Tensor.__setitem__,
    torch.Tensor.__repr__,
    torch.Tensor.__format__,
}


class DeviceAudit(TorchFunctionMode):
    def __init__(self, *modules: torch.nn.Module) -> None:
        super().__init__()
        self._where = WeakTensorKeyDictionary()
        self.ops_checked = 0
        for module in modules:
            self.place(module)

    def place(self, module: torch.nn.Module) -> None:
        """Put a module's parameters, buffers and (future) gradients on the audited device."""
        for tensor in [*module.parameters(), *module.buffers()]:
            self._where[tensor] = ON
        for param in module.parameters():
            if param.requires_grad:  # autograd writes a parameter's gradient on the parameter's device
                param.register_post_accumulate_grad_hook(self._place_grad)

    def _place_grad(self, param: torch.Tensor) -> None:
        self._where[param.grad] = ON

    def is_on(self, tensor: torch.Tensor) -> bool:
        return self._where.get(tensor) == ON

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        states = [self._where.get(t) for t in inputs]
        if func not in _UNCHECKED and ON in states:
            off = [t for t, state in zip(inputs, states, strict=True) if state is None and t.dim() > 0]
            if off:
                name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
                on = inputs[states.index(ON)]
                raise DeviceMismatch(
                    f"{name}: a tensor of shape {tuple(off[0].shape)} is off the device "
                    f"while one of shape {tuple(on.shape)} is on it"
                )
        self.ops_checked += 1
        out = func(*args, **kwargs)
        if func in _MOVES:
            if out is args[0]:  # a no-op move on the CPU: give the moved tensor its own identity
                out = out.view_as(out)
            state = self._move_target(func, args[0], args[1:], kwargs)
        elif func is torch.Tensor.__getitem__:  # indexing stays where the indexed tensor is
            state = self._where.get(args[0])
        elif ON in states:
            state = ON
        elif kwargs.get("device") is not None or (
            PLACED in states and all(s is not None or t.dim() == 0 for t, s in zip(inputs, states, strict=True))
        ):
            state = PLACED
        else:
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                if state is None:
                    self._where.pop(t, None)
                else:
                    self._where[t] = state
        return out

    def _move_target(self, func, source, rest, kwargs) -> str | None:
        if func is torch.Tensor.cpu:
            return None
        if func is torch.Tensor.cuda:
            return ON
        if kwargs.get("device") is not None:
            return PLACED
        for arg in rest:
            if isinstance(arg, torch.Tensor):
                return self._where.get(arg)
            if isinstance(arg, (str, torch.device, int)):
                return PLACED
        return self._where.get(source)  # a dtype-only conversion stays where it was
