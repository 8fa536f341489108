"""`return_large_buffers`: once set, large blocks that threads allocate and free go back to the system (glibc would
otherwise keep them in the threads' arenas after the first such block freed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

THREADS_FREE_LARGE_TENSORS = """
import json, threading, psutil, torch
from swarm.net.process_memory import return_large_buffers
took = return_large_buffers()
proc, mib = psutil.Process(), 1 << 20
x = torch.ones(4 * mib); del x  # one large block freed: glibc would raise its mmap threshold to its size
before = proc.memory_info().rss
def messages():  # a sender or consumer thread holding four 16 MiB messages at once, then freeing them
    held = [torch.ones(4 * mib) for _ in range(4)]
    del held
threads = [threading.Thread(target=messages) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"took": took, "kept_mib": (proc.memory_info().rss - before) / mib}))
"""


def test_large_blocks_freed_by_threads_leave_the_process():
    out = subprocess.run([sys.executable, "-c", THREADS_FREE_LARGE_TENSORS], capture_output=True, text=True,
                         timeout=50, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["took"]:
        pytest.skip("this C library has no mallopt")
    assert result["kept_mib"] < 32, f"{result['kept_mib']:.0f} MiB of freed 16 MiB blocks stayed with the process"


FREEZE = """
import gc, json, weakref
from swarm.net.process_memory import freeze_before_fork
class Thing: pass
garbage = Thing(); garbage.me = garbage; dead = weakref.ref(garbage); del garbage  # a cycle nothing reaches
kept = Thing()
before = gc.get_freeze_count()
freeze_before_fork()
print(json.dumps({"garbage_freed": dead() is None, "frozen": gc.get_freeze_count() - before,
                  "kept_frozen": kept not in gc.get_objects()}))
"""


def test_freeze_before_fork_collects_the_garbage_and_leaves_the_rest_out_of_collections():
    out = subprocess.run([sys.executable, "-c", FREEZE], capture_output=True, text=True, timeout=50, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["garbage_freed"] and result["frozen"] > 0 and result["kept_frozen"]
