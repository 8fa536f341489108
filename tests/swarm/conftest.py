"""Swarm tests start real processes: fail any test (or module) that leaves a process or a hivemind socket behind.

Leaks are stopped by pid after being reported, so one leaky test does not poison the next. Nothing here imports
hivemind at import time: gossip tests may use py-libp2p, which cannot share a process with hivemind.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `tests.utils`, also in spawned children

from tests.utils.processes import (  # noqa: E402
    become_subreaper,
    descendants,
    describe,
    hivemind_sockets,
    join_or_stop,
    spawn,
    stop_pids,
    unbound_hivemind_sockets,
)

become_subreaper()


SOCKET_GRACE = 15.0
"""How long a hivemind socket may stay unbound before it counts as left behind. The sockets are files in /tmp,
shared by the two test workers: a peer SIGKILLed by a test of the other worker leaves its p2p client's socket
unbound until its reaper has stopped its helpers (two grace periods of 2 s) and unlinks it. Within the 5 s the
processes get, the SWARM-planner test (its assertions passed) once failed on a socket none of its own processes is
known to have left, in a run whose other worker had the kill tests (churn, reaper) to run."""


def _check_leaks(before: set[int], sockets_before: set[str], what: str, grace: float = 5.0) -> None:
    deadline = time.monotonic() + grace
    while (leaked := descendants() - before) and time.monotonic() < deadline:
        time.sleep(0.1)  # p2pd and hivemind helpers exit a moment after their owner's shutdown
    stale = set()
    deadline = time.monotonic() + SOCKET_GRACE  # only waited for when a socket is unbound
    while (stale := unbound_hivemind_sockets(hivemind_sockets() - sockets_before)) and time.monotonic() < deadline:
        time.sleep(0.2)
    problems = []
    if leaked:
        problems.append(f"left processes behind: {describe(leaked)}")
        stop_pids(leaked)
    if stale:
        for path in stale:
            Path(path).unlink(missing_ok=True)
        problems.append(f"left hivemind sockets behind: {sorted(stale)}")
    if problems:
        pytest.fail(f"{what} " + "; ".join(problems), pytrace=False)


@pytest.fixture(autouse=True, scope="module")
def _no_leaks_per_module():
    before, sockets = descendants(), hivemind_sockets()
    yield
    _check_leaks(before, sockets, "module")


@pytest.fixture(autouse=True)
def _no_leaks_per_test():
    before, sockets = descendants(), hivemind_sockets()
    yield
    _check_leaks(before, sockets, "test")


# ---- a pair of peers with transports: this process ('local') and a spawned one ('remote') -----------------------
@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """This process: a DHT and a Transport (it sends; what it receives goes to a queue)."""
    import hivemind

    from swarm.net.dht_shutdown import stop_dht
    from swarm.net.identity import ensure_identity
    from swarm.net.transport import Transport

    key = str(tmp_path_factory.mktemp("local") / "identity.key")
    ensure_identity(key)
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key, start=True)
    inbox: queue.Queue = queue.Queue()
    transport = Transport(dht, lambda *msg: inbox.put(msg))
    transport.dht, transport.inbox = dht, inbox
    try:
        yield transport
    finally:
        transport.shutdown()
        stop_dht(dht)


@pytest.fixture(scope="module")
def remote(local, tmp_path_factory):
    """Another process with its own DHT and Transport (inbound queue of 1, so backpressure shows at once)."""
    from swarm.net.identity import ensure_identity
    from tests.utils.swarm_workers import TRANSPORT_RUN, transport_peer

    ctx = mp.get_context("spawn")
    cmd_q, res_q, recv_q, log_q = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    key = str(tmp_path_factory.mktemp("remote") / "identity.key")
    maddrs = [str(m) for m in local.dht.get_visible_maddrs()]
    proc = spawn(transport_peer, key, maddrs, {"queue_size": 1, "run_id": TRANSPORT_RUN}, cmd_q, res_q, recv_q,
                 log_q)
    try:
        tag, (_, peer_id) = res_q.get(timeout=60)
        assert tag == "ready" and peer_id == ensure_identity(key)

        class Remote:
            id = peer_id

            @staticmethod
            def call(*cmd):
                cmd_q.put(cmd)
                return res_q.get(timeout=30)[1]

            @staticmethod
            def received(timeout=30):
                return recv_q.get(timeout=timeout)

            @staticmethod
            def logs():
                out = []
                while True:
                    try:
                        out.append(log_q.get(timeout=0.5))
                    except queue.Empty:
                        return out

        yield Remote
        cmd_q.put(("stop",))
    finally:
        join_or_stop(proc, timeout=15)
