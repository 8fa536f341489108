"""What a peer tells its transport to expect: the schedule's sender at each hop, the run's shape, its own stage
group's averaging, a newer epoch from a placed peer; everything else is refused before its buffer exists."""

from __future__ import annotations

from swarm.peer.inbound_checks import InboundChecks
from swarm.wire import Direction, HopHeader

SHAPE = (8, 64, 128)


def forward(route, hop: int, **kwargs) -> HopHeader:
    fields = dict(run="plan-test", iteration=3, microbatch=route.microbatch, route=route.nodes, hop=hop,
                  direction=Direction.FORWARD, epoch=0, dtype="float32", shape=SHAPE,
                  stages=(0, *route.stages))
    return HopHeader(**{**fields, **kwargs})


def test_only_the_scheduled_sender_of_a_hop_and_the_runs_shape_are_expected(schedule):
    route = next(r for r in schedule.routes if len(r.peers) >= 2)
    me, previous = route.peers[1], route.peers[0]
    checks = InboundChecks(me, "plan-test", SHAPE, lambda: (schedule, None))
    header = forward(route, 2)
    assert checks.expects(previous, header) is None
    stranger = next(p for p in schedule.placement if p not in route.nodes)
    assert "the schedule says" in checks.expects(stranger, header)
    assert "shape" in checks.expects(previous, forward(route, 2, shape=(2**20, 2**20)))
    # a newer epoch than any known, from a placed peer: its sender adopted it first
    assert checks.expects(previous, forward(route, 2, epoch=7)) is None
    assert "not one this peer knows" in checks.expects("QmNobody", forward(route, 2, epoch=7))


def test_averaging_only_from_the_stage_group_and_state_left_to_the_gate(schedule):
    stage = next(st for st in set(schedule.placement.values()) if len(schedule.stage_peers(st)) >= 2)
    me, mate = schedule.stage_peers(stage)[:2]
    other = next(p for p, st in schedule.placement.items() if st != stage)
    checks = InboundChecks(me, "plan-test", SHAPE, lambda: (schedule, None))

    def average(sender: str, direction=Direction.AVERAGE) -> HopHeader:
        return HopHeader(run="plan-test", iteration=3, microbatch=0, route=(sender, me), hop=1, direction=direction,
                         epoch=0, dtype="float32", shape=(10,), stages=(stage, stage))

    assert checks.expects(mate, average(mate)) is None
    assert "stage group" in checks.expects(other, average(other))
    assert checks.expects(other, average(other, Direction.STATE)) is None  # the state gate decides
    checks.expect_state([mate])
    assert checks.state_gate.admits(mate) and not checks.state_gate.admits(other)
    checks.online()
    assert not checks.state_gate.admits(mate)


def test_a_joiner_not_placed_yet_takes_what_members_send_it_first(schedule):
    """Its placement reaches the peers that send to it before it: refused, their averages would not come again (the
    transport has already refused anyone not admitted)."""
    route = next(r for r in schedule.routes if len(r.peers) >= 2)
    checks = InboundChecks("QmJoiner", "plan-test", SHAPE, lambda: (None, None))
    assert checks.expects(route.peers[0], forward(route, 2, epoch=3)) is None
    assert "shape" in checks.expects(route.peers[0], forward(route, 2, epoch=3, shape=(2**20, 2**20)))
