"""MessageJitter: deviations from each link's median, whatever the link's own time or the clocks' offset."""

import numpy as np
import pytest

from swarm.net.message_jitter import MIN_LINK_SAMPLES, MessageJitter


def test_deviations_are_taken_against_each_links_median():
    rng = np.random.default_rng(0)
    noise = rng.normal(0.0, 0.01, 200)
    near, far = MessageJitter(), MessageJitter()
    for d in noise:
        near.observe("a/FORWARD", 0.005 + d)
        # another link: slow, and the sender's clock 40 s ahead: only the deviation is left
        far.observe("b/FORWARD", -40.0 + 0.3 + d)
    assert near.quantiles() == pytest.approx(far.quantiles(), abs=1e-5)
    q = np.array(near.quantiles())
    assert len(q) == 16 and np.all(np.diff(q) >= 0)
    assert abs(q[7] + q[8]) / 2 < 0.005 and q[-1] > 0.01 and q[0] < -0.01


def test_nothing_is_published_until_links_have_a_median():
    jitter = MessageJitter()
    for _ in range(MIN_LINK_SAMPLES - 1):
        for link in range(20):
            jitter.observe(f"p{link}/FORWARD", 0.1)
    assert len(jitter) == 0 and jitter.quantiles() == ()
    jitter.observe("probe", [0.01, 0.02, 0.01, 0.015, 0.01] * 4)  # a batch of pings counts at once
    assert len(jitter) == 20 and len(jitter.quantiles()) == 16


def test_broken_measurements_are_not_jitter():
    jitter = MessageJitter()
    jitter.observe("a", [0.01] * 20 + [float("nan"), float("inf"), 500.0])
    assert len(jitter) == 20 and set(jitter.quantiles()) == {0.0}
