"""`TrainConfig`: how every stage of a run computes (the `[train]` table of a run.toml).

```toml
[train]
precision = "auto"     # auto (bf16 on a GPU with native bf16, else fp32) / fp32 / bf16 / fp16
recompute = "auto"     # blocks: recompute each block's activations in the backward; none; auto: by model size
loss_scale = 1024.0    # fp16 runs only: the run-wide static loss scale (peers.precision)
```
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from peers.precision import DEFAULT_LOSS_SCALE, REQUESTED_PRECISIONS, RequestedPrecision, check_loss_scale

Recompute = Literal["auto", "blocks", "none"]
RECOMPUTES: tuple[str, ...] = ("auto", "blocks", "none")
RECOMPUTE_BY_DEFAULT: frozenset[str] = frozenset({"500m", "1.5b"})
"""Flavors whose activations at their full context do not fit a 24-80 GiB GPU without recomputation
(BENCHMARKS.md, "Measured memory per stage (recompute)")."""


@dataclass(frozen=True)
class TrainConfig:
    """Precision and activation recomputation, the same for every stage of a run."""

    precision: RequestedPrecision = "auto"
    """Autocast of the compute: auto, fp32, bf16 or fp16 (fp16 scales the loss by `loss_scale`)."""
    recompute: Recompute = "auto"
    """Activation recomputation: "blocks" keeps one tensor per block and recomputes the rest in the backward,
    "none" keeps them all, "auto" is blocks for the 500m and 1.5b flavors."""
    loss_scale: float = DEFAULT_LOSS_SCALE
    """Static loss scale of fp16 runs, a power of two (ignored otherwise)."""

    def validate(self) -> None:
        """Raise ValueError naming the field that is wrong."""
        if self.precision not in REQUESTED_PRECISIONS:
            raise ValueError(f"train.precision must be one of {', '.join(REQUESTED_PRECISIONS)}, "
                             f"got {self.precision!r}")
        if self.recompute not in RECOMPUTES:
            raise ValueError(f"train.recompute must be one of {', '.join(RECOMPUTES)}, got {self.recompute!r}")
        check_loss_scale(self.loss_scale)

    def recompute_blocks(self, flavor: str) -> bool:
        """Whether stages of a `flavor` model recompute their blocks."""
        return self.recompute == "blocks" or (self.recompute == "auto" and flavor in RECOMPUTE_BY_DEFAULT)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> TrainConfig:
        """Build from untrusted plain data (a TOML table, a run spec); unknown keys are refused."""
        if not isinstance(data, dict):
            raise ValueError(f"[train] must be a table, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown field(s) train.{', train.'.join(sorted(unknown))}")
        cfg = cls(**data)
        cfg.validate()
        return cfg
