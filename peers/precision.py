"""How a stage computes: the autocast dtype a device can run, and the loss scale of fp16 runs.

Master weights and AdamW moments stay float32 whatever the precision: autocast lowers the matmuls and the
attention to bf16 or fp16, while the residual stream between blocks, the norms, the loss and the wire stay
float32. CPU peers compute in float32.

fp16 needs its loss scaled (small gradients underflow in fp16 otherwise), and a pipeline splits the backward:
the loss is computed at stage 0, every other stage only receives gradients. torch's GradScaler changes its scale
on the peer that sees an overflow, and the other stages could not know by how much to divide. So the scale is a
run-wide constant (`train.loss_scale`, part of the signed run spec) and these are the rules:

- every data holder multiplies its loss by the run's scale (`scaled_loss`); nothing else is scaled;
- every stage divides its accumulated gradient by the same scale before it averages or steps
  (`unscale_gradients`), so averaging, the robust-mean checks and clipping see true gradients;
- a stage whose gradient overflowed drops its own gradient for the iteration (its visits become 0), so its
  stage group averages without it and every member takes the same step; a group where all overflowed skips.

A power-of-two scale is exact in float32 and bf16 (they share fp32's exponent range), so a bf16 or fp32 peer
of an fp16 run computes the same thing as it would unscaled.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Literal

import torch

Precision = Literal["fp32", "bf16", "fp16"]
"""What a stage's compute runs in."""
RequestedPrecision = Literal["auto", "fp32", "bf16", "fp16"]
"""What a run (or a peer) asks for; "auto" is bf16 on a GPU with native bf16, else fp32."""
REQUESTED_PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16", "fp16")
DEFAULT_LOSS_SCALE = 1024.0
"""The run-wide loss scale of fp16 runs unless `train.loss_scale` says otherwise."""
MAX_LOSS_SCALE = 2.0 ** 24


def check_loss_scale(scale: float, field: str = "train.loss_scale") -> float:
    """A loss scale must be a power of two in [1, 2^24] (so scaling and unscaling are exact)."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
            or not 1 <= scale <= MAX_LOSS_SCALE or math.frexp(scale)[0] != 0.5:
        raise ValueError(f"{field} must be a power of two from 1 to 2^24, got {scale!r}")
    return float(scale)


def native_bf16(device: torch.device) -> bool:
    """Whether `device` is a CUDA GPU with bf16 tensor cores (compute capability 8.0+: Ampere and later)."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 8


def resolve_precision(requested: str, device: str | torch.device) -> Precision:
    """The precision a peer computes in, or ValueError saying why `device` cannot.

    "auto" never picks fp16: fp16 needs the run-wide loss scale, so it is a run's explicit choice.
    """
    if requested not in REQUESTED_PRECISIONS:
        raise ValueError(f"train.precision must be one of {', '.join(REQUESTED_PRECISIONS)}, got {requested!r}")
    dev = torch.device(device)
    if requested == "fp32":
        return "fp32"
    if requested == "auto":
        return "bf16" if native_bf16(dev) else "fp32"
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"precision {requested} needs a CUDA GPU, this peer computes on {dev}: use fp32 or auto")
    if requested == "bf16" and not native_bf16(dev):
        raise ValueError(f"precision bf16 needs a GPU with native bf16 (compute capability 8.0+), {dev} has "
                         f"{'.'.join(map(str, torch.cuda.get_device_capability(dev)))}: use fp16 or auto")
    return requested  # type: ignore[return-value]


def peer_precision(run_precision: str, override: str, device: str | torch.device) -> Precision:
    """A peer's precision in a run: the run's, unless the peer asks for another ("auto" = the run's).

    A peer may compute more precisely than the run (fp32 or bf16 in an fp16 run: it still removes the run's loss
    scale), but not in fp16 in a run that is not fp16: its gradients would not be scaled.
    """
    if override not in REQUESTED_PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(REQUESTED_PRECISIONS)}, got {override!r}")
    if override == "fp16" and run_precision != "fp16":
        raise ValueError(f"precision fp16 needs a run whose train.precision is fp16 (its loss scale is run-wide); "
                         f"this run computes in {run_precision}")
    return resolve_precision(run_precision if override == "auto" else override, device)


def run_loss_scale(run_precision: str, loss_scale: float) -> float:
    """The scale every data holder of a run applies to its loss: `loss_scale` in fp16 runs, else 1."""
    return check_loss_scale(loss_scale) if run_precision == "fp16" else 1.0


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context of `precision` on `device` (none for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def scaled_loss(loss: torch.Tensor, scale: float) -> torch.Tensor:
    """What the data holder backpropagates: the loss times the run's scale."""
    return loss * scale if scale != 1.0 else loss


@torch.no_grad()
def unscale_gradients(grads: Iterable[torch.Tensor], scale: float) -> bool:
    """Divide `grads` in place by `scale`; True when every value is finite (no fp16 overflow).

    One device sync for all tensors, not one per tensor.
    """
    grads = list(grads)
    if not grads:
        return True
    if scale != 1.0:
        for g in grads:
            g.div_(scale)
    finite = torch.stack([torch.isfinite(g).all() for g in grads]).all()
    return bool(finite)
