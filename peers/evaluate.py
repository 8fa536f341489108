"""Validation perplexity of the whole model, and with stages omitted (the paper's robustness test).

Omitting stages: stage 0 (embedding, its blocks, head) always runs; of the non-zero stages a random
sorted subset of size round((1 - omit) * (S - 1)) runs, drawn afresh for each validation batch from
a seeded generator, so two models are compared on the same subsets.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from peers.model import Transformer, lm_loss
from peers.stage import check_split, stage_layers


@dataclass(frozen=True)
class EvalResult:
    loss: float
    perplexity: float
    loss_omitted: float | None = None
    perplexity_omitted: float | None = None
    omit: float = 0.0
    """Fraction of the non-zero stages omitted in the second figure."""
    kept_stages: int | None = None
    """Non-zero stages that ran in the second figure."""

    def to_dict(self) -> dict[str, float | int | None]:
        return {"loss": self.loss, "perplexity": self.perplexity, "loss_omitted": self.loss_omitted,
                "perplexity_omitted": self.perplexity_omitted, "omit": self.omit, "kept_stages": self.kept_stages}


@torch.no_grad()
def mean_loss(model: Transformer, batches: Sequence[torch.Tensor], layer_orders: Sequence[Sequence[int]] | None = None
              ) -> float:
    """Token-weighted mean loss over `batches` (B, T+1); batch i runs the layers `layer_orders[i]` (all by default)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for i, batch in enumerate(batches):
        batch = batch.to(device)
        h = model.embed(batch[:, :-1])
        h = model.run_layers(h, None if layer_orders is None else layer_orders[i])
        n = batch[:, 1:].numel()
        total += float(lm_loss(model.logits(h), batch[:, 1:])) * n
        count += n
    model.train(was_training)
    if count == 0:
        raise ValueError("no validation batches to evaluate on")
    return total / count


def omitted_layer_orders(split: Sequence[int], omit: float, num_batches: int, seed: int = 0
                         ) -> tuple[list[list[int]], int]:
    """Per batch, stage 0's layers then those of a random sorted subset of the non-zero stages."""
    split = tuple(split)
    if not 0.0 <= omit <= 1.0:
        raise ValueError(f"omit must be a fraction in [0, 1], got {omit}")
    nonzero = list(range(1, len(split)))
    keep = round((1.0 - omit) * len(nonzero))
    rng = random.Random(seed)
    orders = []
    for _ in range(num_batches):
        stages = [0, *sorted(rng.sample(nonzero, keep))]
        orders.append([layer for s in stages for layer in stage_layers(split, s)])
    return orders, keep


def evaluate(model: Transformer, batches: Sequence[torch.Tensor], split: Sequence[int], *, omit: float = 0.0,
             seed: int = 0) -> EvalResult:
    """Perplexity of the whole model, and (when omit > 0) with that fraction of non-zero stages omitted."""
    split = check_split(split, model.config.n_layers)
    if model.tok_embeddings is None or model.norm is None or len(model.layers) != model.config.n_layers:
        raise ValueError("evaluation needs the whole model (every stage's weights)")
    loss = mean_loss(model, batches)
    if omit <= 0:
        return EvalResult(loss=loss, perplexity=math.exp(loss))
    orders, keep = omitted_layer_orders(split, omit, len(batches), seed)
    loss_o = mean_loss(model, batches, orders)
    return EvalResult(loss=loss, perplexity=math.exp(loss), loss_omitted=loss_o, perplexity_omitted=math.exp(loss_o),
                      omit=omit, kept_stages=keep)
