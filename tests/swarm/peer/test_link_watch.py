"""A peer's link watch over a real transport: it measures the announced peers, says which it could not reach, and
tries those again now and then (a peer still starting up is not written off); a newly announced peer is measured
within a second or two, and the peer told so that it can publish its record at once."""

from __future__ import annotations

import random
import threading
import time

import pytest

from swarm.net.link_probe import LinkProber
from swarm.peer.link_watch import LINK_PROBE_PERIOD, LinkWatch
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
    assert not watch.probe(only_unmeasured=True, retry_unreached=False)  # a look for joiners only: nothing new
    assert "probing" not in caplog.text
    assert not watch.probe(only_unmeasured=True)
    assert f"probing {NOBODY} failed" in caplog.text  # tried again
    assert watch.links[remote.id] == measured and watch.unreachable == (NOBODY,)  # the measured link was not


def test_a_newly_announced_peer_is_measured_within_a_look_and_the_peer_told(local, remote):
    records: dict[str, PeerRecord] = {}
    measured = threading.Event()
    watch = LinkWatch(LinkProber(local, sample_size=4, goodput_bytes=2**16, rng=random.Random(0)), local.peer_id,
                      lambda: dict(records), measured=measured.set)
    stop, finished = threading.Event(), threading.Event()
    watch.start(stop, finished)
    try:
        time.sleep(1.5)  # a look or so with nobody to probe
        assert not measured.is_set()
        records[remote.id] = PeerRecord(peer_id=remote.id, stage=1, seconds_per_layer=0.01, memory_slots=2)
        announced = time.monotonic()
        assert measured.wait(timeout=30)
        took = time.monotonic() - announced
    finally:
        stop.set()
    assert remote.id in watch.links
    assert took < LINK_PROBE_PERIOD - 1, took  # not left for the slower retry cadence
