"""The numbers one plan is made for: forward time of each peer at each stage and one message's time on each link.

Planner, baselines and simulator all read these tables, so they agree by construction. Tables come from
a `SwarmView` (live measurements or a profile) or directly from a reference-style instance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.constants import (
    BACKWARD_FACTOR,
    JITTER_QUANTILES,
    LOSS_FACTOR,
    MAX_JITTER_SAMPLES,
    MAX_JITTER_SECONDS,
)
from scheduler.swarm_view import ModelCost, SwarmView


@dataclass(frozen=True)
class CostTables:
    """Per-peer compute and per-link message times, indexed like `ids`."""

    ids: tuple[str, ...]
    forward: np.ndarray
    """[peer, stage] seconds of one microbatch's forward pass."""
    message: np.ndarray
    """[peer, peer] seconds of one activation (or gradient) message, overhead included; 0 on the diagonal."""
    memory: np.ndarray
    """[peer] activations it may hold awaiting backward (TC1)."""
    backward_factor: float = BACKWARD_FACTOR
    loss_factor: float = LOSS_FACTOR
    op_gap: float = 0.0
    """Seconds a peer stays busy after each operation (bookkeeping the runtime does between ops)."""
    inject_gap: float = 0.0
    """Seconds a data holder stays busy after injecting a microbatch (replaces op_gap for that op)."""
    loss: np.ndarray | None = None
    """[peer] seconds of its loss step where measured (data holders differ: device, load); None = loss_factor
    times its stage-0 forward for every peer."""
    jitter: np.ndarray | None = None
    """[k] measured deviations (seconds, either sign) of one message's time from its link's typical time, pooled
    over the swarm: on a shared or loaded network a few tens of milliseconds reorder the queues the planner counted
    on. `expected_makespan` draws each message's deviation from these; None = not measured (no jitter)."""

    def __post_init__(self) -> None:
        n = len(self.ids)
        if self.forward.ndim != 2 or self.forward.shape[0] != n:
            raise ValueError(f"forward must be [{n}, stages], got {self.forward.shape}")
        if self.message.shape != (n, n):
            raise ValueError(f"message must be [{n}, {n}], got {self.message.shape}")
        if self.memory.shape != (n,) or np.any(self.memory < 1):
            raise ValueError("memory must give every peer at least 1 slot")
        if np.any(self.forward < 0) or np.any(self.message < 0) or not np.all(np.isfinite(self.message)):
            raise ValueError("forward and message times must be finite and non-negative")
        if self.loss is not None and (self.loss.shape != (n,) or np.any(self.loss < 0) or
                                      not np.all(np.isfinite(self.loss))):
            raise ValueError(f"loss must give [{n}] finite non-negative seconds")
        if self.jitter is not None and (self.jitter.ndim != 1 or len(self.jitter) > MAX_JITTER_SAMPLES or
                                        not np.all(np.abs(self.jitter) <= MAX_JITTER_SECONDS)):
            raise ValueError(f"jitter must be at most {MAX_JITTER_SAMPLES} deviations of at most "
                             f"{MAX_JITTER_SECONDS:g} s")

    def loss_times(self) -> np.ndarray:
        """[peer] seconds of one microbatch's loss step."""
        return self.loss if self.loss is not None else self.loss_factor * self.forward[:, 0]

    @property
    def num_peers(self) -> int:
        return len(self.ids)

    @property
    def num_stages(self) -> int:
        return self.forward.shape[1]

    def index(self, peer_id: str) -> int:
        try:
            return self.ids.index(peer_id)
        except ValueError:
            raise KeyError(f"unknown peer id {peer_id}") from None

    @classmethod
    def from_view(cls, view: SwarmView, model: ModelCost, *, op_gap: float = 0.0) -> CostTables:
        """Tables for `model` on `view`."""
        forward = view.forward_seconds(model)
        measured = np.array([p.loss_seconds for p in view.peers], dtype=float)
        jitter = [d for p in view.peers for d in p.message_jitter]
        return cls(
            ids=tuple(view.ids),
            forward=forward,
            message=view.message_seconds(model.activation_bytes),
            memory=np.array([p.memory_slots for p in view.peers]),
            loss_factor=model.loss_factor,
            op_gap=op_gap,
            loss=np.where(measured > 0, measured, model.loss_factor * forward[:, 0]) if np.any(measured > 0) else None,
            jitter=pooled_jitter(jitter),
        )

    def isolated_route_seconds(self, nodes: list[int], stages: list[int]) -> float:
        """Time of one microbatch alone on `nodes` (origin first, stage 0 first), back to the origin.

        The METHOD.md formula, generalised to per-peer and per-stage forward times.
        """
        fwd = sum(self.forward[v, s] for v, s in zip(nodes, stages))
        hops = sum(self.message[a, b] for a, b in zip(nodes, nodes[1:])) + self.message[nodes[-1], nodes[0]]
        origin = nodes[0]
        return (1 + self.backward_factor) * fwd + self.loss_times()[origin] + 2 * hops


