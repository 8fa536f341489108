"""`LocalSwarm.watch` on a run directory's metrics alone (no process started): it returns at the iteration count, or
sooner once `until` holds of the records after a new one came."""

from __future__ import annotations

import json
import threading
import time

from swarm.local.local_swarm import LocalSwarm


def write_records(path, iterations: range, every: float = 0.0) -> None:
    for i in iterations:
        with open(path, "a") as f:
            f.write(json.dumps({"iteration": i, "epoch": 0, "loss": 1.0, "time": time.time()}) + "\n")
        time.sleep(every)


def test_watch_returns_once_until_holds_or_at_the_iteration_count(tmp_path):
    swarm = LocalSwarm(tmp_path, 0, run_id="watch")
    write_records(swarm.metrics_path, range(1, 4))
    writer = threading.Thread(target=write_records, args=(swarm.metrics_path, range(4, 11), 0.3))
    writer.start()
    try:
        seen: list[int] = []
        got = swarm.watch(10, timeout=30, on_record=lambda r: seen.append(r["iteration"]),
                          until=lambda records: records[-1]["iteration"] >= 5)
        assert 5 <= len(got) < 10 and [r["iteration"] for r in got] == list(range(1, len(got) + 1))
        assert seen == [r["iteration"] for r in got]
        # without `until`, or one that never holds: the iteration count
        assert len(swarm.watch(10, timeout=30, until=lambda records: False)) == 10
    finally:
        writer.join()
