"""`MessagePadding`: pipeline messages carried at a bigger model's size (emulation, `swarm.message_bytes`).

A run that emulates a larger model's network load pads every activation and gradient it sends with zero rows
along the batch, to the run's wire shape (`RunConfig.wire_activation_shape`), and strips them on receipt before
anything else reads the tensor: the computation sees the real microbatch, the links carry the emulated bytes,
and the receiver's shape check (`InboundChecks`) expects the padded shape, so nothing else gets through.
"""

from __future__ import annotations

import torch


class MessagePadding:
    """Pads tensors of `rows` rows (dimension 0) to `wire_rows` with zeros, and strips them back.

    :raises ValueError: `rows` < 1 or `wire_rows` < `rows`
    """

    def __init__(self, rows: int, wire_rows: int) -> None:
        if not (isinstance(rows, int) and isinstance(wire_rows, int) and 1 <= rows <= wire_rows):
            raise ValueError(f"padding needs 1 <= rows <= wire_rows, got rows={rows!r}, wire_rows={wire_rows!r}")
        self.rows, self.wire_rows = rows, wire_rows

    def pad(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` (`rows` x ...) followed by zero rows up to `wire_rows` (a new CPU tensor; `tensor` is kept).

        :raises ValueError: `tensor` does not have `rows` rows
        """
        if tensor.dim() < 1 or tensor.shape[0] != self.rows:
            raise ValueError(f"a pipeline tensor of shape {list(tensor.shape)} has not {self.rows} rows to pad")
        out = torch.zeros((self.wire_rows, *tensor.shape[1:]), dtype=tensor.dtype)
        out[: self.rows] = tensor.detach().cpu()
        return out

    def strip(self, tensor: torch.Tensor) -> torch.Tensor:
        """The first `rows` rows of a received `tensor` of `wire_rows` rows, as their own tensor (the padded
        buffer is freed with the message).

        :raises ValueError: `tensor` does not have `wire_rows` rows (the transport's shape check lets none through)
        """
        if tensor.dim() < 1 or tensor.shape[0] != self.wire_rows:
            raise ValueError(f"a pipeline tensor of shape {list(tensor.shape)} has not the {self.wire_rows} padded "
                             "rows of this run's messages")
        return tensor[: self.rows].clone()
