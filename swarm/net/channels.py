"""The transport's kinds of traffic: one p2pd protocol each, and which message directions each carries.

Each kind has a protocol of its own (and so streams, a bounded queue and a consumer of its own: a flood of one kind
never holds up another) and carries only its own directions; probes have a protocol too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import torch

from swarm.wire import Direction, HopHeader

Channel = Literal["hop", "average", "state"]

HOP_PROTOCOL = "skippipe.hop.v2"
"""Pipeline messages: forwards and backwards."""
AVERAGE_PROTOCOL = "skippipe.average.v1"
"""A stage group member's gradient sums for the group's all-gather."""
STATE_PROTOCOL = "skippipe.state.v1"
"""A stage's weights and optimizer state for a peer joining or moving to it."""
PROBE_PROTOCOL = "skippipe.probe.v1"
CHANNELS: dict[Channel, tuple[str, frozenset[Direction]]] = {
    "hop": (HOP_PROTOCOL, frozenset({Direction.FORWARD, Direction.BACKWARD})),
    "average": (AVERAGE_PROTOCOL, frozenset({Direction.AVERAGE})),
    "state": (STATE_PROTOCOL, frozenset({Direction.STATE})),
}
"""Channel -> (its protocol, the directions it carries)."""
PROTOCOLS = (*(protocol for protocol, _ in CHANNELS.values()), PROBE_PROTOCOL)

OnReceive = Callable[[str, HopHeader, torch.Tensor], None]
"""``on_receive(sender_peer_id, header, tensor)``, called in one worker thread per channel, one message at a time."""


def channel_of(direction: Direction) -> Channel:
    """The channel that carries messages of `direction`."""
    return next(name for name, (_, directions) in CHANNELS.items() if direction in directions)


def consumers(on_receive: OnReceive | Mapping[Channel, OnReceive]) -> dict[Channel, OnReceive]:
    """One consumer per channel: those given, or the one given for all."""
    handlers = on_receive if isinstance(on_receive, Mapping) else dict.fromkeys(CHANNELS, on_receive)
    if set(handlers) != set(CHANNELS):
        raise ValueError(f"on_receive needs a consumer for each of {sorted(CHANNELS)}, got {sorted(handlers)}")
    return dict(handlers)
