"""stop_event: the first SIGTERM sets the command's event; a child forked afterwards dies on SIGTERM all the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[3]

# Run in a process of its own: the handler stays installed in whatever process calls stop_event.
SCRIPT = """
import json, multiprocessing as mp, os, signal, time
from swarm.cli.stop_signal import stop_event

def report(queue):
    queue.put([signal.getsignal(signal.SIGINT) is signal.default_int_handler,
               signal.getsignal(signal.SIGTERM) == signal.SIG_DFL])
    time.sleep(60)

stop = stop_event()
ctx = mp.get_context("fork")  # how hivemind starts its DHT and averager
queue = ctx.Queue()
child = ctx.Process(target=report, args=(queue,))
child.start()
defaults = queue.get(timeout=20)
child.terminate()
child.join(10)
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 5
while not stop.is_set() and time.monotonic() < deadline:
    time.sleep(0.05)
alive = child.is_alive()
if alive:
    child.kill()
print(json.dumps({"defaults": defaults, "child_alive": alive, "exitcode": child.exitcode, "stop": stop.is_set()}))
"""


def test_sigterm_sets_the_event_and_a_forked_child_still_dies_on_it():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=45)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["defaults"] == [True, True]  # the child got Python's handlers back
    assert not result["child_alive"] and result["exitcode"] == -15
    assert result["stop"]  # the command itself only set its event
