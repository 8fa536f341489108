"""A joiner reads the run spec and refuses, in one line, a run it cannot serve: a relayed peer in a run that
averages with hivemind's averager (its RPCs do not cross the relay)."""

from __future__ import annotations

import pytest

from swarm.local.local_swarm import LocalSwarm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_a_relayed_peer_refuses_a_run_averaging_with_hivemind(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[run]\nrun_id = 'hm'\nstages = 2\nskip = 0.0\nmin_peers = 2\n[swarm]\naveraging = 'hivemind'\n")
    swarm = LocalSwarm(tmp_path / "run", 1, run_id="hm", coordinator_args=["--config", str(config)],
                       peer_args=[["--reachability", "relayed"]])
    try:
        swarm.start()
        code = swarm.peers[0].wait(timeout=120)
    finally:
        swarm.stop()
    out = (tmp_path / "run" / "peer-00.out").read_text()
    assert code == 2 and "cannot join run hm" in out and "the relay does not carry" in out, out[-2000:]
    assert "Traceback" not in out
