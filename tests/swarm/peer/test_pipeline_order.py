"""The executor chooses its next operation as the planner's simulator does, so measured iterations follow the plan.

A relay's `PipelineExecutor` is fed scripted arrivals (what its transport would deliver, one batch per call of
`receive`); the order of its sends shows the order of its operations.
"""

from __future__ import annotations

import pytest
import torch

from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker
from scheduler.path_rules import PathRules
from scheduler.schedule import Route, Schedule
from swarm.net.delivery import Inbound
from swarm.peer.pipeline import PipelineExecutor
from swarm.wire import Direction, HopHeader

pytestmark = pytest.mark.timeout(60)

MODEL = ModelConfig(vocab_size=64, dim=16, n_layers=2, n_heads=2, ffn_dim=32, max_seq_len=16)
RUN = "order"
PLACEMENT = {"h0": 0, "r1": 1}
ROUTE = ("h0", "r1")


def schedule(microbatches: int, memory: int) -> Schedule:
    rules = PathRules(num_stages=2, stages_per_path=2, max_swaps=0, max_swap_distance=1)
    return Schedule(epoch=0, rules=rules, placement=dict(PLACEMENT), memory=dict.fromkeys(PLACEMENT, memory),
                    routes=tuple(Route(microbatch=i, origin="h0", stages=(1,), peers=("r1",))
                                 for i in range(microbatches)), run_id=RUN)


def message(mb: int, direction: Direction) -> Inbound:
    # the relay is hop 1 both ways; its previous hop (forward) and next one (backward, after the loss) are h0
    header = HopHeader(run=RUN, iteration=0, microbatch=mb, route=ROUTE, hop=1, direction=direction, epoch=0,
                       dtype="", shape=(), stages=(0, 1))
    return Inbound("h0", header, torch.randn(2, 8, MODEL.dim, dtype=torch.float64))


def run_relay(arrivals: list[list[Inbound]], *, microbatches: int, memory: int) -> list[tuple[str, int]]:
    """The relay's operations, in order, as (direction of what it sent, microbatch)."""
    sent: list[tuple[str, int]] = []
    worker = StageWorker("r1", 1, MODEL, (1, 1), OptimConfig(), dtype=torch.float64, seed=0, memory_slots=memory)
    ex = PipelineExecutor(me="r1", worker=worker, schedule=schedule(microbatches, memory), run_id=RUN, iteration=0,
                          send=lambda peer, h, t: sent.append((h.direction.name.lower(), h.microbatch)))
    script = iter(arrivals)

    def receive(timeout: float) -> list[Inbound]:
        return next(script, [])

    ex.run(receive, deadline=10)
    return sent


def test_a_backward_arriving_during_an_operation_runs_before_forwards_that_arrived_earlier():
    # mb 0's forward, then mbs 1 and 2 together; mb 0's backward arrives while mb 1's forward runs
    f = {mb: message(mb, Direction.FORWARD) for mb in range(3)}
    b = {mb: message(mb, Direction.BACKWARD) for mb in range(3)}
    arrivals = [[f[0]], [], [f[1], f[2]], [], [b[0]], [], [b[1]], [b[2]]]
    order = run_relay(arrivals, microbatches=3, memory=4)
    assert order == [("forward", 0), ("forward", 1), ("backward", 0), ("forward", 2), ("backward", 1),
                     ("backward", 2)]


def test_forwards_wait_for_a_free_memory_slot_and_then_run_in_arrival_order():
    f = {mb: message(mb, Direction.FORWARD) for mb in range(3)}
    b = {mb: message(mb, Direction.BACKWARD) for mb in range(3)}
    arrivals = [[f[2], f[0], f[1]], [], [b[2]], [], [], [b[0]], [], [], [b[1]]]
    order = run_relay(arrivals, microbatches=3, memory=1)
    assert order == [("forward", 2), ("backward", 2), ("forward", 0), ("backward", 0), ("forward", 1),
                     ("backward", 1)]
