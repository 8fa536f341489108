"""`AwayWatch`: a process stopped whole (SIGSTOP) was away; one busy in its own loop, or sleeping in it, was not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from swarm.coordinator.away_watch import AwayWatch

CHILD = """
import sys, time
from swarm.coordinator.away_watch import AwayWatch
watch = AwayWatch(1.0, period=0.1).start()
print("ready", flush=True)
for line in sys.stdin:
    print(round(watch.take(), 1), flush=True)
"""


def test_a_process_stopped_whole_was_away_for_as_long():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             cwd=os.getcwd())
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.5)

        def ask() -> float:
            child.stdin.write("?\n")
            child.stdin.flush()
            return float(child.stdout.readline())

        assert ask() == 0.0
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(2.5)
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.3)
        assert 2.0 <= ask() <= 5.0
        assert ask() == 0.0  # taken once
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_loop_busy_or_asleep_in_a_slow_step_is_not_away():
    watch = AwayWatch(1.0, period=0.1).start()
    try:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:  # a plan: pure Python, holding the interpreter between switches
            sum(range(1000))
        time.sleep(1.5)  # a DHT store that times out
        assert watch.take() == 0.0
    finally:
        watch.stop()


def test_a_caller_that_runs_before_the_watchs_thread_looks_learns_of_the_absence():
    # thawed, the loop may take a message before the watch's thread has looked at the clock: a `take` looks too (the
    # thread is kept from running here by a switch interval longer than the absence)
    watch = AwayWatch(1.0, period=0.1).start()
    interval = sys.getswitchinterval()
    try:
        time.sleep(0.3)
        sys.setswitchinterval(30.0)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            sum(range(1000))
        gap = watch.take()
        sys.setswitchinterval(interval)
        assert 1.4 <= gap <= 3.0
        assert watch.take() == 0.0  # taken once: by the caller, not again by the thread
        time.sleep(0.3)
        assert watch.take() == 0.0
    finally:
        sys.setswitchinterval(interval)
        watch.stop()


def test_a_limit_not_above_the_period_is_refused():
    with pytest.raises(ValueError, match="must exceed"):
        AwayWatch(0.5, period=0.5)
