"""The in-process training loop: iterations, periodic validation, checkpoints, one metrics record each.

Shared by `skippipe swarm inprocess` and the benchmarks, so both measure the same thing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from peers.checkpoint import save_checkpoint
from peers.evaluate import evaluate
from peers.inprocess import InProcessSwarm

logger = logging.getLogger(__name__)


def validation_loss(swarm: InProcessSwarm, max_batches: int | None = 8, *, omit: float = 0.0,
                    seed: int = 0) -> dict[str, Any]:
    """Validation loss and perplexity of the swarm's current model (and with `omit` of the stages omitted)."""
    if swarm.corpus is None:
        raise ValueError("validation needs a corpus")
    batches = swarm.corpus.validation_batches(max_batches)
    return evaluate(swarm.full_model(), batches, swarm.split, omit=omit, seed=seed).to_dict()


def train_loop(swarm: InProcessSwarm, iterations: int, *, eval_every: int = 10, eval_batches: int | None = 8,
               checkpoint_dir: str | Path | None = None,
               on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run `swarm` until it has completed `iterations` iterations in total (a resumed swarm continues).

    Validation runs every `eval_every` iterations (0: never in between) and after the last; a
    checkpoint is written at each validation when `checkpoint_dir` is set.

    :returns: one record per iteration: iteration, loss, tokens_per_s, lr, seconds, and val_loss /
      val_perplexity on the iterations that were evaluated
    """
    records = []
    while swarm.iteration < iterations:
        stats = swarm.run_iteration()
        record: dict[str, Any] = {
            "iteration": stats.iteration,
            "loss": round(stats.loss, 6),
            "tokens_per_s": round(stats.tokens_per_second, 1),
            "lr": next(iter(stats.steps.values())).lr if stats.steps else None,
            "seconds": round(stats.seconds, 4),
            "time": round(time.time(), 3),
        }
        if not torch.isfinite(torch.tensor(stats.loss)):
            raise FloatingPointError(f"training loss became {stats.loss} at iteration {stats.iteration}")
        if (eval_every and stats.iteration % eval_every == 0) or stats.iteration == iterations:
            if swarm.corpus is not None:
                val = validation_loss(swarm, eval_batches)
                record["val_loss"] = round(val["loss"], 6)
                record["val_perplexity"] = round(val["perplexity"], 4)
            if checkpoint_dir is not None:
                save_checkpoint(checkpoint_dir, swarm)
                logger.info("checkpoint written to %s at iteration %d", checkpoint_dir, stats.iteration)
        records.append(record)
        if on_record is not None:
            on_record(record)
    return records
