"""Bodies of helper processes for swarm tests: each runs real hivemind parts and obeys commands from a queue.

They are started with :func:`tests.utils.processes.spawn` and answer on ``res_q`` as ``(tag, payload)``; queues
between a test and its helpers are test scaffolding, not a wire (the parts under test use msgpack on the wire).
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import queue as queue_module
import time
from typing import Any

TRANSPORT_RUN = "run-transport"
"""Run id of the transport test peers."""


def records_peer(initial_peers: list[str], key_path: str, run_id: str, cmd_q: mp.Queue, res_q: mp.Queue) -> None:
    """A peer with its own DHT: publishes/fetches records and runs a heartbeat on command."""
    import hivemind

    from swarm.control.records import SwarmRecords
    from swarm.net.dht_shutdown import stop_dht
    from swarm.net.identity import ensure_identity, load_identity
    from swarm.wire import PeerRecord, PeerState

    ensure_identity(key_path)
    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key_path,
                       start=True)
    records = SwarmRecords(dht, load_identity(key_path), run_id)
    heartbeat = None
    res_q.put(("ready", str(dht.peer_id)))
    try:
        while True:
            cmd, *args = cmd_q.get(timeout=120)
            if cmd == "stop":
                break
            if cmd == "publish_peer":
                stage, ttl = args
                record = PeerRecord(peer_id=records.identity.peer_id, stage=stage, seconds_per_layer=0.02,
                                    memory_slots=3, links={"QmOther": (0.001, 2e8)}, state=PeerState.ONLINE)
                res_q.put(("published", records.publish_peer(record, ttl=ttl, timeout=10)))
            elif cmd == "heartbeat":
                period, ttl = args
                record = PeerRecord(peer_id=records.identity.peer_id, stage=1, seconds_per_layer=0.02,
                                    memory_slots=3, state=PeerState.ONLINE)
                heartbeat = records.start_heartbeat(lambda r=record: r, period=period, ttl=ttl)
                res_q.put(("heartbeat", True))
            elif cmd == "stop_heartbeat":
                (leave,) = args
                heartbeat.stop(leave=leave)
                res_q.put(("heartbeat_stopped", heartbeat.beats))
            elif cmd == "fetch":
                coordinator, signers = args
                spec = records.fetch_run_spec(coordinator=coordinator, timeout=10)
                sched = records.fetch_schedule(signers=signers, timeout=10)
                res_q.put(("fetched", (spec, sched)))
    finally:
        if heartbeat is not None:
            heartbeat.stop(leave=False)
        stop_dht(dht)


def transport_peer(key_path: str, initial_peers: list[str], options: dict[str, Any], cmd_q: mp.Queue,
                   res_q: mp.Queue, recv_q: mp.Queue, log_q: mp.Queue) -> None:
    """A peer with a DHT and a Transport: answers commands on ``res_q``, reports a digest of every tensor it
    receives on ``recv_q`` and its warnings on ``log_q``."""
    import hivemind
    import torch

    from swarm.net.dht_shutdown import stop_dht
    from swarm.net.identity import ensure_identity
    from swarm.net.transport import Transport

    class Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            log_q.put(record.getMessage())

    logging.getLogger("swarm").addHandler(Forward(logging.WARNING))
    ensure_identity(key_path)
    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key_path,
                       start=True)
    delay = [0.0]

    def on_receive(sender, header, tensor):
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        recv_q.put((sender, header, str(tensor.dtype), hashlib.sha256(raw).hexdigest()))
        time.sleep(delay[0])

    transport = Transport(dht, on_receive, **options)
    res_q.put(("ready", ([str(m) for m in dht.get_visible_maddrs()], transport.peer_id)))
    try:
        while True:
            try:
                cmd, *args = cmd_q.get(timeout=120)
            except queue_module.Empty:
                break
            if cmd == "stop":
                break
            if cmd == "delay":
                delay[0] = args[0]
                res_q.put(("delay", args[0]))
            elif cmd == "stats":
                res_q.put(("stats", transport.stats()))
    finally:
        transport.shutdown()
        stop_dht(dht)


def averaging_peer(idx: int, initial_peers: list[str], barrier: Any, res_q: mp.Queue,
                   rounds: list[tuple], group_size: int = 3, next_chunk_timeout: float | None = None,
                   run_id: str = "run-avg", columns: int = 1000) -> None:
    """One member of a stage group: for each (value, weight[, drifted]) in ``rounds`` fills its gradient (a 3 x
    ``columns`` and a 7-element tensor) and averages, telling the round whether it `drifted`; where the round asks
    for it (`resync`), then averages those tensors again as its whole state would be (a group of its own).
    Answers, per round: (result, a few of the values, seconds, every distinct value, every distinct value after
    the resync or None)."""
    mp.set_start_method("fork", force=True)  # hivemind's averager is an mp.Process that cannot be pickled
    import hivemind
    import torch

    from swarm.net.dht_shutdown import stop_dht
    from swarm.stage_group.hivemind_averager import StageAverager

    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    grads = [torch.zeros(3, columns), torch.zeros(7)]
    options = {} if next_chunk_timeout is None else {"next_chunk_timeout": next_chunk_timeout}
    averager = StageAverager(dht, run_id=run_id, stage=1, tensors=grads, min_matchmaking_time=1.0,
                             target_group_size=group_size, **options)
    state = None
    distinct = lambda: torch.cat([g.view(-1) for g in grads]).unique().tolist()  # noqa: E731
    results = []
    try:
        for value, weight, *drifted in rounds:
            for g in grads:
                g.fill_(value)
            barrier.wait(timeout=60)
            start = time.perf_counter()
            result = averager.average(grads, weight, timeout=20, drifted=bool(drifted and drifted[0]))
            seconds, after = time.perf_counter() - start, distinct()
            resynced = None
            if result.resync:
                state = state or StageAverager(dht, run_id=run_id, stage=1, tensors=grads, min_matchmaking_time=1.0,
                                               target_group_size=result.group_size, name="state")
                state.average(grads, 1.0, timeout=20)
                resynced = distinct()
            results.append((result, grads[0].view(-1)[:2].tolist() + grads[1][:1].tolist(), seconds, after,
                            resynced))
        res_q.put((idx, results))
        barrier.wait(timeout=60)
    finally:
        averager.shutdown()
        if state is not None:
            state.shutdown()
        stop_dht(dht)


def frozen_averaging_peer(initial_peers: list[str], barrier: Any, res_q: mp.Queue, run_id: str,
                          columns: int) -> None:
    """A member of stage 1's group that joins one round and then goes silent, as a frozen host does: the averager a
    StageAverager runs, asked for a round that waits for a trigger, which never comes once the group is found.
    """
    mp.set_start_method("fork", force=True)
    import hivemind
    import torch
    from hivemind.averaging.control import AveragingStage

    from swarm.net.dht_shutdown import stop_dht
    from swarm.stage_group.hivemind_averager import GroupAverager

    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    prefix = f"skippipe/{run_id}/stage1/avg"  # a StageAverager's for stage 1
    averager = GroupAverager([torch.zeros(3, columns), torch.zeros(7)], dht, received=mp.Value("d", 1.0),
                             prefix=prefix, start=True, target_group_size=3, min_matchmaking_time=1.0,
                             request_timeout=1.0)
    try:
        # looking for the group first, so that the others join it: it then waits for a trigger that never comes
        control = averager.step(weight=1.0, gather={"weight": 1.0, "drifted": False}, timeout=20,
                                require_trigger=True, wait=False)
        barrier.wait(timeout=60)
        end = time.monotonic() + 20
        while control.stage == AveragingStage.LOOKING_FOR_GROUP and time.monotonic() < end:
            time.sleep(0.05)
        res_q.put(("frozen", control.stage.name))
        barrier.wait(timeout=60)  # until the others are done
    finally:
        averager.shutdown()
        stop_dht(dht)


def session_peer(idx: int, initial_peers: list[str], barrier: Any, res_q: mp.Queue, alone_first: bool) -> None:
    """A member of stage 1's group as a peer runs it (`StageSession` over a real worker, hivemind averaging): two
    iterations of backward on its own data, averaging, one step and the resync the round may ask for. In the first,
    `alone_first` looks for a group of two that never forms (its mate does not average that iteration) and steps on
    its own gradient; its mate steps on its own too, as a group of one. Answers, per iteration: (the SHA-256 of its
    state, whether it counts itself drifted, whether its state was resynced)."""
    mp.set_start_method("fork", force=True)  # hivemind's averager is an mp.Process that cannot be pickled
    import hivemind
    import torch

    from peers.optim import OptimConfig
    from peers.worker import StageWorker
    from swarm.net.dht_shutdown import stop_dht
    from swarm.peer.stage_session import StageSession
    from swarm.stage_group.state_transfer import state_digest, state_parts
    from tests.peers.peers_util import MICRO

    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    worker = StageWorker(f"p{idx}", 1, MICRO, (2, 2), OptimConfig(), seed=1)
    session = StageSession(1, worker, run_id="run-session", dht=lambda: dht)
    gen = torch.Generator().manual_seed(idx)
    out = []
    try:
        for iteration in range(2):
            x = torch.randn(2, 8, MICRO.dim, generator=gen)
            y = worker.forward(0, x)
            worker.backward(0, torch.randn(y.shape, generator=gen))
            if iteration == 0 and not alone_first:
                barrier.wait(timeout=60)  # its mate's round times out first
                session.average_with_hivemind(1, timeout=5)
            else:
                session.average_with_hivemind(2, timeout=5 if iteration == 0 else 20)
                if iteration == 0:
                    barrier.wait(timeout=60)
            worker.step()
            resynced = session.resync_state(20)
            out.append((state_digest(*state_parts(worker), worker.steps).hex(), session.drifted, resynced))
            barrier.wait(timeout=60)
        res_q.put((idx, out))
    finally:
        session.close()
        stop_dht(dht)


def left_out_session_peer(idx: int, initial_peers: list[str], res_q: mp.Queue, left_out: bool) -> None:
    """A member of stage 1's group (`StageSession` over a real worker, hivemind averaging) that runs `idx + 1`
    microbatches of its own, then averages with its mate, `left_out` or not. Answers (its own mean gradient, the
    gradient it installed, both as lists, and what the round returned: (visits, members heard))."""
    mp.set_start_method("fork", force=True)  # hivemind's averager is an mp.Process that cannot be pickled
    import hivemind
    import torch

    from peers.optim import OptimConfig
    from peers.worker import StageWorker
    from swarm.net.dht_shutdown import stop_dht
    from swarm.peer.stage_session import StageSession
    from swarm.stage_group.allgather import flatten
    from tests.peers.peers_util import MICRO

    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    worker = StageWorker(f"p{idx}", 1, MICRO, (2, 2), OptimConfig(), seed=1)
    session = StageSession(1, worker, run_id="run-left-out", dht=lambda: dht)
    gen = torch.Generator().manual_seed(idx)
    try:
        for mb in range(idx + 1):
            y = worker.forward(mb, torch.randn(2, 8, MICRO.dim, generator=gen))
            worker.backward(mb, torch.randn(y.shape, generator=gen))
        sums = worker.gradient_sums()
        own = flatten(sums) / worker.visits
        result = session.average_with_hivemind(2, timeout=30, left_out=left_out)
        installed = flatten({name: p.grad for name, p in worker.module.named_parameters()})
        res_q.put((idx, (own.tolist(), installed.tolist(), result)))
    finally:
        session.close()
        stop_dht(dht)
