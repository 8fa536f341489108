"""Wire records: round trips, and every kind of hostile input rejected with one WireError (no processes)."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
import torch

from scheduler.path_rules import PathRules
from scheduler.schedule import Route, Schedule
from swarm.constants import MAX_TENSOR_BYTES, WIRE_VERSION
from swarm.wire import (
    AverageStep,
    Direction,
    HopHeader,
    PeerRecord,
    PeerState,
    RunSpec,
    ScheduleMsg,
    SignedRecord,
    TensorDescriptor,
    WireError,
    decode_tensor,
    encode_tensor,
    pack,
    unpack,
)

PEER_A, PEER_B, PEER_C = "QmPeerA", "QmPeerB", "QmPeerC"


def header(**changes) -> HopHeader:
    h = HopHeader(run="run1", iteration=3, microbatch=7, route=(PEER_A, PEER_B, PEER_C), hop=1,
                  direction=Direction.FORWARD, epoch=2, dtype="float32", shape=(2, 16, 64), stages=(0, 2, 1))
    return dataclasses.replace(h, **changes)


def schedule(epoch: int = 4) -> Schedule:
    return Schedule(epoch=epoch, rules=PathRules(num_stages=3, stages_per_path=3),
                    placement={PEER_A: 0, PEER_B: 1, PEER_C: 2}, memory={PEER_A: 3, PEER_B: 3, PEER_C: 3},
                    routes=(Route(microbatch=0, origin=PEER_A, stages=(1, 2), peers=(PEER_B, PEER_C)),), run_id="run1")


def repack(data: bytes, **changes) -> bytes:
    d = unpack(data, max_bytes=1 << 24)
    for k, v in changes.items():
        if v is ...:
            d.pop(k)
        else:
            d[k] = v
    return pack(d)


# ---- round trips -------------------------------------------------------------------------------------------------
def test_records_round_trip():
    h = header(restore_dtype="float32", dtype="bfloat16", sent_at=1796055206.4553084, attempt=2,
               counted=(1, 3), lineage=bytes(range(16)), chunk=2, chunks=5, average_step=AverageStep.PART_MEAN)
    assert HopHeader.from_msgpack(h.to_msgpack()) == h
    assert h.origin == PEER_A and h.target == PEER_B
    rec = PeerRecord(peer_id=PEER_A, stage=0, seconds_per_layer=0.01, memory_slots=3,
                     links={PEER_B: (0.002, 1.5e8)}, addresses=("/ip4/127.0.0.1/tcp/1",), state=PeerState.ONLINE,
                     data_holder=True, jitter=(-0.004, 0.0, 0.012))
    assert PeerRecord.from_msgpack(rec.to_msgpack()) == rec
    for reachability in ("public", "relayed", "unreachable"):
        told = dataclasses.replace(rec, reachability=reachability)
        assert PeerRecord.from_msgpack(told.to_msgpack()) == told
    spec = RunSpec(run_id="run1", model={"flavor": "tiny", "n_layer": 4, "dims": [1, 2.5, None, True]}, stages=3,
                   skip_ratio=0.33, hyperparameters={"lr": 4e-4}, data={"path": "corpus"}, coordinator=PEER_A)
    assert RunSpec.from_msgpack(spec.to_msgpack()) == spec
    msg = ScheduleMsg.from_schedule(schedule())
    back = ScheduleMsg.from_msgpack(msg.to_msgpack())
    assert back == msg and back.to_schedule() == schedule()


def test_unknown_optional_fields_are_ignored():
    h = header()
    assert HopHeader.from_msgpack(repack(h.to_msgpack(), future_field={"x": 1})) == h
    rec = PeerRecord(peer_id=PEER_A, stage=-1, seconds_per_layer=1.0, memory_slots=1)
    assert PeerRecord.from_msgpack(repack(rec.to_msgpack(), region="eu")) == rec


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "bool", "uint8"])
@pytest.mark.parametrize("shape", [(), (0, 3), (5,), (2, 3, 4)])
def test_tensor_round_trip_bit_exact(dtype, shape):
    t = (torch.randn(shape) * 100).to(getattr(torch, dtype)) if dtype != "bool" else torch.rand(shape) > 0.5
    desc, data = encode_tensor(t)
    assert desc == TensorDescriptor(dtype=dtype, shape=tuple(shape)) and len(data) == desc.nbytes
    back = decode_tensor(TensorDescriptor.from_msgpack(desc.to_msgpack()), bytes(data))
    assert back.dtype == t.dtype and back.shape == t.shape
    assert bytes(encode_tensor(back)[1]) == bytes(data)  # bit-exact, NaN payloads and signed zeros included


@pytest.mark.parametrize("wire_dtype", ["float16", "bfloat16"])
def test_wire_compression_halves_bytes(wire_dtype):
    t = torch.randn(4, 8)
    desc, data = encode_tensor(t, wire_dtype=wire_dtype)
    assert desc.dtype == wire_dtype and len(data) == t.numel() * 2
    back = decode_tensor(desc, data)
    assert torch.equal(back, t.to(getattr(torch, wire_dtype)))
    assert encode_tensor(torch.arange(4), wire_dtype=wire_dtype)[0].dtype == "int64"  # integers are never cast


# ---- hostile input -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("blob", [b"", b"\xc1", b"\x92\x01", b"\xd9\x05ab", b"\xc7\x01\x05x", b"\xd6\xff\0\0\0\0",
                                  pack([1, 2]), pack("str"), pack(None), b"\xdf\xff\xff\xff\xff"])
def test_malformed_msgpack_rejected(blob):
    for cls in (HopHeader, PeerRecord, RunSpec, ScheduleMsg, SignedRecord, TensorDescriptor):
        with pytest.raises(WireError):
            cls.from_msgpack(blob)


def test_oversized_message_rejected_before_unpacking():
    with pytest.raises(WireError, match="exceeds"):
        HopHeader.from_msgpack(b"\x80" + b"\0" * (1 << 17))


@pytest.mark.parametrize("changes, match", [
    ({"iteration": 3.0}, "iteration: expected an integer"),
    ({"iteration": True}, "iteration: expected an integer"),
    ({"microbatch": -1}, "outside"),
    ({"hop": 3}, "hop: 3 outside"),
    ({"route": []}, "route: empty"),
    ({"route": [PEER_A, 5]}, "route"),
    ({"direction": 7}, "direction"),
    ({"dtype": "complex64"}, "dtype"),
    ({"dtype": "object"}, "dtype"),
    ({"shape": [2, -1]}, "shape"),
    ({"shape": [2.0, 3]}, "shape"),
    ({"shape": [1] * 9}, "shape"),
    ({"shape": [1 << 20, 1 << 20]}, "exceeds the limit"),
    ({"stages": [0, 1]}, "stages"),
    ({"restore_dtype": "str"}, "dtype"),
    ({"sent_at": -1.0}, "sent_at"),
    ({"sent_at": "now"}, "sent_at"),
    ({"attempt": -1}, "attempt"),
    ({"attempt": 99}, "attempt"),
    ({"counted": [0]}, "counted"),
    ({"counted": "1"}, "counted"),
    ({"counted": [1] * 1000}, "counted"),
    ({"lineage": "ab"}, "lineage"),
    ({"lineage": b"x" * 33}, "lineage"),
    ({"chunks": 0}, "chunks"),
    ({"chunks": 1 << 20}, "chunks"),
    ({"chunk": 1}, "chunk"),
    ({"average_step": 5}, "average_step"),
    ({"average_step": "piece"}, "average_step"),
    ({"version": WIRE_VERSION + 1}, "version"),
    ({"version": ...}, "version"),
    ({"run": ...}, "run"),
    ({"run": "x" * 1000}, "run"),
])
def test_bad_header_fields_rejected(changes, match):
    with pytest.raises(WireError, match=match):
        HopHeader.from_msgpack(repack(header().to_msgpack(), **changes))


def test_header_tensor_limit_is_the_receivers():
    data = header(shape=(1024, 1024)).to_msgpack()  # 4 MiB of float32
    assert HopHeader.from_msgpack(data, max_tensor_bytes=MAX_TENSOR_BYTES).shape == (1024, 1024)
    with pytest.raises(WireError, match="exceeds the limit"):
        HopHeader.from_msgpack(data, max_tensor_bytes=1 << 20)


@pytest.mark.parametrize("wire, restore, ok", [
    ("bfloat16", "float32", True), ("float16", "float32", True), ("float16", "bfloat16", True),
    ("uint8", "float64", False), ("float16", "float64", False), ("int8", "float32", False),
    ("float32", "float16", False), ("bfloat16", "bfloat16", False), ("float32", "float32", False),
])
def test_restore_dtype_only_undoes_wire_compression(wire, restore, ok):
    """A cast back may only undo float16/bfloat16 compression: at most twice the checked bytes, never float64."""
    data = header(dtype=wire, restore_dtype=restore).to_msgpack()
    if ok:
        assert HopHeader.from_msgpack(data).restore_dtype == restore
    else:
        with pytest.raises(WireError, match="restore_dtype"):
            HopHeader.from_msgpack(data)


def test_mis_sized_tensor_bytes_rejected():
    desc = TensorDescriptor(dtype="float32", shape=(4, 4))
    with pytest.raises(WireError, match="needs 64 bytes, got 60"):
        decode_tensor(desc, b"\0" * 60)
    with pytest.raises(WireError, match="other than 0 and 1"):
        decode_tensor(TensorDescriptor(dtype="bool", shape=(2,)), b"\x01\x07")
    with pytest.raises(WireError, match="exceeds the limit"):
        decode_tensor(TensorDescriptor(dtype="int64", shape=(1 << 28,)), b"")  # 2 GiB declared, nothing allocated


@pytest.mark.parametrize("changes, match", [
    ({"stage": 1.0}, "stage"),
    ({"stage": -2}, "stage"),
    ({"memory_slots": 0}, "memory_slots"),
    ({"seconds_per_layer": float("nan")}, "seconds_per_layer"),
    ({"seconds_per_layer": "fast"}, "seconds_per_layer"),
    ({"state": 4}, "state"),
    ({"links": {PEER_B: [0.1]}}, "links"),
    ({"links": {PEER_B: [0.1, -5.0]}}, "bytes_per_s"),
    ({"links": {PEER_B: [0.1, 1e6, 3]}}, "links"),
    ({"links": {f"p{i}": [0.1, 1.0] for i in range(300)}}, "limit"),
    ({"addresses": ["a"] * 100}, "addresses"),
    ({"data_holder": 1}, "data_holder"),
    ({"jitter": [0.01] * 17}, "jitter"),
    ({"jitter": [float("nan")]}, "jitter"),
    ({"jitter": [120.0]}, "jitter"),
    ({"jitter": 0.01}, "jitter"),
])
def test_bad_peer_record_rejected(changes, match):
    rec = PeerRecord(peer_id=PEER_A, stage=0, seconds_per_layer=0.01, memory_slots=3)
    with pytest.raises(WireError, match=match):
        PeerRecord.from_msgpack(repack(rec.to_msgpack(), **changes))


@pytest.mark.parametrize("changes, match", [
    ({"model": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}}, "deeper"),
    ({"model": {"a": b"\x00"}}, "bytes is not allowed"),
    ({"model": {1: 2}}, "map key"),
    ({"model": {"lr": float("inf")}}, "non-finite"),
    ({"hyperparameters": list(range(3))}, "map"),
    ({"skip_ratio": 1.0}, "skip_ratio"),
    ({"stages": 0}, "stages"),
])
def test_bad_run_spec_rejected(changes, match):
    spec = RunSpec(run_id="r", model={}, stages=3, skip_ratio=0.3, hyperparameters={}, data={}, coordinator=PEER_A)
    raw = unpack(spec.to_msgpack())
    raw.update(changes)
    with pytest.raises(WireError, match=match):
        RunSpec.from_msgpack(msgpack.packb(raw, use_bin_type=True, strict_types=False))


def test_a_schedule_carries_the_epoch_it_bridges_to_and_a_bridge_that_does_not_come_before_it_is_refused():
    newest, bridge = schedule(epoch=5), schedule(epoch=4)
    newest.meta["start_iteration"], bridge.meta["start_iteration"] = 9, 8
    back = ScheduleMsg.from_msgpack(ScheduleMsg.from_schedule(newest, bridge).to_msgpack())
    assert back.to_schedule() == newest and back.to_bridge() == bridge
    assert ScheduleMsg.from_msgpack(ScheduleMsg.from_schedule(newest).to_msgpack()).to_bridge() is None
    for epoch, start in ((5, 8), (4, 9), (6, 8)):  # not an older epoch, or not starting before it
        late = schedule(epoch=epoch)
        late.meta["start_iteration"] = start
        with pytest.raises(WireError, match="bridge"):
            ScheduleMsg.from_msgpack(ScheduleMsg.from_schedule(newest, late).to_msgpack())
    with pytest.raises(WireError, match="bridge"):
        ScheduleMsg.from_msgpack(repack(ScheduleMsg.from_schedule(newest).to_msgpack(), bridge=[1, 2]))
    for start in ("9", -1, True):
        odd = schedule(epoch=5)
        odd.meta["start_iteration"] = start
        with pytest.raises(WireError, match="start_iteration"):
            ScheduleMsg.from_msgpack(ScheduleMsg.from_schedule(odd).to_msgpack())


def test_bad_schedule_rejected():
    msg = ScheduleMsg.from_schedule(schedule(epoch=4))
    with pytest.raises(WireError, match="differs"):
        ScheduleMsg.from_msgpack(repack(msg.to_msgpack(), epoch=5))
    broken = dict(msg.schedule, placement={PEER_A: "zero"})
    with pytest.raises(WireError, match="placement"):
        ScheduleMsg.from_msgpack(repack(msg.to_msgpack(), schedule=broken))
    with pytest.raises(WireError, match="version"):
        ScheduleMsg.from_msgpack(repack(msg.to_msgpack(), schedule=dict(msg.schedule, version=99)))
