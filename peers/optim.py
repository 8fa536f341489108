"""AdamW with weight decay on matrices only, and the warmup + cosine learning-rate schedule.

The schedule is a pure function of the step, so every peer of a stage group (and a resumed run)
computes the same learning rate without sharing any scheduler object.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule of every stage."""

    lr: float = 1e-3
    """Peak learning rate, reached at the end of warmup (the paper's 500M run: 4e-4)."""
    min_lr_ratio: float = 0.1
    """Learning rate at the end of the cosine decay, as a fraction of `lr`."""
    warmup_steps: int = 10
    """Steps of linear warmup; step 0 already uses lr / warmup_steps so the first update is not zero."""
    total_steps: int = 1000
    """Steps after which the learning rate stays at its minimum."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay, applied to 2-D weights only (not norms)."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Max gradient norm of a stage's parameters; 0 disables clipping."""
    fused: bool = False
    """Use torch's fused AdamW kernel where the parameters are on CUDA (one launch per step); elsewhere the plain
    per-parameter loop."""

    def validate(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"optim.lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps < 0 or self.total_steps < 1:
            raise ValueError("optim.warmup_steps must be >= 0 and optim.total_steps >= 1")
        if self.weight_decay < 0 or self.grad_clip < 0 or self.eps <= 0:
            raise ValueError("optim.weight_decay and optim.grad_clip must be >= 0, optim.eps > 0")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError("optim.beta1 and optim.beta2 must be in [0, 1)")
        if not isinstance(self.fused, bool):
            raise ValueError(f"optim.fused must be true or false, got {self.fused!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> OptimConfig:
        if not isinstance(data, dict):
            raise ValueError(f"optim config must be a table, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown optim config field(s): {', '.join(sorted(unknown))}")
        cfg = cls(**data)
        cfg.validate()
        return cfg


def lr_at(step: int, cfg: OptimConfig) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine to min_lr_ratio * lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def build_optimizer(module: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over `module`'s parameters; decay on matrices (dim >= 2), none on norm gains.

    Its state (moments) takes the parameters' dtype: float32 master weights keep float32 moments whatever the
    autocast precision. `cfg.fused` takes effect only when every parameter is a CUDA float tensor.
    """
    cfg.validate()
    decay = [p for p in module.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in module.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    params = decay + no_decay
    if cfg.fused and params and all(p.is_cuda and p.is_floating_point() for p in params):
        return torch.optim.AdamW(groups, lr=lr_at(0, cfg), betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=True)
    # foreach=False: the same per-parameter arithmetic whatever the grouping, so a split model
    # updates bit-for-bit like the unsplit one
    return torch.optim.AdamW(groups, lr=lr_at(0, cfg), betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             foreach=False)
