"""What the transport hands a peer's loops, and how they hand it messages to send.

`Inbound` is a message that arrived and passed the wire checks; `Undelivered` is one of this peer's own that the
transport could not deliver, handed back to whoever sent it; `Send` is the one signature every sender takes.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from swarm.wire import HopHeader


@dataclass(frozen=True)
class Inbound:
    """One accepted message: who sent it, its header, its tensor."""

    sender: str
    header: HopHeader
    tensor: torch.Tensor


@dataclass(frozen=True)
class Undelivered:
    """A message of this peer's that the transport could not hand to `peer`, back to the executor that sent it.

    `unreachable` when it certainly never arrived (no stream to the peer could be opened); otherwise the peer may
    have received it (a timeout, a refusal).
    """

    peer: str
    header: HopHeader
    tensor: torch.Tensor
    unreachable: bool


Send = Callable[[str, HopHeader, torch.Tensor], "Future[bool] | None"]
"""send(peer_id, header, tensor): hand a message to the transport. It may return before delivery with a future
that resolves to whether the message was delivered (a failure also comes back to the executor as `Undelivered`);
None means delivered."""
