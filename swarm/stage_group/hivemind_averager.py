"""Average a stage group's gradients with hivemind's DecentralizedAverager, weighted by microbatches processed.

Peers serving the same stage meet under the DHT prefix ``skippipe/<run>/stage<s>/avg`` and all-reduce. Each
brings the mean gradient over the microbatches it processed and their count as its weight, so the result is the
mean over every microbatch the group processed, however unevenly they were spread: the reference divided by the
group size instead. Matchmaking and the all-reduce each have a deadline; a peer that finds no partner before the
first keeps its own gradient, and a round still running at the second fails (the peer keeps its own gradient too).

hivemind's butterfly all-reduce tolerates a member that stops mid-round: a sender silent for `NEXT_CHUNK_TIMEOUT`
seconds is left out of the parts it was to send, and the part a silent reducer was to average stays as each
member had it (hivemind's contract). Such a round is partial: the peer installs what it received, averaged where
it arrived and its own elsewhere, and reports the fraction received (`averaging_partial`). Its stage mates then
hold slightly different weights and AdamW moments (the missing part's share of one step), which later gradient
rounds do not undo, and neither do they where a member found no group and stepped on its own gradient. So each
member tells every round whether its state may have drifted from its group's (`gather`: its weight and that flag),
and a round in which any member said so asks all its members to average their whole state (weights and moments)
after the step (`AveragingResult.resync`; `swarm.peer.stage_session` runs that round under its own prefix): copies
that drifted agree again. The request rides on what the group gathered, which every member holds alike, and not on
how the round went for one member: a round can be partial for one member and whole for another (a slow sender is
left out of one part only), and a state round asked for by one member alone would wait for mates that never come.
A member that got a partial round counts itself drifted and says so at its next round. The all-gather back-end
takes a member's gradient whole or not at all.

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
import math
import multiprocessing as mp
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from typing import Literal

import torch
from hivemind import DHT
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.group_info import GroupInfo
from hivemind.compression import Float16Compression, NoCompression

from swarm.constants import AVERAGING_TIMEOUT
from swarm.events import event

logger = logging.getLogger(__name__)

NEXT_CHUNK_TIMEOUT = 15.0
"""Seconds a member of a round may keep the others waiting for its next tensor chunk (sent, or averaged and
returned) before it is left out of the rest of the round; hivemind waits twice that for a reducer's results."""


class GroupAverager(DecentralizedAverager):
    """hivemind's averager as a stage group runs it: it records the fraction of the last round's results that
    arrived, closes its p2pd client on shutdown (hivemind leaves its socket file behind), and serves hivemind's own
    handler names.

    :param received: shared with the process that created the averager (it runs in a child process of its own)
    """

    def __init__(self, *args, received: Synchronized, **kwargs):
        self.received = received
        super().__init__(*args, **kwargs)

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        """hivemind names a handler after the class that serves it: keep hivemind's averager's name on the wire."""
        return DecentralizedAverager._get_handle_name(namespace, method_name)

    async def _run_allreduce_inplace_(self, tensors: Sequence[torch.Tensor], group_info: GroupInfo,
                                      group_id: bytes | None = None, **kwargs) -> None:
        self.received.value = 0.0
        await super()._run_allreduce_inplace_(tensors, group_info, group_id, **kwargs)
        runner = self._running_groups[group_info.group_id if group_id is None else group_id].result()
        parts = runner.tensor_part_container  # a reducer that failed left its parts as they were (zero deltas)
        self.received.value = 1.0 - parts.failed_size / max(1, parts.total_size)

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
    received: float = 1.0
    """Fraction of the averaged tensors' elements whose group mean arrived; below 1 the rest kept this peer's own
    values (a member stopped mid-round)."""
    resync: bool = False
    """One of the round's members said its state may have drifted from the group's: its members should average
    their whole state once they have stepped. Every member of the round gets the same answer (a partial round
    alone does not ask: its members may not all have seen it partial)."""


def member_report(gathered: object) -> tuple[float, bool]:
    """(microbatches, drifted) from what one member told the round (its `gather`, ``{"weight": w, "drifted": b}``):
    a weight that is not a finite non-negative number (a foreign or faulty member's) counts as none, a flag that is
    not True as not drifted."""
    if not isinstance(gathered, dict):
        return 0.0, False
    w = gathered.get("weight")
    ok = isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w) and w >= 0
    return (float(w) if ok else 0.0), gathered.get("drifted") is True


