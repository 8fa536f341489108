"""MonitorServer: the page and its data over real HTTP, and the page as Chromium renders it."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import pytest

from swarm.monitor.web import MonitorServer
from tests.utils.browser import rendered_dom, screenshot

PEERS = [f"Qm{'x' * 36}{i:08d}" for i in range(5)]


def snapshot() -> dict:
    """A view of a 2-stage run with one gone peer, in the shape `swarm_snapshot` returns."""
    peers = [{"peer_id": p, "role": "peer", "stage": i % 2, "placed_stage": i % 2, "state": "online",
              "data_holder": i % 2 == 0, "seconds_per_layer": 0.01, "loss_seconds": 0.0, "memory_slots": 3,
              "addresses": [f"/ip4/10.0.0.{i}/tcp/4000/p2p/{p}"], "reachability": "unknown", "member": True,
              "member_problem": None, "heartbeat_age": 1.0, "stale": i == 4, "gone": i == 4}
             for i, p in enumerate(PEERS)]
    iterations = [{"iteration": i, "epoch": 0, "loss": 7 - 0.1 * i, "tokens_per_s": 1000.0 + i,
                   "iteration_seconds": 0.5, "planned_seconds": 0.4} for i in range(1, 11)]
    iterations[3]["loss"] = math.nan  # a diverged step must not break the page's JSON
    return {"version": 1, "run_id": "web", "coordinator": "QmCoordinator", "taken_at": 1.0e9, "finished": False,
            "run": {"stages": 2}, "peers": peers, "live_peers": 4, "iterations": iterations, "problems": [],
            "links": [{"from": PEERS[0], "to": PEERS[1], "latency_s": 0.01, "bytes_per_s": 2e8}],
            "schedule": {"epoch": 0, "planner": "skippipe", "planned_iteration_s": 0.4, "microbatches": 2,
                         "data_holders": PEERS[0:1], "stage_groups": {"0": PEERS[0::2], "1": PEERS[1::2]},
                         "paths": [{"microbatch": 0, "origin": PEERS[0], "stages": [1], "peers": [PEERS[1]]}]}}


@pytest.fixture()
def server():
    s = MonitorServer(snapshot).start()
    try:
        yield s
    finally:
        s.stop()


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def test_the_page_and_its_data_are_served_read_only(server):
    status, kind, body = get(server.url)
    assert status == 200 and kind.startswith("text/html") and b"snapshot.json" in body
    assert b"http://" not in body.replace(b"http://www.w3.org/2000/svg", b"")  # nothing fetched from elsewhere
    status, kind, body = get(server.url + "snapshot.json")
    data = json.loads(body)  # strict JSON: NaN became null
    assert status == 200 and kind == "application/json" and data["iterations"][3]["loss"] is None
    assert get(server.url + "../etc/passwd")[0] == 404
    assert get(server.url + "metrics")[0] == 404
    request = urllib.request.Request(server.url + "snapshot.json", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 501


def test_chromium_renders_every_peer_and_marks_the_gone_one(server):
    dom = rendered_dom(server.url)
    for p in PEERS:
        assert f'id="peer-{p}"' in dom and f'id="node-{p}"' in dom
    assert f'id="peer-{PEERS[4]}" class="gone"' in dom
    assert "4/5 peers live" in dom and "0 → 1" in dom
    assert screenshot(server.url, "monitor-page").stat().st_size > 10_000
