"""`AliveBeat`: the scheduler beats while its loop is busy in a long step, stops once the loop has stalled past its
limit (and beats again when the loop comes round), and says nothing while there is nothing to say."""

from __future__ import annotations

import threading
import time

import pytest

from swarm.control.messages import Alive
from swarm.coordinator.alive_beat import AliveBeat


def test_it_beats_while_the_loop_is_busy_and_stops_once_the_loop_stalls_past_the_limit():
    sent: list[Alive] = []
    beat = AliveBeat(0.05, lambda: Alive(epoch=2, iteration=7), sent.append, stalled_after=1.0).start()
    try:
        beat.turned()
        time.sleep(0.5)  # the loop is busy in one step (a plan): no turn, beats all the same
        assert len(sent) >= 3 and sent[-1] == Alive(epoch=2, iteration=7)
        time.sleep(1.0)  # the loop has not come round for 1.5 s: stalled
        stalled = len(sent)
        time.sleep(0.4)
        assert len(sent) == stalled
        beat.turned()  # it came round after all
        time.sleep(0.2)
        assert len(sent) > stalled
    finally:
        beat.stop()
    stopped = len(sent)
    time.sleep(0.2)
    assert len(sent) <= stopped + 1  # a beat under way as it stopped, at most


def test_nothing_is_sent_while_there_is_nothing_to_say_and_a_failed_send_does_not_end_the_beat():
    asked, sent = threading.Event(), []

    def say() -> Alive | None:
        asked.set()
        return None

    quiet = AliveBeat(0.02, say, sent.append).start()
    try:
        assert asked.wait(2.0)
        time.sleep(0.1)
        assert sent == []
    finally:
        quiet.stop()
    tries: list[int] = []

    def flaky(message: Alive) -> None:
        tries.append(1)
        raise ConnectionError("the sidecar is gone")

    failing = AliveBeat(0.02, lambda: Alive(epoch=0, iteration=0), flaky).start()
    try:
        time.sleep(0.2)
        assert len(tries) >= 3  # it keeps trying
    finally:
        failing.stop()


def test_a_period_or_a_limit_not_above_zero_is_refused():
    with pytest.raises(ValueError):
        AliveBeat(0.0, lambda: None, lambda m: None)
    with pytest.raises(ValueError):
        AliveBeat(1.0, lambda: None, lambda m: None, stalled_after=0.0)