def total_weight(gathered: Iterable[object]) -> float:
    """The group's microbatches from what its members told the round (`member_report`)."""
    return float(sum(member_report(g)[0] for g in gathered))


class StageAverager:
    """One peer's membership in its stage group's averaging rounds.

    :param dht: the peer's started DHT
    :param tensors: templates (shape, dtype) of what will be averaged, e.g. the stage's gradients
    :param target_group_size: peers per round; None = as many as show up during matchmaking
    :param min_matchmaking_time: how long to wait for peers to join a round
    :param compression: "none" or "float16" on the wire
    :param name: what the group averages, in its DHT prefix ("avg": the gradients; another name, another group)
    :param round_timeout: the most seconds a round's all-reduce may take once its group formed, and the default
      (and most) a call waits for the group to form
    :param next_chunk_timeout: see `NEXT_CHUNK_TIMEOUT`
    """

    def __init__(self, dht: DHT, *, run_id: str, stage: int, tensors: Sequence[torch.Tensor],
                 target_group_size: int | None = None, min_group_size: int = 2, min_matchmaking_time: float = 2.0,
                 request_timeout: float = 1.0, compression: Literal["none", "float16"] = "none",
                 round_timeout: float = AVERAGING_TIMEOUT, next_chunk_timeout: float = NEXT_CHUNK_TIMEOUT,
                 name: str = "avg"):
        if compression not in ("none", "float16"):
            raise ValueError(f"compression must be 'none' or 'float16', got {compression!r}")
        if not name.isidentifier():
            raise ValueError(f"name must be an identifier, got {name!r}")
        self.prefix = f"skippipe/{run_id}/stage{stage}/{name}"
        if not (round_timeout > 0 and next_chunk_timeout > 0):
            raise ValueError(f"timeouts must be > 0, got {round_timeout} and {next_chunk_timeout}")
        self.round_timeout = round_timeout
        buffers = [torch.zeros_like(t, device="cpu") for t in tensors]
        self._received = mp.get_context("fork").Value("d", 1.0)
        self._averager = GroupAverager(
            buffers, dht, received=self._received, allreduce_timeout=round_timeout,
            next_chunk_timeout=next_chunk_timeout, prefix=self.prefix, start=True, target_group_size=target_group_size,
            min_group_size=min_group_size, min_matchmaking_time=min_matchmaking_time,
            request_timeout=request_timeout,
            compression=Float16Compression() if compression == "float16" else NoCompression(),
        )

    def average(self, tensors: Sequence[torch.Tensor], weight: float, *, timeout: float | None = None,
                drifted: bool = False) -> AveragingResult:
        """Replace ``tensors`` in place by the group's weighted mean, if a group forms within ``timeout`` (at most
        the round timeout): on a partial round, by the mean where it arrived and as they were elsewhere.

        :param weight: microbatches this peer processed since the last round (0 = contribute nothing)
        :param drifted: this peer's state may differ from its group's (told to the round: see `resync`)
        """
        timeout = self.round_timeout if timeout is None else min(timeout, self.round_timeout)
        if not weight >= 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        with self._averager.get_tensors() as buffers:
            if len(buffers) != len(tensors):
                raise ValueError(f"expected {len(buffers)} tensors, got {len(tensors)}")
            for buf, t in zip(buffers, tensors, strict=True):
                buf.copy_(t.detach())
        self._received.value = 1.0
        try:
            gathered = self._averager.step(weight=float(weight), gather={"weight": float(weight), "drifted": drifted},
                                           timeout=timeout)
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
        received = float(self._received.value)
        if received < 1.0:
            logger.warning("%s: partial averaging round: %.1f%% of the group mean arrived, the rest is "
                           "this peer's own",
                           self.prefix, 100 * received,
                           extra=event("averaging_partial", group=self.prefix, received=round(received, 4)))
        resync = any(member_report(g)[1] for g in gathered.values())  # the same for every member of the round
        return AveragingResult(averaged=True, group_size=len(gathered), total_weight=total_weight(gathered.values()),
                               received=received, resync=resync)

    def shutdown(self) -> None:
        self._averager.shutdown()
