"""A peer's link watch over a real transport: it measures the announced peers, says which it could not reach, and
tries those again now and then (a peer still starting up is not written off); a newly announced peer is measured
within a second or two, and the peer told so that it can publish its record at once; a link whose sends run far off
its estimate, or whose peer did not answer a probe mid-hop and is not declared gone, is re-measured."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from swarm.events import EVENT_ATTR
from swarm.net.link_probe import LinkProber
from swarm.peer import link_watch
from swarm.peer.link_watch import FIRST_LINKS, LINK_PROBE_PERIOD, LinkWatch
from swarm.peer.mailbox import Inbox, Outbox
from swarm.peer.send_times import SEND_WINDOW
from swarm.peer.timeline import Timeline
from swarm.wire import PeerRecord
from tests.swarm.net.test_link_probe import ModelledLink
from tests.swarm.net.test_transport import header

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


def test_a_link_that_slows_under_the_pipelines_sends_is_re_measured_and_published(local, remote, caplog):
    """The link to remote is measured on loopback; then it slows (the transport waits 0.4 s before each message and
    probe reply: an emulated link's latency). The outbox's pipeline sends over it tell the watch, which re-measures
    it at its next look (not at the five-minute refresh), takes the new measurement whole and publishes it; sends on
    time do not."""
    records = {remote.id: PeerRecord(peer_id=remote.id, stage=1, seconds_per_layer=0.01, memory_slots=2)}
    published = threading.Event()
    watch = LinkWatch(LinkProber(local, sample_size=4, goodput_bytes=2**16, rng=random.Random(0)), local.peer_id,
                      lambda: records, measured=published.set)
    watch.probe()
    before = watch.links[remote.id]
    outbox = Outbox(lambda: local, Inbox(), Timeline(None, peer=local.peer_id), sent=watch.sent)

    def send_three() -> None:
        for i in range(SEND_WINDOW):
            assert outbox.send(remote.id, header(local, remote, microbatch=i), torch.zeros(64)).result(timeout=30)
            remote.received()

    try:
        send_three()
        assert not watch.remeasure_due()  # on time: nothing due
        local.link_delay = lambda peer: 0.4 if peer == remote.id else 0.0
        send_three()
        stop, finished = threading.Event(), threading.Event()
        with caplog.at_level("INFO"):
            watch.start(stop, finished)
            try:
                assert published.wait(timeout=30)
            finally:
                stop.set()
    finally:
        local.link_delay = None
        outbox.shutdown()
    latency, _ = watch.links[remote.id]
    assert before[0] < 0.1 and 0.4 <= latency < 0.6  # the new measurement whole, not a fraction of it by the EWMA
    (remeasured,) = [getattr(r, EVENT_ATTR) for r in caplog.records if getattr(r, EVENT_ATTR, {}).get("event")
                     == "link_remeasured"]
    assert remeasured["peer"] == remote.id and remeasured["now"][0] == latency


def test_a_peer_silent_to_a_probe_mid_hop_has_its_link_re_measured_unless_declared_gone(local, remote, monkeypatch):
    """A congested link: a byte waits behind what is queued on it, the probe mid-hop times out, the pipeline detours
    around the peer and its sends no longer measure the link. Suspected, it is re-measured once the suspicion is
    `SUSPECT_DELAY` old, and not again within the recheck wait; a suspect the scheduler declared gone meanwhile is
    not probed at all (it would wait out a timeout)."""
    monkeypatch.setattr(link_watch, "SUSPECT_DELAY", 0.3)
    records = {remote.id: PeerRecord(peer_id=remote.id, stage=1, seconds_per_layer=0.01, memory_slots=2)}
    gone: set[str] = set()
    watch = LinkWatch(LinkProber(local, sample_size=4, goodput_bytes=2**16, rng=random.Random(0)), local.peer_id,
                      lambda: records, gone=lambda: gone)
    watch.probe()
    before = watch.links[remote.id]
    local.link_delay = lambda peer: 0.4 if peer == remote.id else 0.0
    try:
        watch.suspect(remote.id)
        assert not watch.remeasure_due()  # not yet: a dead peer would be declared gone first
        time.sleep(0.4)
        assert watch.remeasure_due()
        assert before[0] < 0.1 and 0.4 <= watch.links[remote.id][0] < 0.6
        watch.suspect(remote.id)
        time.sleep(0.4)
        assert not watch.remeasure_due()  # re-measured a moment ago
    finally:
        local.link_delay = None
    fresh = LinkWatch(LinkProber(local, sample_size=4, goodput_bytes=2**16, rng=random.Random(0)), local.peer_id,
                      lambda: records, gone=lambda: gone)
    fresh.probe()
    measured = fresh.links[remote.id]
    fresh.suspect(remote.id)
    gone.add(remote.id)
    time.sleep(0.4)
    assert not fresh.remeasure_due() and fresh.links[remote.id] == measured


def test_a_joiner_publishes_its_first_few_links_then_measures_the_rest_a_look_later():
    """A joiner's first round stops at FIRST_LINKS measured links and publishes them (the scheduler places it once
    its record shows links); the background thread measures the rest of the announced peers at its first look."""
    others = [f"peer-{i}" for i in range(6)]
    records = {p: PeerRecord(peer_id=p, stage=1, seconds_per_layer=0.01, memory_slots=2) for p in others}
    published: list[int] = []
    watch = LinkWatch(LinkProber(ModelledLink(0.005, 100e6), goodput_bytes=2**16, rng=random.Random(0)), "me",
                      lambda: records, measured=lambda: published.append(len(watch.links)))
    stop, finished = threading.Event(), threading.Event()
    try:
        watch.start(stop, finished)
        assert len(watch.links) == FIRST_LINKS < len(others) and published == [FIRST_LINKS]
        deadline = time.monotonic() + 10
        while len(watch.links) < len(others) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
    assert set(watch.links) == set(others) and published[-1] == len(others)
