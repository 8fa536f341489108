"""A link that slows mid-run: the paths are re-planned around it within a few iterations.

A local swarm of 6 peers (3 stages, compute emulated at 0.05 s a layer), each given a link emulation file
(`--emulate-latency`: the transport waits each link's one-way latency before a message and before its answer). After
iteration 3 the link that the paths cross most often, between a data holder and a relay, slows to 1 s one way, both
ways (the file is rewritten: a congested route, a volunteer's upload taken by another job). Its probes would not
measure it again for minutes; the pipeline's own sends over it run far off its estimate, so the peers at its ends
re-measure it at once and publish it (`link_remeasured`). The coordinator weighs the drift at the next commit
(`costs_drifted`) and re-plans the paths on the same placement, crossing that link less. Nobody is taken for gone,
and every sample is processed once.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from scheduler.schedule import Schedule
from swarm.coordinator.link_drift import busiest_link, crossings
from swarm.local.local_swarm import LocalSwarm
from swarm.local.namespaces import write_latency_file
from swarm.net.identity import ensure_identity
from tests.swarm.test_late_holder import PEERS, processed_once, run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ITERATIONS = 16
"""The run's length; the swarm is stopped two iterations into the re-planned paths."""
SLOWED_AFTER = 3
SLOW_LATENCY = 1.0
"""One-way seconds of the slowed link: each message over it takes two of them (the message, then its answer), against
an iteration of ~1 s on time."""


def test_a_link_that_slows_mid_run_is_re_measured_from_the_pipelines_sends_and_planned_around(tmp_path):
    config, args = run_config(tmp_path, "slowlink", ITERATIONS)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ids = [ensure_identity(str(run_dir / f"peer-{i:02d}.key")) for i in range(PEERS)]
    latency = np.zeros((PEERS, PEERS))
    files = [tmp_path / f"latency-{i:02d}.json" for i in range(PEERS)]
    for i, f in enumerate(files):
        write_latency_file(latency, i, ids, f)
        args[i] += ["--emulate-latency", str(f)]
    swarm = LocalSwarm(run_dir, PEERS, run_id="slowlink", coordinator_args=["--config", config], peer_args=args)
    try:
        swarm.start()
        swarm.watch(SLOWED_AFTER, timeout=240)
        first = swarm.schedule()
        pair = busiest_link(Schedule.from_dict(first))
        a, b = ids.index(pair[0]), ids.index(pair[1])
        latency[a, b] = latency[b, a] = SLOW_LATENCY
        for i in (a, b):
            write_latency_file(latency, i, ids, files[i])
        slowed_at = time.time()
        links = {f"{pair[0]}->{pair[1]}", f"{pair[1]}->{pair[0]}"}

        def ran_around_it(records: list[dict]) -> bool:  # the re-planned paths ran two iterations: enough seen
            starts = [e["start_iteration"] for e in swarm.events("costs_drifted", who="coordinator")
                      if e["replanned"] and links & set(e["links"])]
            return bool(starts) and records[-1]["iteration"] >= starts[0] + 2

        records = swarm.watch(ITERATIONS, timeout=360, until=ran_around_it)
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records] == list(range(1, len(records) + 1))
    # the ends of the link measured it again from the pipeline's sends, well before the periodic refresh (300 s)
    remeasured = [e for i in (ids.index(pair[0]), ids.index(pair[1]))
                  for e in swarm.events("link_remeasured", who=f"peer-{i:02d}") if e["peer"] in pair]
    assert remeasured and all(e["now"][0] >= SLOW_LATENCY for e in remeasured), remeasured
    assert min(e["time"] for e in remeasured) - slowed_at < 60
    # the coordinator weighed the drift and re-planned the paths around the link, on the same placement
    (drift, *_) = [e for e in swarm.events("costs_drifted", who="coordinator") if links & set(e["links"])]
    assert drift["replanned"] is True and drift["time"] - slowed_at < 90, drift
    epochs = swarm.schedules()
    (replanned,) = [e for e in epochs if e["meta"]["start_iteration"] == drift["start_iteration"]]
    assert replanned["placement"] == first["placement"]
    before, after = (crossings(Schedule.from_dict(e))[pair] for e in (first, replanned))
    assert after < before, (pair, replanned["routes"])
    assert not swarm.events("declared_gone", who="coordinator"), "a live peer was taken for gone"
    processed = processed_once(run_dir, records)
    assert processed and set(processed) == {1}, f"samples processed {dict(processed)} times"
