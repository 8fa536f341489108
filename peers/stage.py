"""Which decoder layers each pipeline stage owns, and the stage module built from that.

Stage 0 is special (METHOD.md): it holds the token embedding, its own blocks, the final norm and
the LM head, so every microbatch starts and ends at a data holder. Stages 1..S-1 hold blocks only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

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


def build_stage(cfg: ModelConfig, split: Sequence[int], stage: int, *, seed: int = 0,
                recompute: bool = False) -> Transformer:
    """The model minus what `stage` does not own; parameter names are the full model's.

    :param recompute: recompute each block's activations in the backward instead of keeping them
      (`Transformer.recompute`)
    """
    split = check_split(split, cfg.n_layers)
    return Transformer(cfg, layers=stage_layers(split, stage), with_embedding=stage == 0, with_head=stage == 0,
                       seed=seed, recompute=recompute)


def stage_template(cfg: ModelConfig, split: Sequence[int], stage: int) -> dict[str, torch.Size]:
    """Parameter names and shapes of `stage`, without allocating it."""
    with torch.device("meta"):
        return {k: v.shape for k, v in build_stage(cfg, split, stage).state_dict().items()}


def neighbour_blocks(module: Transformer, neighbour: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights for `module`'s stage made of a neighbouring stage's decoder blocks (its k-th block for this
    stage's k-th, cycling if it has fewer), and `module`'s own embedding and head where it has them.

    How a stage that lost every peer restarts when no checkpoint of it exists: a copy of the adjacent blocks
    starts far closer to the trained network than a fresh initialisation (layers of a residual stream change
    slowly from one to the next).
    """
    theirs = sorted({int(k.split(".")[1]) for k in neighbour if k.startswith("layers.")})
    if not theirs:
        raise ValueError("the neighbouring stage has no decoder blocks")
    out = {k: v.detach().clone() for k, v in module.state_dict().items()}
    for k, mine in enumerate(module.layer_ids):
        src = theirs[k % len(theirs)]
        for name in [n for n in out if n.startswith(f"layers.{mine}.")]:
            rest = name[len(f"layers.{mine}."):]
            t = neighbour.get(f"layers.{src}.{rest}")
            if t is None or t.shape != out[name].shape:
                raise ValueError(f"the neighbouring stage's block {src} has no {rest} of shape "
                                 f"{tuple(out[name].shape)}")
            out[name] = t.detach().to(out[name].dtype).clone()
    return out
