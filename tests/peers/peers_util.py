"""Helpers for the peers tests: a very small model, hand-built schedules, random microbatches."""

from __future__ import annotations

import torch

from peers.model import ModelConfig
from scheduler.path_rules import PathRules
from scheduler.schedule import Route, Schedule

MICRO = ModelConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, ffn_dim=32, max_seq_len=16)
"""Small enough that a whole in-process iteration takes milliseconds."""


def make_schedule(placement: dict[str, int], routes: list[tuple[str, tuple[int, ...], tuple[str, ...]]], *,
                  stages_per_path: int | None = None, memory: int = 3, max_swaps: int = 2) -> Schedule:
    """A schedule from a placement and (origin, stages, peers) triples, numbered in order."""
    num_stages = max(placement.values()) + 1
    rules = PathRules(num_stages=num_stages, stages_per_path=stages_per_path or num_stages, max_swaps=max_swaps)
    return Schedule(epoch=0, rules=rules, placement=placement, memory=dict.fromkeys(placement, memory),
                    routes=tuple(Route(microbatch=i, origin=o, stages=s, peers=p)
                                 for i, (o, s, p) in enumerate(routes)))


def random_batches(n: int, cfg: ModelConfig = MICRO, batch: int = 2, seq: int = 8, seed: int = 0
                   ) -> dict[int, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {i: torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=gen) for i in range(n)}
