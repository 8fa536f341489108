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


def test_a_throttled_process_runs_its_share_of_the_time_then_runs_on():
    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        proc = psutil.Process(child.pid)
        free = cpu_seconds(proc, 2.0)
        with Throttle(child.pid, running=0.1, stopped=0.3) as throttle:
            assert throttle.share == pytest.approx(0.25)
            slowed = cpu_seconds(proc, 2.0)
        assert proc.status() != psutil.STATUS_STOPPED
        after = cpu_seconds(proc, 2.0)
        assert slowed < 0.5 * free and after > 0.7 * free, (free, slowed, after)
    finally:
        child.kill()
        child.wait(timeout=10)


@pytest.mark.parametrize(("running", "stopped"), [(0, 1), (1, 0), (-1, 1), (float("nan"), 1)])
def test_a_duty_cycle_that_is_not_two_positive_durations_is_refused(running, stopped):
    with pytest.raises(ValueError, match="must be > 0"):
        Throttle(1, running=running, stopped=stopped)
