"""Stage-group messages too large for one wire message: cut by the outbox, put back together by the inbox, bit for
bit and whatever order the pieces come in; a receiver holds no more than one series per sender and part, of at most
the run's largest stage message. The pieces cross a real transport (another process, real p2pd) within its limits."""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

import pytest
import torch

from peers.model import FLAVORS
from swarm.constants import MAX_TENSOR_BYTES
from swarm.net.delivery import Inbound
from swarm.peer.mailbox import Inbox, Outbox
from swarm.peer.message_chunks import Reassembly, cut, largest_stage_message
from swarm.peer.timeline import Timeline
from swarm.run_config import RunConfig
from swarm.wire import AverageStep, Direction, HopHeader
from tests.utils.swarm_workers import TRANSPORT_RUN

pytestmark = pytest.mark.timeout(120)


def header(direction: Direction = Direction.AVERAGE, *, iteration: int = 3, part: int = 0, run: str = "r",
           route: tuple[str, str] = ("a", "b")) -> HopHeader:
    return HopHeader(run=run, iteration=iteration, microbatch=part, route=route, hop=1, direction=direction,
                     epoch=0, dtype="", shape=(), stages=(1, 1), weight=2)


def pieces_of(tensor: torch.Tensor, chunk_bytes: int, **kw) -> list[Inbound]:
    return [Inbound("a", h, t.clone()) for h, t in cut(header(**kw), tensor, chunk_bytes)]


