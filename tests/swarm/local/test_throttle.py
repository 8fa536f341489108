"""A throttled process runs only its share of the time, and runs on once the throttle is closed."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from swarm.local.throttle import Throttle

pytestmark = pytest.mark.timeout(60)

SPIN = "import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.01: pass\n"


def cpu_seconds(proc: psutil.Process, seconds: float) -> float:
    before = sum(proc.cpu_times()[:2])
    time.sleep(seconds)
    return sum(proc.cpu_times()[:2]) - before


def stopped_share(proc: psutil.Process, seconds: float) -> float:
    """The share of `seconds` that `proc` was seen stopped (sampled every 10 ms): unlike its CPU time, not lowered
    by other processes competing for the cores."""
    samples, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(proc.status() == psutil.STATUS_STOPPED)
        time.sleep(0.01)
    return sum(samples) / len(samples)


def test_a_throttled_process_runs_its_share_of_the_time_then_runs_on():
    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        proc = psutil.Process(child.pid)
        assert stopped_share(proc, 0.5) == 0
        with Throttle(child.pid, running=0.1, stopped=0.3) as throttle:
            assert throttle.share == pytest.approx(0.25)
            stopped = stopped_share(proc, 2.0)
            slowed = cpu_seconds(proc, 2.0)
        assert 0.5 < stopped < 0.95, stopped  # stopped 0.3 s of every 0.4 s
        assert slowed < 0.75, slowed  # at most its quarter of 2 s (0.5), whatever else runs
        assert stopped_share(proc, 1.0) == 0  # the throttle let it go
        assert cpu_seconds(proc, 1.0) > 0  # and it runs on
    finally:
        child.kill()
        child.wait(timeout=10)


@pytest.mark.parametrize(("running", "stopped"), [(0, 1), (1, 0), (-1, 1), (float("nan"), 1)])
def test_a_duty_cycle_that_is_not_two_positive_durations_is_refused(running, stopped):
    with pytest.raises(ValueError, match="must be > 0"):
        Throttle(1, running=running, stopped=stopped)