def tables_to_dict(tables: CostTables) -> dict:
    """Plain data (JSON/msgpack-safe) for a schedule file, so `simulate` can re-create the swarm it was made for."""
    return {
        "ids": list(tables.ids),
        "forward": tables.forward.tolist(),
        "message": tables.message.tolist(),
        "memory": [int(m) for m in tables.memory],
        "backward_factor": tables.backward_factor,
        "loss_factor": tables.loss_factor,
        "op_gap": tables.op_gap,
        "inject_gap": tables.inject_gap,
        **({"loss": tables.loss.tolist()} if tables.loss is not None else {}),
        **({"jitter": tables.jitter.tolist()} if tables.jitter is not None else {}),
    }


def tables_from_dict(data: object) -> CostTables:
    """Inverse of `tables_to_dict`, for untrusted input: raises ValueError naming the bad field."""
    if not isinstance(data, dict):
        raise ValueError("costs must be an object")
    ids = data.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError("costs.ids must be a list of peer ids")
    try:
        forward = np.array(data.get("forward"), dtype=float)
        message = np.array(data.get("message"), dtype=float)
        memory = np.array(data.get("memory"), dtype=int)
        factors = {k: float(data.get(k, d)) for k, d in (("backward_factor", BACKWARD_FACTOR),
                                                         ("loss_factor", LOSS_FACTOR), ("op_gap", 0.0),
                                                         ("inject_gap", 0.0))}
        loss = np.array(data["loss"], dtype=float) if data.get("loss") is not None else None
        jitter = np.array(data["jitter"], dtype=float) if data.get("jitter") is not None else None
    except (TypeError, ValueError):
        raise ValueError("costs.forward, costs.message, costs.memory, costs.loss and costs.jitter must be numeric "
                         "arrays") from None
    return CostTables(ids=tuple(ids), forward=forward, message=message, memory=memory, loss=loss, jitter=jitter,
                      **factors)


def jitter_quantiles(deviations: np.ndarray | list[float], k: int = JITTER_QUANTILES) -> tuple[float, ...]:
    """`k` evenly spaced quantiles (midpoints) of measured deviations, seconds: what a peer publishes."""
    return tuple(float(q) for q in np.quantile(np.asarray(deviations, dtype=float), (np.arange(k) + 0.5) / k))


def pooled_jitter(deviations: list[float]) -> np.ndarray | None:
    """The swarm's jitter samples from every peer's measured deviations (evenly thinned to the limit), or None."""
    if not deviations:
        return None
    pooled = np.sort(np.asarray(deviations, dtype=float))
    if len(pooled) > MAX_JITTER_SAMPLES:
        pooled = pooled[np.linspace(0, len(pooled) - 1, MAX_JITTER_SAMPLES).round().astype(int)]
    return np.clip(pooled, -MAX_JITTER_SECONDS, MAX_JITTER_SECONDS)
