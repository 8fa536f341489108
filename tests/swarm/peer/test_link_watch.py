"""A peer's link watch over a real transport: it measures the announced peers, says which it could not reach, and
tries those again on its next look for unmeasured links (a peer still starting up is not written off)."""

from __future__ import annotations

import random

import pytest

from swarm.net.link_probe import LinkProber
from swarm.peer.link_watch import LinkWatch
from swarm.wire import PeerRecord

pytestmark = pytest.mark.timeout(120)

NOBODY = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def test_unreached_peers_are_said_and_tried_again_measured_ones_are_not(local, remote, caplog):
    records = {p: PeerRecord(peer_id=p, stage=1, seconds_per_layer=0.01, memory_slots=2) for p in (remote.id, NOBODY)}
    watch = LinkWatch(LinkProber(local, sample_size=4, goodput_bytes=2**16, rng=random.Random(0)), local.peer_id,
                      lambda: records)
    watch.probe()
    assert set(watch.links) == {remote.id} and watch.unreachable == (NOBODY,)
    measured = watch.links[remote.id]
    caplog.clear()
    watch.probe(only_unmeasured=True)
    assert f"probing {NOBODY} failed" in caplog.text  # tried again
    assert watch.links[remote.id] == measured and watch.unreachable == (NOBODY,)  # the measured link was not
