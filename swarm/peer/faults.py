"""`tamper`: a peer that misbehaves on purpose (``skippipe-peer join --fault KIND``), to test a swarm's defences.

It changes what the peer sends to its stage group, as the Byzantine members the defences are built against would:
its averaging contribution scaled by -1e6, one coordinate set to 3e38 (finite, but it overflows any sum), or an
honest contribution claimed over 2^40 visits; "byzantine" takes them in turn, one kind each iteration. With
"corrupt-activations" it is a relay that passes on activations with non-finite values instead, and with
"withhold-activations" one that takes forwards and never passes them on, while answering every probe; with
"withhold-state" a veteran that never sends its stage's state to a joiner. With "crash-mid-average" it is a host
that dies in the middle of a stage averaging round: in the first round from iteration `CRASH_ITERATION` on that it
brings visits to, its gradients go to the first stage mate only, and the process kills itself (SIGKILL)
`CRASH_DELAY` seconds later (its helpers die with it). Everything else it does honestly. Never use it on a run you
care about.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import replace

import torch

from swarm.constants import FAULTS
from swarm.wire import Direction, HopHeader

logger = logging.getLogger(__name__)

CRASH_ITERATION = 3
"""The iteration whose averaging round a "crash-mid-average" peer dies in."""
CRASH_DELAY = 3.0
"""Seconds between its one averaging message and its exit: time for that message to arrive whole."""

Tamper = Callable[[HopHeader, torch.Tensor], tuple[HopHeader, torch.Tensor] | None]
"""A message as it is to be sent, or None: not sent at all (the sender believes it delivered)."""


def tamper(fault: str) -> Tamper:
    """What a peer with `fault` does to each message it is about to send."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    kinds = FAULTS[:3]
    crash = threading.Event()

    def apply(header: HopHeader, tensor: torch.Tensor) -> tuple[HopHeader, torch.Tensor] | None:
        relayed = header.direction == Direction.FORWARD and header.hop != 1  # not its own microbatch's injection
        if fault == "withhold-activations":
            return None if relayed else (header, tensor)
        if fault == "withhold-state":
            return None if header.direction == Direction.STATE else (header, tensor)
        if fault == "crash-mid-average":
            if header.direction != Direction.AVERAGE or header.iteration < CRASH_ITERATION or not header.weight:
                return header, tensor  # (a round it brings no visits to would not split its group)
            if crash.is_set():
                return None
            crash.set()
            logger.warning("fault crash-mid-average: gradients of iteration %d to %s only; exiting in %.0f s",
                           header.iteration, header.target, CRASH_DELAY)
            threading.Timer(CRASH_DELAY, os.kill, args=(os.getpid(), signal.SIGKILL)).start()
            return header, tensor
        if fault == "corrupt-activations":
            if relayed:
                tensor = tensor.clone()
                tensor.view(-1)[::7] = float("nan")
            return header, tensor
        if header.direction != Direction.AVERAGE:
            return header, tensor
        kind = kinds[header.iteration % len(kinds)] if fault == "byzantine" else fault
        if kind == "scale-gradients":
            return header, tensor * -1e6
        if kind == "huge-gradients":
            tensor = tensor.clone()
            tensor.view(-1)[0] = 3e38
            return header, tensor
        return replace(header, weight=2**40), tensor

    return apply
