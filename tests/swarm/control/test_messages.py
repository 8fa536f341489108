"""The typed control messages round-trip through their msgpack payloads, and decoding trusts nothing: a wrong type,
range, size, version or topic is one WireError naming the field; unknown fields are ignored."""

from __future__ import annotations

import math

import msgpack
import pytest

from scheduler.path_rules import PathRules
from scheduler.schedule import Route, Schedule
from swarm.constants import MAX_GOSSIPED_SCHEDULE_BYTES, MAX_SHARDS, WIRE_VERSION
from swarm.control.gossip import GossipMessage, membership_topic, progress_topic
from swarm.control.messages import (
    MESSAGE_TYPES,
    Admitted,
    Alive,
    Benched,
    Broken,
    Commit,
    Done,
    Faulty,
    Finished,
    Gone,
    Join,
    Leave,
    NotDialable,
    Pace,
    Ping,
    Pong,
    Refused,
    ScheduleNotice,
    SitOut,
    Stuck,
    Unreachable,
    Unrecoverable,
    as_gossip,
    decode,
    encode,
    received,
)
from swarm.wire import ScheduleMsg, WireError

POSITION = {"holder": 1, "num_holders": 3, "epoch": 0, "cursor": 12}
EXAMPLES = [
    Join(peer="QmA"), Leave(peer="QmA"), Gone(peers=("QmB", "QmC"), iteration=4, epoch=2),
    Finished(iterations=9, epoch=1),
    Finished(iterations=3, epoch=0, stopped=True), Stuck(peer="QmA", iteration=4, epoch=1),
    Broken(peer="QmA", iteration=4, epoch=1, microbatch=7, attempt=1, gone="QmB", maybe_ran=True, why="late"),
    Unrecoverable(peer="QmA", iteration=4, epoch=1, microbatch=7, why="no detour"), Unreachable(peer="QmB"),
    ScheduleNotice(epoch=5), ScheduleNotice(epoch=5, schedule=b"\x83an epoch"), Alive(epoch=5, iteration=12),
    Done(peer="QmA", iteration=4, epoch=1, loss_sum=3.5, losses=4, tokens=1024, started=10.0, finished=11.5,
         shards={"1": POSITION}, dropped=2, operations=24, compute=1.75),
    Pace(peer="QmB", iteration=4, epoch=1, operations=12, compute=0.5),
    Commit(iteration=4, epoch=1, shards={"1": POSITION}),
    Faulty(peer="QmA", suspect="QmB", iteration=4, epoch=1, why="weight cut"),
    Admitted(peer="QmA", cert=b"\x85signed"), Refused(peer="QmA", why="its join token is not this run's"),
    NotDialable(peer="QmA", tried=("/ip4/192.168.1.11/tcp/4001",), relay=True),
    SitOut(peer="QmA", partner="QmB", stage=2, seconds=60.0), Benched(peer="QmA", iteration=12, seconds=300.0),
    Ping(peer="QmA", nonce=2**61 + 5), Pong(nonce=2**61 + 5),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_msgpack(message):
    payload = msgpack.unpackb(msgpack.packb(encode(message)))
    assert payload["type"] == type(message).__name__.lower() and payload["version"] == WIRE_VERSION
    assert decode(message.TOPIC, payload) == message
    assert decode(message.TOPIC, {**payload, "from_a_newer_peer": [1, 2]}) == message  # unknown fields ignored
    assert received(as_gossip(message, "run", "QmSender"), "run") == message


def test_every_message_type_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(MESSAGE_TYPES.values())


@pytest.mark.parametrize("topic, payload, field", [
    ("membership", [1, 2], "control"),
    ("membership", {"version": WIRE_VERSION, "peer": "QmA"}, "control.type"),
    ("membership", {"type": "shutdown", "version": WIRE_VERSION}, "control.type"),
    ("membership", {"type": "commit", "version": WIRE_VERSION, "iteration": 1, "epoch": 0}, "control.type"),
    ("membership", {"type": "join", "version": WIRE_VERSION + 1, "peer": "QmA"}, "join: wire version"),
    ("membership", {"type": "join", "version": WIRE_VERSION, "peer": 7}, "join.peer"),
    ("membership", {"type": "join", "version": WIRE_VERSION, "peer": "x" * 500}, "join.peer"),
    ("membership", {"type": "stuck", "version": WIRE_VERSION, "peer": "QmA", "iteration": 3.0, "epoch": 0},
     "stuck.iteration"),
    ("membership", {"type": "stuck", "version": WIRE_VERSION, "peer": "QmA", "iteration": True, "epoch": 0},
     "stuck.iteration"),
    ("membership", {"type": "stuck", "version": WIRE_VERSION, "peer": "QmA", "iteration": 1, "epoch": -1},
     "stuck.epoch"),
    ("membership", {"type": "sitout", "version": WIRE_VERSION, "peer": "QmA", "partner": "QmB", "stage": 1,
                    "seconds": float("inf")}, "sitout.seconds"),
    ("membership", {"type": "sitout", "version": WIRE_VERSION, "peer": "QmA", "partner": "QmB", "stage": -1,
                    "seconds": 60.0}, "sitout.stage"),
    ("membership", {"type": "broken", "version": WIRE_VERSION, "peer": "QmA", "iteration": 1, "epoch": 0,
                    "microbatch": 1, "attempt": 99, "gone": "QmB"}, "broken.attempt"),
    ("membership", {"type": "broken", "version": WIRE_VERSION, "peer": "QmA", "iteration": 1, "epoch": 0,
                    "microbatch": 1, "attempt": 0, "gone": "QmB", "maybe_ran": 1}, "broken.maybe_ran"),
    ("membership", {"type": "gone", "version": WIRE_VERSION, "peers": "QmB", "iteration": 1}, "gone.peers"),
    ("progress", {"type": "done", "version": WIRE_VERSION, "peer": "QmA", "iteration": 1, "epoch": 0,
                  "loss_sum": "1.5", "losses": 1, "tokens": 1, "started": 0.0, "finished": 1.0}, "done.loss_sum"),
    ("progress", {"type": "done", "version": WIRE_VERSION, "peer": "QmA", "iteration": 1, "epoch": 0,
                  "loss_sum": 1.5, "losses": 1, "tokens": 1, "started": 0.0, "finished": 1.0, "compute": -2.0},
     "done.compute"),
    ("progress", {"type": "done", "version": WIRE_VERSION, "peer": "QmA", "iteration": 1, "epoch": 0,
                  "loss_sum": 1.5, "losses": 1, "tokens": 1, "started": float("inf"), "finished": 1.0},
     "done.started"),
    ("progress", {"type": "pace", "version": WIRE_VERSION, "peer": "QmA", "iteration": 1, "epoch": 0,
                  "operations": 0, "compute": 1.0}, "pace.operations"),
    ("progress", {"type": "pace", "version": WIRE_VERSION, "peer": "QmA", "iteration": 1, "epoch": 0,
                  "operations": 3, "compute": float("nan")}, "pace.compute"),
    ("membership", {"type": "pace", "version": WIRE_VERSION, "peer": "QmA", "iteration": 1, "epoch": 0,
                    "operations": 3, "compute": 1.0}, "control.type"),
    ("progress", {"type": "commit", "version": WIRE_VERSION, "iteration": 1, "epoch": 0,
                  "shards": {b"0": POSITION}}, "commit.shards"),
    ("progress", {"type": "commit", "version": WIRE_VERSION, "iteration": 1, "epoch": 0,
                  "shards": {"x": POSITION}}, "commit.shards"),
    ("progress", {"type": "commit", "version": WIRE_VERSION, "iteration": 1, "epoch": 0,
                  "shards": {"0": {**POSITION, "cursor": -1}}}, "commit.shards[0].cursor"),
    ("progress", {"type": "commit", "version": WIRE_VERSION, "iteration": 1, "epoch": 0,
                  "shards": {str(k): POSITION for k in range(MAX_SHARDS + 1)}}, "commit.shards"),
    ("schedule", {"type": "schedulenotice", "version": WIRE_VERSION, "epoch": 3,
                  "schedule": b"x" * (MAX_GOSSIPED_SCHEDULE_BYTES + 1)}, "schedulenotice.schedule"),
    ("schedule", {"type": "schedulenotice", "version": WIRE_VERSION, "epoch": 3, "schedule": "an epoch"},
     "schedulenotice.schedule"),
    ("membership", {"type": "ping", "version": WIRE_VERSION, "peer": "QmA", "nonce": -1}, "ping.nonce"),
    ("membership", {"type": "pong", "version": WIRE_VERSION, "nonce": 2**64}, "pong.nonce"),
    ("membership", {"type": "pong", "version": WIRE_VERSION, "nonce": "7"}, "pong.nonce"),
    ("membership", {"type": "notdialable", "version": WIRE_VERSION, "peer": "QmA", "tried": ["x" * 600]},
     "notdialable.tried"),
    ("membership", {"type": "notdialable", "version": WIRE_VERSION, "peer": "QmA", "tried": ["/ip4/a"] * 33},
     "notdialable.tried"),
    ("membership", {"type": "notdialable", "version": WIRE_VERSION, "peer": "QmA", "tried": [], "relay": 1},
     "notdialable.relay"),
])
def test_a_malformed_message_is_one_wire_error_naming_the_field(topic, payload, field):
    with pytest.raises(WireError) as e:
        decode(topic, payload)
    assert str(e.value).startswith(field), str(e.value)


def test_a_notice_carries_its_epoch_where_it_fits_and_is_parsed_strictly():
    route = Route(microbatch=0, origin="a", stages=(1,), peers=("b",))
    epoch = Schedule(epoch=4, rules=PathRules(num_stages=2, stages_per_path=2), placement={"a": 0, "b": 1},
                     memory={"a": 2, "b": 2}, routes=(route,), meta={"start_iteration": 9})
    msg = ScheduleMsg.from_schedule(epoch)
    notice = decode("schedule", msgpack.unpackb(msgpack.packb(encode(ScheduleNotice.of(msg)))))
    assert notice.epoch == 4 and notice.carried() == msg
    too_small = ScheduleNotice.of(msg, limit=len(msg.to_msgpack()) - 1)
    assert too_small == ScheduleNotice(epoch=4) and too_small.carried() is None  # read from the DHT instead
    with pytest.raises(WireError, match="announces epoch 5 and carries epoch 4"):
        ScheduleNotice(epoch=5, schedule=msg.to_msgpack()).carried()


def test_a_diverged_loss_is_reported_as_it_is():
    payload = encode(Done(peer="QmA", iteration=1, epoch=0, loss_sum=float("nan"), losses=1, tokens=1, started=0.0,
                          finished=1.0))
    assert math.isnan(decode("progress", payload).loss_sum)


def test_a_message_on_another_runs_topic_is_refused():
    msg = GossipMessage(topic=membership_topic("other"), sender="QmA", seqno=1, payload=encode(Join(peer="QmA")))
    with pytest.raises(WireError, match="not one of run"):
        received(msg, "run")
    commit = GossipMessage(topic=progress_topic("run"), sender="QmA", seqno=1, payload=encode(Join(peer="QmA")))
    with pytest.raises(WireError, match="not a progress message"):
        received(commit, "run")


def test_a_position_keeps_its_seek_fields_only_when_all_are_there():
    """A holder taking a shard over seeks to the chunk a commit names, instead of re-reading the pass (peers.data)."""
    seek = {"chunk": 3, "doc": 1200, "file": 0, "offset": 5_000_000_000, "token": 17}
    full = Commit(iteration=4, epoch=1, shards={"1": {**POSITION, **seek}})
    assert decode("progress", encode(full)).shards == full.shards
    partial = {**POSITION, "chunk": 3, "doc": 1200}
    assert decode("progress", encode(Commit(iteration=4, epoch=1, shards={"1": partial}))).shards == {"1": POSITION}
    with pytest.raises(WireError, match=r"commit.shards\[1\].offset"):
        decode("progress", encode(Commit(iteration=4, epoch=1, shards={"1": {**POSITION, **seek, "offset": -1}})))
