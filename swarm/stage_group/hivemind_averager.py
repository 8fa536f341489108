"""Average a stage group's gradients with hivemind's DecentralizedAverager, weighted by microbatches processed.

Peers serving the same stage meet under the DHT prefix ``skippipe/<run>/stage<s>/avg`` and all-reduce. Each
brings the mean gradient over the microbatches it processed and their count as its weight, so the result is the
mean over every microbatch the group processed, however unevenly they were spread: the reference divided by the
group size instead. A round has a deadline; a peer that finds no partner before it keeps its own gradient.

Not Byzantine-robust: hivemind's all-reduce takes every member's tensors and weight as sent, so one member can
drag the mean anywhere (or stop the group stepping with one huge value). Runs with volunteers they do not trust use
the default all-gather (`swarm.stage_group.allgather`), which bounds weights by the schedule, refuses gradients far
outside the stage's history and combines the rest with CenteredClip.

Process rules (hivemind's): the averager is an ``mp.Process`` of its own, so it cannot be created inside a daemon
process, and inside a spawned child it needs ``multiprocessing.set_start_method("fork", force=True)`` first.
Compression is none or float16: hivemind's 8-bit quantizers break on numpy >= 2.4.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from hivemind import DHT
from hivemind.averaging import DecentralizedAverager
from hivemind.compression import Float16Compression, NoCompression

from swarm.constants import AVERAGING_TIMEOUT
from swarm.events import event

logger = logging.getLogger(__name__)


class _Averager(DecentralizedAverager):
    """hivemind's averager, closing its p2pd client on shutdown (hivemind leaves its socket file behind)."""

    async def _shutdown(self, timeout: float | None) -> None:
        try:
            await super()._shutdown(timeout)
        finally:
            await self._p2p.shutdown()


@dataclass(frozen=True)
class AveragingResult:
    averaged: bool
    """False when no group formed before the deadline (the tensors were left as they were)."""
    group_size: int
    """Peers in the round, this one included (1 when not averaged)."""
    total_weight: float
    """Sum of the weights (microbatches) of the group."""


class StageAverager:
    """One peer's membership in its stage group's averaging rounds.

    :param dht: the peer's started DHT
    :param tensors: templates (shape, dtype) of what will be averaged, e.g. the stage's gradients
    :param target_group_size: peers per round; None = as many as show up during matchmaking
    :param min_matchmaking_time: how long to wait for peers to join a round
    :param compression: "none" or "float16" on the wire
    """

    def __init__(self, dht: DHT, *, run_id: str, stage: int, tensors: Sequence[torch.Tensor],
                 target_group_size: int | None = None, min_group_size: int = 2, min_matchmaking_time: float = 2.0,
                 request_timeout: float = 1.0, compression: Literal["none", "float16"] = "none"):
        if compression not in ("none", "float16"):
            raise ValueError(f"compression must be 'none' or 'float16', got {compression!r}")
        self.prefix = f"skippipe/{run_id}/stage{stage}/avg"
        buffers = [torch.zeros_like(t, device="cpu") for t in tensors]
        self._averager = _Averager(
            buffers, dht, prefix=self.prefix, start=True, target_group_size=target_group_size,
            min_group_size=min_group_size, min_matchmaking_time=min_matchmaking_time,
            request_timeout=request_timeout,
            compression=Float16Compression() if compression == "float16" else NoCompression(),
        )

    def average(self, tensors: Sequence[torch.Tensor], weight: float, *,
                timeout: float = AVERAGING_TIMEOUT) -> AveragingResult:
        """Replace ``tensors`` in place by the group's weighted mean, if a group forms within ``timeout``.

        :param weight: microbatches this peer processed since the last round (0 = contribute nothing)
        """
        if not weight >= 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        with self._averager.get_tensors() as buffers:
            if len(buffers) != len(tensors):
                raise ValueError(f"expected {len(buffers)} tensors, got {len(tensors)}")
            for buf, t in zip(buffers, tensors, strict=True):
                buf.copy_(t.detach())
        try:
            gathered = self._averager.step(weight=float(weight), gather=float(weight), timeout=timeout)
        except Exception as e:  # hivemind raises assorted errors when a round breaks down
            logger.warning("%s: averaging round failed: %s: %s", self.prefix, type(e).__name__, e,
                           extra=event("averaging_failed", group=self.prefix, why=f"{type(e).__name__}: {e}"))
            gathered = None
        if not gathered:
            logger.warning("%s: no averaging group within %.1fs, keeping the local tensors", self.prefix, timeout,
                           extra=event("averaging_failed", group=self.prefix, why="no group"))
            return AveragingResult(averaged=False, group_size=1, total_weight=float(weight))
        with self._averager.get_tensors() as buffers, torch.no_grad():
            for buf, t in zip(buffers, tensors, strict=True):
                t.copy_(buf)
        return AveragingResult(averaged=True, group_size=len(gathered), total_weight=float(sum(gathered.values())))

    def shutdown(self) -> None:
        self._averager.shutdown()
