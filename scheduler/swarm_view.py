"""What the planner knows about the swarm: peers (speed, memory) and the directed links between them.

Built from live measurements by the swarm layer, from a network profile, or from a file. Links may be
asymmetric. Everything is validated on construction, so a bad measurement or file fails here with a
message naming the peer or link, not deep inside the planner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scheduler.constants import (
    DEFAULT_MEMORY_SLOTS,
    DEFAULT_MESSAGE_OVERHEAD_SECONDS,
    JITTER_QUANTILES,
    LOSS_FACTOR,
    MAX_JITTER_SECONDS,
)


@dataclass(frozen=True)
class PeerSpec:
    """One peer as the planner sees it."""

    id: str
    seconds_per_layer: float
    """Forward time of one decoder layer for one microbatch on this peer (compute speed)."""
    memory_slots: int = DEFAULT_MEMORY_SLOTS
    """Activations it may hold awaiting backward (TC1)."""
    region: str = ""
    data_holder: bool = False
    """Holds a data shard: pinned to stage 0."""
    loss_seconds: float = 0.0
    """Measured time of its loss step (LM head, loss, its backward) for one microbatch; 0 = not measured (the
    model's loss factor times its stage-0 forward)."""
    message_jitter: tuple[float, ...] = ()
    """Quantiles of how much the messages it received deviated from their link's typical time (seconds); empty =
    not measured. The cost tables pool every peer's."""

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("peer id must be a non-empty string")
        if not (self.seconds_per_layer > 0 and np.isfinite(self.seconds_per_layer)):
            raise ValueError(f"peer {self.id}: seconds_per_layer must be positive, got {self.seconds_per_layer}")
        if self.memory_slots < 1:
            raise ValueError(f"peer {self.id}: memory_slots must be >= 1, got {self.memory_slots}")
        if not (self.loss_seconds >= 0 and np.isfinite(self.loss_seconds)):
            raise ValueError(f"peer {self.id}: loss_seconds must be finite and >= 0, got {self.loss_seconds}")
        if len(self.message_jitter) > JITTER_QUANTILES or not all(
                abs(d) <= MAX_JITTER_SECONDS for d in self.message_jitter):
            raise ValueError(f"peer {self.id}: message_jitter must be at most {JITTER_QUANTILES} deviations of at "
                             f"most {MAX_JITTER_SECONDS:g} s")


@dataclass(frozen=True)
class ModelCost:
    """The model as the planner sees it: layers per stage and bytes on the wire."""

    layers_per_stage: tuple[int, ...]
    """Decoder layers in each stage (stage 0 first); unequal sizes allowed."""
    activation_bytes: int
    """Bytes of one microbatch's activation (and of its gradient) between stages."""
    stage_param_bytes: tuple[int, ...] = ()
    """Bytes of each stage's parameters, for the data-parallel (averaging) cost; empty = ignore."""
    head_layers: float = 0.0
    """Extra forward work at stage 0 for embedding, final norm and LM head, in layer-equivalents."""
    loss_factor: float = LOSS_FACTOR
    """Time of the loss step (head, loss, its backward) relative to the stage-0 forward (measured by peers)."""

    def __post_init__(self) -> None:
        if not self.layers_per_stage or any(n < 0 for n in self.layers_per_stage):
            raise ValueError(f"layers_per_stage must be non-empty and non-negative, got {self.layers_per_stage}")
        if self.activation_bytes <= 0:
            raise ValueError(f"activation_bytes must be positive, got {self.activation_bytes}")
        if self.stage_param_bytes and len(self.stage_param_bytes) != len(self.layers_per_stage):
            raise ValueError("stage_param_bytes must have one entry per stage")
        if not (self.loss_factor >= 0 and np.isfinite(self.loss_factor)):
            raise ValueError(f"loss_factor must be finite and >= 0, got {self.loss_factor}")

    @property
    def num_stages(self) -> int:
        return len(self.layers_per_stage)

    @classmethod
    def balanced(cls, num_layers: int, num_stages: int, activation_bytes: int,
                 param_bytes_per_layer: int = 0) -> ModelCost:
        """Split `num_layers` as evenly as possible, earlier stages taking the remainder."""
        if num_stages < 1 or num_layers < num_stages:
            raise ValueError(f"cannot split {num_layers} layers into {num_stages} stages")
        base, extra = divmod(num_layers, num_stages)
        layers = tuple(base + (1 if s < extra else 0) for s in range(num_stages))
        params = tuple(n * param_bytes_per_layer for n in layers) if param_bytes_per_layer else ()
        return cls(layers_per_stage=layers, activation_bytes=activation_bytes, stage_param_bytes=params)


@dataclass
class SwarmView:
    """Peers plus directed link latency (s) and bandwidth (bytes/s) matrices indexed like `peers`."""

    peers: list[PeerSpec]
    latency: np.ndarray
    bandwidth: np.ndarray
    message_overhead: float = DEFAULT_MESSAGE_OVERHEAD_SECONDS
    """Fixed seconds per message (serialisation, host-device copies), on top of latency and transfer."""
    _index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.peers)
        self.latency = np.asarray(self.latency, dtype=float)
        self.bandwidth = np.asarray(self.bandwidth, dtype=float)
        self._index = {}
        for i, p in enumerate(self.peers):
            if p.id in self._index:
                raise ValueError(f"peer id {p.id} appears twice")
            self._index[p.id] = i
        for name, m in (("latency", self.latency), ("bandwidth", self.bandwidth)):
            if m.shape != (n, n):
                raise ValueError(f"{name} matrix must be {n}x{n}, got {m.shape}")
            if not np.all(np.isfinite(m)):
                raise ValueError(f"{name} matrix has non-finite entries")
        off = ~np.eye(n, dtype=bool)
        if np.any(self.latency[off] < 0):
            i, j = np.argwhere((self.latency < 0) & off)[0]
            raise ValueError(f"negative latency on link {self.peers[i].id} -> {self.peers[j].id}")
        if np.any(self.bandwidth[off] <= 0):
            i, j = np.argwhere((self.bandwidth <= 0) & off)[0]
            raise ValueError(f"non-positive bandwidth on link {self.peers[i].id} -> {self.peers[j].id}")
        if self.message_overhead < 0:
            raise ValueError("message_overhead must be >= 0")

    def __len__(self) -> int:
        return len(self.peers)

    def index(self, peer_id: str) -> int:
        try:
            return self._index[peer_id]
        except KeyError:
            raise KeyError(f"unknown peer id {peer_id}") from None

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.peers]

    def message_seconds(self, nbytes: int) -> np.ndarray:
        """Cost of one message of `nbytes` on every link: latency + bytes/bandwidth + overhead."""
        n = len(self.peers)
        with np.errstate(divide="ignore"):
            cost = self.latency + nbytes / np.where(self.bandwidth > 0, self.bandwidth, np.inf) + self.message_overhead
        cost[np.arange(n), np.arange(n)] = 0.0
        return cost

    def forward_seconds(self, model: ModelCost) -> np.ndarray:
        """[peer, stage] forward time of one microbatch (stage 0 includes the head's work)."""
        speed = np.array([p.seconds_per_layer for p in self.peers])
        layers = np.array(model.layers_per_stage, dtype=float)
        layers[0] += model.head_layers
        return speed[:, None] * layers[None, :]

    def subset(self, peer_ids: list[str]) -> SwarmView:
        """The view restricted to `peer_ids` (after departures), in that order."""
        idx = [self.index(p) for p in peer_ids]
        return SwarmView(
            peers=[self.peers[i] for i in idx],
            latency=self.latency[np.ix_(idx, idx)],
            bandwidth=self.bandwidth[np.ix_(idx, idx)],
            message_overhead=self.message_overhead,
        )
