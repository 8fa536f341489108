"""`IterationResult`: what one peer did in one iteration (losses, tokens, backward passes, what broke)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class IterationResult:
    """What this peer did in one iteration."""

    iteration: int
    loss_sum: float = 0.0
    losses: int = 0
    """Microbatches whose loss this peer computed (data holders)."""
    loss_of: dict[int, float] = field(default_factory=dict)
    """Each of those microbatches' loss."""
    tokens: int = 0
    backward_done: int = 0
    started: float = field(default_factory=time.time)
    finished: float = 0.0
    dropped: int = 0
    """Messages refused (not matching the schedule, or refused by the worker)."""
    detours: int = 0
    """Forwards this peer sent around a gone peer."""
    broken: int = 0
    """Microbatch attempts this peer found unable to finish (reported to their data holder)."""
    requeued: list[tuple[int, int]] = field(default_factory=list)
    """(microbatch, attempt) of each microbatch of this holder's run again after a peer on its path died."""
    stale: int = 0
    """Messages of a re-queued microbatch's earlier attempt, dropped."""
    left_out: int = 0
    """Messages and stashed forwards of microbatches whose holder the scheduler declared gone, dropped unrun."""
