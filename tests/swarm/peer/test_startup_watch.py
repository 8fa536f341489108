"""The start-up watch: a peer process not up in time writes its threads' stacks to stderr; one that is up writes
nothing."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def run(code: str) -> str:
    script = f"import time\nfrom swarm.peer.startup_watch import started, watch_startup\nwatch_startup(0.5)\n{code}"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30).stderr


def test_a_process_stuck_before_it_is_up_dumps_its_stacks():
    err = run("def stuck_starting():\n    time.sleep(2)\nstuck_starting()")
    assert "most recent call first" in err and "stuck_starting" in err


def test_a_process_up_in_time_dumps_nothing():
    assert run("started()\ntime.sleep(1.5)") == ""


def test_a_stderr_without_a_descriptor_means_no_watch(monkeypatch):
    import io

    from swarm.peer.startup_watch import started, watch_startup

    monkeypatch.setattr("sys.stderr", io.StringIO())
    watch_startup(0.1)  # no error, nothing armed
    started()
