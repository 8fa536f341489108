"""End to end: `skippipe monitor` watching a real local swarm, as JSON and as a page in Chromium, through a death.

One swarm (a coordinator and 3 peers), one live monitor serving its page, and `--once --json` snapshots: every peer
is listed with the stage the schedule gives it and the current epoch, the page shows every peer, and when a peer is
killed the monitor keeps answering and marks it stale while the others stay live.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

import pytest

from swarm.local.local_swarm import LocalSwarm
from swarm.net.identity import ensure_identity
from tests.utils.browser import rendered_dom, screenshot
from tests.utils.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RUN = "watched"
PEERS = 3




def monitor_cmd(swarm: LocalSwarm, *args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from swarm.cli.main import main; sys.exit(main())", "monitor",
            "--initial-peers", swarm.initial_peers[0], "--run", RUN, *args]


def snapshot_once(swarm: LocalSwarm) -> dict:
    done = subprocess.run(monitor_cmd(swarm, "--once", "--json", "--listen", "3"), capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def fetch(url: str) -> dict:
    with urllib.request.urlopen(url + "snapshot.json", timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture()
def swarm(tmp_path):
    s = LocalSwarm(tmp_path, PEERS, run_id=RUN, coordinator_args=["--iterations", "500", "--min-peers", str(PEERS),
                                                                   "--stages", "2", "--skip", "0", "--seed", "0"])
    try:
        s.start()
        yield s
    finally:
        s.stop()


def test_monitor_lists_every_peer_renders_the_page_and_marks_a_dead_peer_stale(swarm, tmp_path):
    wait_for(lambda: len(swarm.metrics()) >= 2, 180, "the swarm did not train")
    ids = {ensure_identity(str(tmp_path / f"peer-{i:02d}.key")): i for i in range(PEERS)}
    page = subprocess.Popen(monitor_cmd(swarm, "--http", "0", "--interval", "1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "monitor page:" not in line:
            line = page.stderr.readline()
            assert line or page.poll() is None, "the monitor exited before serving its page"
        url = line.split("monitor page:", 1)[1].strip()

        snap = snapshot_once(swarm)
        schedule = swarm.schedule()
        rows = {p["peer_id"]: p for p in snap["peers"] if p["role"] == "peer"}
        assert set(rows) == set(ids) and snap["schedule"]["epoch"] == schedule["epoch"]
        assert all(rows[p]["stage"] == schedule["placement"][p] and rows[p]["member"] for p in ids)
        assert snap["iterations"], "no iteration heard in 3 s of gossip"
        assert all(it["planned_seconds"] == round(schedule["predicted_iteration_seconds"], 4)
                   for it in snap["iterations"] if it["epoch"] == schedule["epoch"])

        dom = rendered_dom(url)
        assert all(f'id="peer-{p}"' in dom for p in ids)
        screenshot(url, "monitor-local-swarm")

        victim = next(p for p, i in ids.items() if schedule["placement"][p] != 0 or i == PEERS - 1)
        swarm.kill(swarm.peers[ids[victim]])
        dead = wait_for(lambda: (s := fetch(url)) and next(p for p in s["peers"] if p["peer_id"] == victim)["stale"]
                        and s, 30, "the dead peer was not marked stale")
        assert all(not p["stale"] for p in dead["peers"] if p["peer_id"] in ids and p["peer_id"] != victim)
        gone = wait_for(lambda: (s := fetch(url)) and next(p for p in s["peers"] if p["peer_id"] == victim)["gone"]
                        and s, 30, "the dead peer's expired record did not mark it gone")
        assert gone["live_peers"] == PEERS - 1  # listed as gone, not dropped, and the others still live
    finally:
        page.send_signal(signal.SIGINT)
        try:
            page.wait(timeout=30)
        except subprocess.TimeoutExpired:
            page.kill()
            raise
    assert page.returncode == 0
