"""Stage-group messages larger than one wire message: cut into chunks by the sender, put back together by the receiver.

A stage's gradients (AVERAGE) and state (STATE parts) grow with the model: the first of six stages of the 1.5B
model holds 349M parameters, 1.3 GiB of float32 gradients and 2.6 GiB of AdamW moments, past what a receiver takes
in one message (`MAX_TENSOR_BYTES`, checked before it allocates) and past what a slow link sends within one
message's deadline. The outbox cuts such a flat tensor into `chunks` pieces of at most the run's `swarm.chunk_bytes`
(`cut`), sent as separate messages (`HopHeader.chunk`, `HopHeader.chunks`); the inbox keeps the pieces of each
series until all have arrived and files the whole message (`Reassembly`), so whoever receives it sees one message,
as before.

A receiver holds at most one unfinished series per sender, direction, part and averaging step
(`HopHeader.average_step`), and at most `max_bytes` (the run's largest stage message: `largest_stage_message`) of
unfinished series per sender and direction in all: a new series replaces an unfinished one (its sender died
mid-series, or moved on to a later iteration), and a piece that does not fit its series (another dtype, a piece
twice, sizes that do not add up, more than the sender may hold) drops the series. A stage-group member can thus make
a receiver hold no more than honest traffic does.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from peers.model import ModelConfig
from peers.stage import balanced_split, stage_template
from swarm.constants import CHUNK_BYTES
from swarm.net.delivery import Inbound
from swarm.wire import Direction, HopHeader

logger = logging.getLogger(__name__)

CHUNKED = (Direction.AVERAGE, Direction.STATE)
"""Directions whose messages are cut (pipeline messages are activations: never near the limit)."""
OPTIMIZER_BYTES_PER_PARAM = 8
"""The largest stage message per parameter: a state transfer's AdamW moments (two float32 values)."""


def cut(header: HopHeader, tensor: torch.Tensor,
        chunk_bytes: int = CHUNK_BYTES) -> list[tuple[HopHeader, torch.Tensor]]:
    """The message as pieces of at most `chunk_bytes` (itself, when it fits one): a tensor of more is flattened and
    cut into `chunks` pieces of equal length but the last, numbered by `chunk`."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes <= chunk_bytes or header.direction not in CHUNKED:
        return [(header, tensor)]
    flat = tensor.reshape(-1)
    chunks = math.ceil(nbytes / chunk_bytes)
    per = math.ceil(flat.numel() / chunks)
    return [(replace(header, chunk=i, chunks=chunks), flat[i * per:(i + 1) * per]) for i in range(chunks)]


def largest_stage_message(model: ModelConfig, stages: int) -> int:
    """Bytes of the largest stage-group message of a run of `model` over `stages` stages (a state transfer's
    moments of its largest stage): what a receiver must be able to put back together."""
    split = balanced_split(model.n_layers, stages)
    params = max(sum(math.prod(s) for s in stage_template(model, split, st).values()) for st in range(stages))
    return OPTIMIZER_BYTES_PER_PARAM * params


@dataclass
class _Series:
    key: tuple
    """(iteration, epoch, chunks, dtype) of the message the pieces make."""
    pieces: dict[int, torch.Tensor] = field(default_factory=dict)
    nbytes: int = 0


class Reassembly:
    """The pieces of chunked messages, by sender, direction and part, into whole messages (see the module).

    :param max_bytes: most bytes one series may hold (a larger one is dropped)
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.arrived: Counter[Direction] = Counter()
        """Bytes of the pieces taken so far, by direction: a receiver waiting for a large state sees it coming."""
        self._series: dict[tuple[str, Direction, int, int], _Series] = {}

    def add(self, m: Inbound) -> Inbound | None:
        """Take a piece; returns the whole message once its last piece is in (None until then, or if the piece
        was refused)."""
        h, piece = m.header, m.tensor
        where = (m.sender, h.direction, h.microbatch, h.average_step)
        key = (h.iteration, h.epoch, h.chunks, piece.dtype)
        series = self._series.get(where)
        if series is None or series.key != key:
            series = self._series[where] = _Series(key)  # a new series replaces an unfinished one
        nbytes = piece.numel() * piece.element_size()
        held = sum(x.nbytes for w, x in self._series.items() if w[:2] == where[:2])
        why = "not flat" if piece.dim() != 1 else f"piece {h.chunk} twice" if h.chunk in series.pieces else \
            f"over {self.max_bytes} bytes from one sender" if held + nbytes > self.max_bytes else None
        if why is not None:
            del self._series[where]
            logger.warning("dropped a chunked %s message of iteration %d from %s: %s", h.direction.name.lower(),
                           h.iteration, m.sender, why)
            return None
        series.pieces[h.chunk] = piece
        series.nbytes += nbytes
        self.arrived[h.direction] += nbytes
        if len(series.pieces) < h.chunks:
            return None
        del self._series[where]
        pieces = [series.pieces[i] for i in range(h.chunks)]
        if any(p.numel() != pieces[0].numel() for p in pieces[:-1]) or pieces[-1].numel() > pieces[0].numel():
            logger.warning("dropped a chunked %s message of iteration %d from %s: its pieces' sizes do not add up",
                           h.direction.name.lower(), h.iteration, m.sender)
            return None
        whole = torch.cat(pieces)
        return Inbound(m.sender, replace(h, chunk=0, chunks=1, shape=tuple(whole.shape)), whole)
