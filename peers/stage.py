"""Which decoder layers each pipeline stage owns, and the stage module built from that.

Stage 0 is special (METHOD.md): it holds the token embedding, its own blocks, the final norm and
the LM head, so every microbatch starts and ends at a data holder. Stages 1..S-1 hold blocks only.
"""

from __future__ import annotations

from collections.abc import Sequence

from peers.model import ModelConfig, Transformer


def balanced_split(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible, earlier stages taking the remainder (as the planner's ModelCost)."""
    if num_stages < 1 or num_layers < num_stages:
        raise ValueError(f"cannot split {num_layers} layers into {num_stages} stages (each stage needs a layer)")
    base, extra = divmod(num_layers, num_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(num_stages))


def check_split(split: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """Validate a configured split: one positive count per stage, summing to the model's layers."""
    split = tuple(split)
    if not split or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in split):
        raise ValueError(f"layer split must be positive integers, one per stage, got {list(split)}")
    if sum(split) != num_layers:
        raise ValueError(f"layer split {list(split)} covers {sum(split)} layers, the model has {num_layers}")
    return split


def stage_layers(split: Sequence[int], stage: int) -> list[int]:
    """Indices of the decoder layers owned by `stage` under `split`."""
    if not 0 <= stage < len(split):
        raise ValueError(f"stage {stage} outside 0..{len(split) - 1}")
    start = sum(split[:stage])
    return list(range(start, start + split[stage]))


def build_stage(cfg: ModelConfig, split: Sequence[int], stage: int, *, seed: int = 0) -> Transformer:
    """The model minus what `stage` does not own; parameter names are the full model's."""
    split = check_split(split, cfg.n_layers)
    return Transformer(cfg, layers=stage_layers(split, stage), with_embedding=stage == 0, with_head=stage == 0,
                       seed=seed)
