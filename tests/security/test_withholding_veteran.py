"""A veteran that never sends its stage's state to a joiner (`--fault withhold-state`). A joiner loads a stage
only from a state two of its veterans agree on, so on that stage it hears one voice and waits. It must not wait, or
exit, for ever: after `--state-timeout` it gives the placement up (LEAVING), joins again, and the scheduler places
it on another stage, where it loads the state and trains. Before, the joiner exited (and, placed back, would have
waited on the same veteran again).
"""

from __future__ import annotations

import math
import time

import pytest

from swarm.local.local_swarm import LocalSwarm
from swarm.net.identity import ensure_identity

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PINS = ["0", "0", "1", "1", "2", "2"]
WITHHOLDER = 2  # of stage 1, beside one honest veteran
JOINER = len(PINS)
ITERATIONS = 400  # more than the scenario takes: the swarm is stopped once the joiner trains
COORDINATOR_ARGS = ["--iterations", str(ITERATIONS), "--min-peers", str(len(PINS)), "--stages", "3", "--skip", "0",
                    "--seed", "0", "--microbatches", "2"]
CONFIG = "[swarm]\nheartbeat = 1.0\nrebalance = false\n"  # nobody moves: the joiner's stages are the test's


def test_a_joiner_facing_a_veteran_that_withholds_its_state_is_placed_on_another_stage(tmp_path):
    peer_args = [["--stage", s, "--iteration-deadline", "60"] for s in PINS]
    peer_args[WITHHOLDER] += ["--fault", "withhold-state"]
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    swarm = LocalSwarm(run_dir, len(PINS), run_id="withhold-state",
                       coordinator_args=["--config", str(config), *COORDINATOR_ARGS], peer_args=peer_args)
    who = f"peer-{JOINER:02d}"
    try:
        swarm.start()
        swarm.watch(3, timeout=180)
        swarm.add_peer(JOINER, ["--stage", "1", "--state-timeout", "8", "--iteration-deadline", "60"])
        end = time.monotonic() + 240
        while not swarm.events("stage_loaded", who=who):
            assert time.monotonic() < end, "the joiner never loaded a stage"
            assert swarm.coordinator.poll() is None, "the run ended first"
            time.sleep(1)
        trained = swarm.watch(len(swarm.metrics()) + 3, timeout=120)
    finally:
        swarm.stop()
    joiner = ensure_identity(str(run_dir / f"{who}.key"))
    withholder = ensure_identity(str(run_dir / f"peer-{WITHHOLDER:02d}.key"))
    # placed on the stage it asked for, it heard one voice of two, gave the placement up and stayed in the run
    (abandoned, *_) = swarm.events("join_abandoned", who=who)
    assert abandoned["stage"] == 1 and abandoned["revised"] is False, abandoned
    placed = [e["stage"] for e in swarm.events("joiner_placed", who="coordinator") if e["peer"] == joiner]
    assert placed[0] == 1 and placed[-1] == 2, placed  # then on the other stage, not back on the one it gave up
    (loaded,) = swarm.events("stage_loaded", who=who)
    assert loaded["stage"] == 2 and loaded["source"] == "peer", loaded
    assert swarm.schedule()["placement"][joiner] == 2
    # the withholder is not found out (withholding is indistinguishable from a slow link): it keeps its place, and
    # the run went on throughout
    assert withholder not in {e["peer"] for e in swarm.events("declared_gone", who="coordinator")}
    assert [r["iteration"] for r in trained] == list(range(1, len(trained) + 1))
    assert all(math.isfinite(r["loss"]) for r in trained)