@pytest.mark.parametrize("numel", [10, 1000, 1001, 4099])
def test_a_message_cut_into_pieces_comes_back_whole_whatever_order_the_pieces_arrive_in(numel):
    flat = torch.randn(numel)
    pieces = pieces_of(flat, chunk_bytes=1024)
    assert len(pieces) == -(-numel * 4 // 1024) and all(p.header.chunks == len(pieces) for p in pieces)
    assert all(p.tensor.numel() * 4 <= 1024 for p in pieces)
    random.Random(numel).shuffle(pieces)
    assembly = Reassembly(max_bytes=numel * 4)
    got = [assembly.add(p) for p in pieces]
    assert got[:-1] == [None] * (len(pieces) - 1)
    whole = got[-1]
    assert torch.equal(whole.tensor, flat) and whole.sender == "a"
    assert whole.header == replace(header(), shape=(numel,))  # one message again, as receivers expect


def test_small_and_pipeline_messages_are_not_cut():
    assert len(cut(header(), torch.zeros(256), 1024)) == 1
    assert len(cut(header(Direction.FORWARD), torch.zeros(4096), 1024)) == 1
    assert len(cut(header(Direction.STATE, part=1), torch.zeros(1024), 1024)) == 4


def test_a_new_series_replaces_an_unfinished_one_and_parts_are_kept_apart():
    assembly = Reassembly(max_bytes=1 << 20)
    old, new = torch.randn(512), torch.randn(512)
    weights, moments = torch.randn(512), torch.randn(512)
    assert assembly.add(pieces_of(old, 1024, iteration=3)[0]) is None  # its sender moved on, or died
    for p in pieces_of(weights, 1024, direction=Direction.STATE, part=0)[:1]:
        assert assembly.add(p) is None
    *first, last = pieces_of(new, 1024, iteration=4)
    assert all(assembly.add(p) is None for p in first)
    assert torch.equal(assembly.add(last).tensor, new)
    *first, last = pieces_of(moments, 1024, direction=Direction.STATE, part=1)
    assert all(assembly.add(p) is None for p in first)
    assert torch.equal(assembly.add(last).tensor, moments)


@pytest.mark.parametrize("tamper", ["twice", "too big", "sizes", "not flat"])
def test_pieces_that_do_not_fit_their_series_drop_it(tamper):
    flat = torch.randn(1024)
    pieces = pieces_of(flat, 1024)
    assembly = Reassembly(max_bytes=4096)
    if tamper == "twice":
        pieces.insert(1, pieces[0])
    elif tamper == "too big":
        assembly.max_bytes = 4095
    elif tamper == "sizes":
        pieces[1] = Inbound("a", pieces[1].header, pieces[1].tensor[:-1])
    else:
        pieces[1] = Inbound("a", pieces[1].header, pieces[1].tensor.reshape(16, 16))
    assert all(assembly.add(p) is None for p in pieces)


def test_averaging_steps_are_kept_apart_and_a_sender_holds_no_more_than_max_bytes_in_all():
    assembly = Reassembly(max_bytes=3 * 1024)
    piece, mean = torch.randn(256), torch.randn(256)  # 1 KiB each, cut into 4 pieces of 256 bytes
    as_mean = lambda m: Inbound(m.sender, replace(m.header, average_step=AverageStep.PART_MEAN), m.tensor)  # noqa: E731
    pieces, means = pieces_of(piece, 256, part=1), [as_mean(m) for m in pieces_of(mean, 256, part=1)]
    for p, m in zip(pieces[:-1], means[:-1], strict=True):  # interleaved: one part, two steps
        assert assembly.add(p) is None and assembly.add(m) is None
    assert torch.equal(assembly.add(pieces[-1]).tensor, piece) and torch.equal(assembly.add(means[-1]).tensor, mean)
    # unfinished series of many parts: 3 KiB held from one sender, no piece more from it; others are not held up
    assert all(assembly.add(pieces_of(torch.randn(256), 256, part=k)[0]) is None for k in range(12))
    whole = torch.randn(256)
    assert all(assembly.add(p) is None for p in pieces_of(whole, 256, part=20))  # never completes
    other = [Inbound("c", p.header, p.tensor) for p in pieces_of(whole, 256, part=20)]
    assert [assembly.add(p) is None for p in other] == [True, True, True, False]


def test_a_receiver_holds_up_to_the_largest_stage_message_of_its_run():
    # the 1.5B model over 6 stages: its first stage's AdamW moments are 2.6 GiB, past one wire message
    largest = largest_stage_message(FLAVORS["1.5b"], 6)
    assert largest > 2 * MAX_TENSOR_BYTES
    assert largest_stage_message(FLAVORS["1.5b"], 8) < largest


def test_pieces_cross_a_real_transport_and_are_delivered_as_one_send(local, remote):
    flat = torch.randn(5 * 2**18)  # 5 MiB in pieces of 1 MiB
    outbox = Outbox(lambda: local, Inbox(), Timeline(None, peer=local.peer_id), chunk_bytes=1 << 20)
    try:
        sent = outbox.send(remote.id, header(run=TRANSPORT_RUN, route=(local.peer_id, remote.id)), flat)
        assert sent.result(timeout=60) is True
    finally:
        outbox.shutdown()
    got = [remote.received() for _ in range(5)]
    assert all(sender == local.peer_id for sender, *_ in got)
    by_chunk = {h.chunk: (h, digest) for _, h, _, digest in got}
    assert sorted(by_chunk) == list(range(5)) and {h.chunks for h, _ in by_chunk.values()} == {5}
    for i, (h, digest) in by_chunk.items():
        piece = flat[i * 2**18:(i + 1) * 2**18]
        assert h.shape == (2**18,)
        assert digest == hashlib.sha256(piece.numpy().tobytes()).hexdigest()


def test_the_inbox_files_a_chunked_message_once_whole():
    inbox = Inbox()
    inbox.adopt(0)
    inbox.iteration = 3
    flat = torch.randn(2048)
    *first, last = pieces_of(flat, 1024)
    for p in first:
        inbox.put(p, "average")
    assert inbox.receive("average", 0.1) == []
    inbox.put(last, "average")
    (whole,) = inbox.receive("average", 1.0)
    assert torch.equal(whole.tensor, flat) and whole.header.chunks == 1


@pytest.mark.parametrize("bad", [0, 1024, MAX_TENSOR_BYTES + 1, 2.5, True, "64M"])
def test_the_runs_piece_size_is_checked_and_travels_in_its_spec(bad):
    cfg = RunConfig.from_tables({"run": {"model": "tiny"}, "swarm": {"chunk_bytes": 1 << 20}})
    again, _ = RunConfig.from_spec(cfg.to_spec(coordinator="c", vocab_size=4096))
    assert again.chunk_bytes == 1 << 20
    default = RunConfig.from_tables({"run": {"model": "tiny"}})
    assert "chunk_bytes" not in default.to_spec(coordinator="c", vocab_size=4096).hyperparameters
    with pytest.raises(ValueError, match="chunk_bytes"):
        RunConfig.from_tables({"run": {"model": "tiny"}, "swarm": {"chunk_bytes": bad}})
    spec = cfg.to_spec(coordinator="c", vocab_size=4096)
    with pytest.raises(ValueError, match="chunk_bytes"):  # a run spec is untrusted too
        RunConfig.from_spec(replace(spec, hyperparameters={**spec.hyperparameters, "chunk_bytes": bad}))
