"""Link probing over the real transport between two processes, EWMA smoothing, and the planner's matrices."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.swarm_view import PeerSpec, SwarmView
from swarm.constants import PROBE_PING_TIMEOUT, PROBE_TIMEOUT
from swarm.net.link_probe import UNREACHABLE_PENALTY, LinkEstimate, LinkProber, ewma, link_matrices, unmeasured_links
from swarm.net.transport import TransportError
from swarm.wire import PeerRecord

pytestmark = pytest.mark.timeout(120)


def test_probe_round_measures_loopback_link(local, remote, caplog):
    prober = LinkProber(local, sample_size=2, goodput_bytes=4 * 2**20, rng=random.Random(0))
    links = prober.probe_round([remote.id, local.peer_id, "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"])
    assert set(links) == {remote.id}  # never itself; the unreachable peer is logged and left out
    latency, goodput = links[remote.id]
    assert 0 < latency < 0.1 and goodput > 10e6  # loopback: well under 100 ms, well over 10 MB/s
    assert "probing QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N failed" in caplog.text
    assert prober.unreachable() == ("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N",)  # said in its record
    links2 = prober.probe_round([remote.id])
    assert links2[remote.id] != links[remote.id]  # smoothed with a fresh measurement
    prober.forget(remote.id)
    assert prober.links() == {}


def test_emulated_latency_is_paid_by_probes_and_measured(local, remote):
    """Link emulation: the transport waits the link's one-way latency before a message and after a probe's reply,
    so a prober measures it; a link without an entry is not slowed."""
    prober = LinkProber(local, sample_size=1, goodput_bytes=256 * 1024, rng=random.Random(0))
    local.link_delay = lambda peer: {remote.id: 0.15}.get(peer, 0.0)
    try:
        latency = prober.measure(remote.id).latency_s
    finally:
        local.link_delay = None
    assert 0.15 <= latency < 0.15 + 0.1
    assert prober.measure(remote.id).latency_s < 0.1


class ModelledLink:
    """Stands in for a transport on one link of known latency and bandwidth: probe() takes the time it would."""

    peer_id = "me"

    def __init__(self, latency: float, bandwidth: float):
        self.latency, self.bandwidth, self.sizes = latency, bandwidth, []

    def probe(self, peer_id: str, nbytes: int, *, timeout: float) -> float:
        self.sizes.append(nbytes)
        return 2 * self.latency + nbytes / self.bandwidth


@pytest.mark.parametrize("bandwidth", [0.25e6, 2e6, 100e6])
def test_slow_links_are_measured_on_a_small_probe_fast_ones_on_a_large_one(bandwidth):
    link = ModelledLink(0.005, bandwidth)
    estimate = LinkProber(link, goodput_bytes=4 * 2**20).measure("peer")
    assert estimate.bytes_per_s == pytest.approx(bandwidth, rel=0.01)  # the ping carries a few bytes too
    probes = [n for n in link.sizes if n > 1024]
    assert probes == ([256 * 1024] if bandwidth < 2.1e6 else [256 * 1024, 4 * 2**20])
    assert sum(link.sizes) / bandwidth < 3.0  # no link holds a probe round for long


def test_ewma_smooths():
    est = None
    for lat in (1.0, 0.0, 0.0):
        est = ewma(est, LinkEstimate(latency_s=lat, bytes_per_s=100.0), alpha=0.5)
    assert est.latency_s == pytest.approx(0.25) and est.bytes_per_s == 100.0 and est.samples == 3


def test_link_matrices_feed_swarm_view():
    def rec(pid, links):
        return PeerRecord(peer_id=pid, stage=0, seconds_per_layer=0.01, memory_slots=3, links=links)

    records = {"a": rec("a", {"b": (0.01, 1e8)}), "b": rec("b", {"c": (0.03, 3e8)}), "c": rec("c", {})}
    lat, bw = link_matrices(records, ["a", "b", "c"], default_latency=0.05, default_bandwidth=1e7)
    assert lat[0, 1] == 0.01 and lat[1, 0] == 0.01  # the reverse direction borrows the measured one
    assert lat[0, 2] == pytest.approx(0.02) and bw[2, 0] == pytest.approx(2e8)  # unmeasured: median
    assert np.all(np.diag(lat) == 0)
    view = SwarmView(peers=[PeerSpec(id=p, seconds_per_layer=0.01) for p in "abc"], latency=lat, bandwidth=bw)
    assert len(view) == 3
    lat0, bw0 = link_matrices({}, ["a", "b"], default_latency=0.05, default_bandwidth=1e7)
    assert lat0[0, 1] == 0.05 and bw0[1, 0] == 1e7


def test_a_pair_its_probes_could_not_reach_is_known_and_costed_as_the_worst_link():
    """Two home peers behind different routers cannot probe each other: paths avoid the pair where they can."""
    def rec(pid, links, unreachable=()):
        return PeerRecord(peer_id=pid, stage=0, seconds_per_layer=0.01, memory_slots=3, links=links,
                          unreachable=unreachable)

    records = {"hub": rec("hub", {"a": (0.01, 1e8), "b": (0.03, 3e8)}), "a": rec("a", {}, ("b",)), "b": rec("b", {})}
    assert unmeasured_links(records) == [("a", "b")]  # still waited for a while (a relay may not know them yet)
    lat, bw = link_matrices(records, ["hub", "a", "b"], default_latency=0.05, default_bandwidth=1e7)
    assert lat[1, 2] == lat[2, 1] == pytest.approx(UNREACHABLE_PENALTY * 0.03)
    assert bw[1, 2] == bw[2, 1] == pytest.approx(1e8 / UNREACHABLE_PENALTY)
    assert PeerRecord.from_msgpack(records["a"].to_msgpack()).unreachable == ("b",)  # on the wire


def test_a_link_re_measured_takes_the_new_measurement_whole_where_a_round_blends_it():
    link = ModelledLink(0.005, 100e6)
    prober = LinkProber(link, goodput_bytes=4 * 2**20, alpha=0.3)
    prober.probe_round(["peer"])
    link.latency = 0.5  # the link slowed
    prober.probe_round(["peer"])
    blended = prober.estimate("peer").latency_s
    assert 0.1 < blended < 0.2  # 0.7 x 5 ms + 0.3 x 500 ms: a round follows a step over several rounds
    assert prober.remeasure("peer").latency_s == pytest.approx(0.5, rel=1e-3) == prober.links()["peer"][0]
    assert prober.estimate("other") is None


class FrozenPeers(ModelledLink):
    """A link model where some peers are frozen: a probe to one waits out its whole timeout, then times out."""

    def __init__(self, frozen: set[str]):
        super().__init__(0.005, 100e6)
        self.frozen, self.waited = frozen, 0.0

    def probe(self, peer_id: str, nbytes: int, *, timeout: float) -> float:
        if peer_id in self.frozen:
            self.waited += timeout
            raise TransportError(f"timed out after {timeout:.1f}s")  # as the transport says it
        return super().probe(peer_id, nbytes, timeout=timeout)


def test_a_round_asked_for_enough_links_ends_once_it_has_them_and_a_frozen_peer_costs_one_ping_timeout():
    """A joiner's first round: it stops at 3 measured links (the rest come in later rounds); a frozen peer in the way
    holds it for one ping's timeout, not a goodput probe's."""
    link = FrozenPeers({"f1"})
    prober = LinkProber(link, sample_size=8, goodput_bytes=4 * 2**20, rng=random.Random(0))
    with pytest.raises(TransportError):
        prober.measure("f1")
    assert link.waited == PROBE_PING_TIMEOUT < PROBE_TIMEOUT
    peers = ["f1", "a", "b", "c", "d", "e"]
    links = prober.probe_round(peers, enough=3)
    assert len(links) == 3 and "f1" not in links
    links = prober.probe_round(peers)  # the next round: the peers never probed first
    assert set(links) == {"a", "b", "c", "d", "e"}
