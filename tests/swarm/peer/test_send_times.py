"""A link's pipeline sends against its estimate: due for a re-measurement once the median of its last sends is
far off the prediction either way, by a ratio and by seconds, and far off the sender's other links' pace; not again
soon after; nothing from one slow send, an unmeasured link, a nonsensical time, or a slowdown all of the sender's
links share."""

from __future__ import annotations

import math

import pytest

from swarm.net.link_probe import LinkEstimate
from swarm.peer.send_times import (
    MAX_RECHECK_SECONDS,
    OFF_RATIO,
    RECENT_SECONDS,
    RECHECK_SECONDS,
    SEND_WINDOW,
    SendTimes,
    moved,
    predicted_seconds,
)

LINK = LinkEstimate(latency_s=0.05, bytes_per_s=10e6)
"""A 50 ms, 10 MB/s link: a 1 MB message is predicted 0.1 + 0.1 = 0.2 s."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_send_is_predicted_as_the_round_trip_and_the_bytes_at_the_goodput():
    assert predicted_seconds(LINK, 1_000_000) == pytest.approx(0.2)


def test_a_link_whose_sends_run_far_slower_is_due_once_its_window_says_so_then_not_again_soon():
    clock = Clock()
    times = SendTimes(clock=clock)
    slow = OFF_RATIO * 0.2 + 0.01
    assert [times.due("p", slow, 1_000_000, LINK) for _ in range(SEND_WINDOW)] == [False] * (SEND_WINDOW - 1) + [True]
    # re-measured: its next sends are not enough before RECHECK_SECONDS, and are again after
    assert not any(times.due("p", slow, 1_000_000, LINK) for _ in range(2 * SEND_WINDOW))
    clock.now += RECHECK_SECONDS
    assert times.due("p", slow, 1_000_000, LINK)
    assert not times.due("q", slow, 1_000_000, LINK)  # each link on its own


def test_a_link_whose_sends_run_far_quicker_than_its_estimate_is_due_too():
    times = SendTimes(clock=Clock())
    recovered = LinkEstimate(latency_s=0.05, bytes_per_s=1e6)  # estimated when slow: 1 MB is 1.1 s
    assert [times.due("p", 0.2, 1_000_000, recovered) for _ in range(SEND_WINDOW)][-1]


def test_one_slow_send_a_small_excess_or_a_mild_slowdown_is_not_enough():
    times = SendTimes(clock=Clock())
    for seconds in (0.2, 0.2, 5.0):  # the median of the window is on time
        assert not times.due("p", seconds, 1_000_000, LINK)
    fast = LinkEstimate(latency_s=0.001, bytes_per_s=1e9)  # 10x off, but by 20 ms: not worth a probe
    assert not any(SendTimes(clock=Clock()).due("p", 0.02, 1000, fast) for _ in range(SEND_WINDOW))
    mild = SendTimes(clock=Clock())  # 2.5x slower: within a loaded host's range
    assert not any(mild.due("p", 0.5, 1_000_000, LINK) for _ in range(SEND_WINDOW))


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -1.0])
def test_an_unmeasured_link_or_a_nonsensical_time_counts_for_nothing(seconds):
    times = SendTimes(clock=Clock())
    assert not any(times.due("p", 9.0, 1_000_000, None) for _ in range(SEND_WINDOW))
    assert not any(times.due("q", seconds, 1_000_000, LINK) for _ in range(SEND_WINDOW))
    assert not any(times.due("r", 9.0, 1_000_000, LinkEstimate(latency_s=0.0, bytes_per_s=math.inf))
                   for _ in range(SEND_WINDOW))


def test_a_link_the_probe_finds_unchanged_waits_twice_as_long_each_time_and_a_changed_one_does_not():
    clock = Clock()
    times = SendTimes(clock=clock)
    slow = OFF_RATIO * 0.2 + 0.01

    def due_after(seconds: float) -> bool:
        clock.now += seconds
        return any(times.due("p", slow, 1_000_000, LINK) for _ in range(SEND_WINDOW))

    assert due_after(0.0)
    waits = []
    for _ in range(5):  # the sender's own load: the probe finds the link as it was, every time
        times.remeasured("p", changed=False)
        waits.append(min(RECHECK_SECONDS * 2 ** (len(waits) + 1), MAX_RECHECK_SECONDS))
        assert not due_after(waits[-1] - 1.0) and due_after(1.0)
    assert waits == [60.0, 120.0, 240.0, 300.0, 300.0]
    times.remeasured("p", changed=True)
    assert due_after(RECHECK_SECONDS)


def test_an_estimate_moved_by_half_again_either_way_in_latency_or_goodput_has_moved():
    assert moved(None, LINK) and not moved(LINK, LINK)
    assert moved(LINK, LinkEstimate(latency_s=0.08, bytes_per_s=10e6))
    assert moved(LINK, LinkEstimate(latency_s=0.05, bytes_per_s=6e6))
    assert not moved(LINK, LinkEstimate(latency_s=0.07, bytes_per_s=7e6))


def test_a_slowdown_every_link_of_the_sender_shares_is_its_own_and_makes_no_link_due():
    times = SendTimes(clock=Clock())
    loaded = 4 * 0.2  # every link 4x its prediction: the sender's host is loaded, not a link
    for peer in ("a", "b"):
        for _ in range(SEND_WINDOW):
            times.due(peer, loaded, 1_000_000, LINK)  # (each due on its own: no other link had sends yet)
    assert not any(times.due("c", loaded, 1_000_000, LINK) for _ in range(SEND_WINDOW))


def test_a_link_slow_against_the_senders_other_links_is_due():
    times = SendTimes(clock=Clock())
    for peer in ("a", "b"):
        assert not any(times.due(peer, 0.2, 1_000_000, LINK) for _ in range(SEND_WINDOW))
    slow = OFF_RATIO * 0.2 + 0.01
    assert [times.due("c", slow, 1_000_000, LINK) for _ in range(SEND_WINDOW)][-1]
    # on a loaded sender (its other links 2x their predictions), the same link must be 3x their pace
    loaded = SendTimes(clock=Clock())
    for peer in ("a", "b"):
        for _ in range(SEND_WINDOW):
            loaded.due(peer, 0.4, 1_000_000, LINK)
    assert not any(loaded.due("c", slow, 1_000_000, LINK) for _ in range(SEND_WINDOW))
    assert [loaded.due("d", 3 * 0.4 + 0.01, 1_000_000, LINK) for _ in range(SEND_WINDOW)][-1]


def test_with_one_other_link_or_stale_ones_the_prediction_alone_decides():
    clock = Clock()
    times = SendTimes(clock=clock)
    loaded = 4 * 0.2
    for _ in range(SEND_WINDOW):
        times.due("a", loaded, 1_000_000, LINK)
    assert [times.due("b", loaded, 1_000_000, LINK) for _ in range(SEND_WINDOW)][-1]  # one other link: not a pace
    stale = SendTimes(clock=clock)
    for peer in ("a", "b"):
        for _ in range(SEND_WINDOW):
            stale.due(peer, loaded, 1_000_000, LINK)
    clock.now += RECENT_SECONDS + 1  # their sends are old: they say nothing of the sender's load now
    assert [stale.due("c", loaded, 1_000_000, LINK) for _ in range(SEND_WINDOW)][-1]


def test_a_claim_for_another_sign_respects_and_restarts_the_recheck_wait():
    clock = Clock()
    times = SendTimes(clock=clock)
    assert times.claim("p") and not times.claim("p")  # claimed: it waits like a link due for its sends
    slow = OFF_RATIO * 0.2 + 0.01
    assert not any(times.due("p", slow, 1_000_000, LINK) for _ in range(SEND_WINDOW))
    clock.now += RECHECK_SECONDS
    assert times.claim("p")
