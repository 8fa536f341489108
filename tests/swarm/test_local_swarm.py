"""End to end: a coordinator and 6 peers as real processes on loopback (DHT, p2pd, gossip sidecars).

One run, several checks: it trains (loss falls), same-stage peers hold bit-identical weights after every
averaging, hostile input is refused and logged while training goes on, the loss matches the in-process
swarm on the same schedule and data, and every process is gone afterwards.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from hivemind.utils import get_dht_time

from peers.checkpoint import PEER_MANIFEST, resolve_checkpoint
from swarm.control.records import record_key
from swarm.local.local_swarm import LocalSwarm
from swarm.net.dht_shutdown import stop_dht
from swarm.net.transport import TransportError
from swarm.wire import Direction, HopHeader, PeerRecord, ScheduleMsg
from tests.utils.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

RUN = "e2e"
ITERATIONS = 20
PEERS = 6
JOIN_STEPS = ("start", "dht", "spec", "gossip", "data", "speed", "heartbeat", "links", "admission", "records",
              "probes", "placement", "stage")
COORDINATOR_ARGS = ["--iterations", str(ITERATIONS), "--min-peers", str(PEERS), "--stages", "3", "--skip", "0.33",
                    "--seed", "0", "--microbatches", "2", "--checkpoint-every", "10"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The local swarm, started; hostile input is injected by the test while it trains."""
    run_dir = tmp_path_factory.mktemp("local-swarm")
    peer_args = [["--log-param-digest", "--iteration-deadline", "120", "--checkpoint-dir", str(run_dir / f"ckpt-{i}")]
                 for i in range(PEERS)]
    peer_args.append(["--token", "not-this-runs-token-0123456789"])  # a volunteer with the wrong join token
    swarm = LocalSwarm(run_dir, PEERS + 1, run_id=RUN, coordinator_args=COORDINATOR_ARGS, peer_args=peer_args)
    try:
        swarm.start()
        yield swarm
    finally:
        swarm.stop()
        alive = [p.pid for p in swarm.processes if p.poll() is None]
        assert not alive, f"processes left running: {alive}"




class Intruder:
    """A hostile participant: a real DHT node and p2pd of its own, joined to the run."""

    def __init__(self, initial_peers: list[str], key: str) -> None:
        import hivemind

        from swarm.control.records import SwarmRecords
        from swarm.net.identity import ensure_identity, load_identity
        from swarm.net.transport import Transport

        self.peer_id = ensure_identity(key)
        self.key = key
        self.dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key,
                                start=True)
        self.records = SwarmRecords(self.dht, load_identity(key), RUN)
        self.transport = Transport(self.dht, lambda *m: None)

    def raw(self, peer_id: str, payload: bytes) -> bytes:
        """Write `payload` on a hop stream; whatever the receiver answers (b"" if it closed the stream first)."""
        from hivemind.p2p import PeerID

        from swarm.net.transport import HOP_PROTOCOL

        async def go():
            _, reader, writer = await self.transport._p2p.call_binary_stream_handler(PeerID.from_base58(peer_id),
                                                                                    HOP_PROTOCOL)
            try:
                writer.write(payload)
                await writer.drain()
                return await asyncio.wait_for(reader.read(4096), 10)
            except ConnectionError:  # closed (or reset) under the write: nothing was read
                return b""
            finally:
                writer.close()

        return asyncio.run_coroutine_threadsafe(go(), self.transport._loop).result(30)

    def close(self) -> None:
        self.transport.shutdown()
        stop_dht(self.dht)


def test_local_swarm_trains_refuses_hostile_input_and_keeps_stages_identical(run, tmp_path):
    from swarm.control.gossip import GossipClient, membership_topic, schedule_topic
    from swarm.control.messages import Join, ScheduleNotice, publish

    schedule = wait_for(run.schedule, 120, "no schedule was planned")
    wait_for(lambda: len(run.metrics()) >= 2, 120, "training did not start")
    intruder = Intruder(run.initial_peers, str(tmp_path / "intruder.key"))
    stranger = run.peers[PEERS]  # the volunteer with the wrong join token
    gossip = GossipClient()
    try:
        route = next(r for r in schedule["routes"] if r["peers"])
        relay = route["peers"][0]
        # 1-2. malformed msgpack, an oversized tensor: a stranger's streams are closed before a byte is read
        assert intruder.raw(relay, (3).to_bytes(4, "big") + b"\xc1\xc1\xc1") == b""
        huge = HopHeader(run=RUN, iteration=0, microbatch=0, route=(route["origin"], relay), hop=1,
                         direction=Direction.FORWARD, epoch=0, dtype="float32", shape=(2**20, 2**20))
        body = huge.to_msgpack()
        assert intruder.raw(relay, len(body).to_bytes(4, "big") + body) == b""
        # 3. a well-formed activation for a real microbatch, from a stranger
        upcoming = len(run.metrics()) + 1
        fake = HopHeader(run=RUN, iteration=upcoming, microbatch=route["microbatch"],
                         route=(route["origin"], *route["peers"]), hop=1, direction=Direction.FORWARD, epoch=0,
                         dtype="", shape=(), stages=(0, *route["stages"]))
        with pytest.raises(TransportError):
            intruder.transport.send(relay, fake, torch.zeros(8, 64, 128))
        # 4. a forged peer record (signed by us, claiming another peer) and garbage under our own subkey
        forged = PeerRecord(peer_id=relay, stage=1, seconds_per_layer=1e-9, memory_slots=99)
        intruder.records._store("peer", forged.to_msgpack(), ttl=60, timeout=10)  # honest nodes refuse to store
        intruder.dht.store(record_key(RUN, "peer"), b"\xc1garbage", expiration_time=get_dht_time() + 60,
                           subkey="QmGarbage")
        # 5. a schedule signed by a stranger (not the run's scheduler, not even a member), announced on gossip too
        bogus = dict(schedule, epoch=99)
        intruder.records.publish_schedule(ScheduleMsg(epoch=99, schedule=bogus))
        coordinator = json.loads((run.run_dir / "coordinator.json").read_text())
        gossip.start(intruder.key, bootstrap=[])
        spec = intruder.records.fetch_run_spec(coordinator=coordinator["coordinator"])
        for addr in spec.control_addrs:
            gossip.connect(addr)
        gossip.subscribe(schedule_topic(RUN))
        gossip.wait_for_mesh(schedule_topic(RUN), 1, timeout=30)
        publish(gossip, RUN, ScheduleNotice(epoch=99))  # well-formed, but not from the scheduler
        gossip.publish(schedule_topic(RUN), {"epoch": 99})  # not a control message at all
        # 6. a Join in its own name without a token (its record is refused: it hears why from its Join), and one in
        # a member's name (ignored: the gossip layer names the sender)
        gossip.subscribe(membership_topic(RUN))
        gossip.wait_for_mesh(membership_topic(RUN), 1, timeout=30)
        publish(gossip, RUN, Join(peer=intruder.peer_id, sent=get_dht_time()))
        publish(gossip, RUN, Join(peer=relay, admission=b"0" * 64, sent=get_dht_time()))
        assert coordinator["coordinator"] != intruder.peer_id

        # the volunteer with the wrong token was refused admission, said so and exited: it is no peer of the run
        assert stranger.wait(timeout=60) != 0
        told = (run.run_dir / f"peer-{PEERS:02d}.out").read_text()
        assert "refused this peer: its join token is not this run's" in told and "Traceback" not in told, told
        run.peers.remove(stranger)
        records = run.watch(ITERATIONS, timeout=180)
        for proc in run.peers:  # after the last commit each peer averages, steps, logs and leaves by itself
            proc.wait(timeout=60)
    finally:
        gossip.close()
        intruder.close()

    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1))
    assert records[-1]["loss"] < records[0]["loss"] - 0.3, records
    assert all(r["epoch"] == 0 for r in records)  # the bogus epoch 99 was never adopted
    # the peers measured their messages' jitter: from probes before the plan, from pipeline messages after it
    assert len(schedule["meta"]["costs"]["jitter"]) >= 16
    jitter = records[-1]["jitter_ms"]
    assert len(jitter) == 16 and jitter == sorted(jitter) and jitter[0] <= 0 <= jitter[-1]
    intruder_id = intruder.peer_id
    refused = [e["why"] for e in run.events("refused_message", who="peer-*") if e["sender"] == intruder_id]
    assert len(refused) >= 3 and all(why == "stream: sender not admitted" for why in refused), refused
    refusals = {(e["peer"], e["why"]) for e in run.events("refused_peer", who="coordinator")}
    no_token = "it presented no join token (start it with --token)"
    assert {why for _, why in refusals} == {"its join token is not this run's", no_token}, refusals
    assert (intruder_id, no_token) in refusals and not any(peer == relay for peer, _ in refusals), refusals
    assert not run.events("placed", who=f"peer-{PEERS:02d}")
    # each peer said how long its join took, step by step, when it joined and when it was first placed
    for i in range(PEERS):
        (joined,), placed = run.events("joined", who=f"peer-{i:02d}"), run.events("placed", who=f"peer-{i:02d}")[0]
        assert set(JOIN_STEPS) <= set(placed["laps"]) and set(joined["laps"]) < set(placed["laps"]), placed
        assert abs(sum(placed["laps"].values()) - placed["seconds"]) < 0.01 < joined["seconds"] < placed["seconds"]
    ignored = {(e["kind"], e["why"][:12]) for e in run.events("ignored_control", who="peer-*")
               if e["sender"] == intruder_id}
    assert ("ScheduleNotice", "not the run'") in ignored and ("malformed", "control.type") in ignored, ignored
    # the forged peer record, the garbage and the intruder's validly signed schedule never reach a reader: honest DHT
    # nodes neither store nor relay the records of someone the run did not admit (`RecordWriters`)
    records_ignored = [(e["signer"], e["kind"]) for e in run.events("ignored_record")]
    assert not any(signer in (intruder_id, "QmGarbage") for signer, _ in records_ignored), records_ignored

    # same-stage peers hold bit-identical weights after every averaging
    digests: dict[tuple[int, int], set[str]] = defaultdict(set)
    for e in run.events("param_digest", who="peer-*"):
        digests[(e["iteration"], e["stage"])].add(e["digest"])
    placement = schedule["placement"]
    group_sizes = {s: list(placement.values()).count(s) for s in set(placement.values())}
    assert len(digests) == ITERATIONS * len(group_sizes)
    assert all(len(d) == 1 for d in digests.values()), digests

    # every peer wrote its own checkpoint at iterations 10 and 20, loadable without pickle
    from safetensors.torch import load_file

    for i in range(PEERS):
        directory, manifest = resolve_checkpoint(run.run_dir / f"ckpt-{i}", PEER_MANIFEST)
        assert manifest["iteration"] == ITERATIONS and manifest["steps"] == ITERATIONS
        weights = load_file(str(directory / f"stage-{manifest['stage']}.safetensors"))
        assert weights and all(torch.isfinite(t).all() for t in weights.values())
    (run.run_dir / "checked").write_text("ok")


def test_parity_with_the_in_process_swarm(run):
    """Same seed, schedule and data: the networked loss after 20 iterations is within 1% of the in-process one."""
    from peers.data import Corpus
    from peers.inprocess import InProcessSwarm
    from scheduler.schedule import Schedule
    from swarm.run_config import RunConfig

    if not (run.run_dir / "checked").exists():
        pytest.skip("the end-to-end run did not complete")
    networked = run.metrics()
    schedule = Schedule.from_json((run.run_dir / "schedule-0.json").read_text())
    config = RunConfig.from_tables({}, run_id=RUN, iterations=ITERATIONS, min_peers=PEERS, stages=3, skip=0.33,
                                   seed=0, microbatches=2)
    corpus = Corpus.build(config.data)
    swarm = InProcessSwarm(schedule, config.model_config(corpus.vocab_size), config.optim, corpus=corpus,
                           seed=config.seed)
    losses = [swarm.run_iteration().loss for _ in range(ITERATIONS)]
    assert networked[0]["loss"] == pytest.approx(losses[0], rel=1e-4)
    assert networked[-1]["loss"] == pytest.approx(losses[-1], rel=0.01)


def test_hivemind_averaging_keeps_stage_groups_in_agreement(tmp_path):
    """The DecentralizedAverager backend: 5 peers (stage groups of 2), a few iterations; same-stage weights agree
    to float rounding (its butterfly all-reduce applies deltas, so not bit for bit; see below) unless a round of
    theirs was partial, which the peer that got it reports (hivemind keeps a member's own values for a part whose
    reducer failed): then they still differ by no more than the steps could move them."""
    from safetensors.torch import load_file

    config = tmp_path / "run.toml"
    config.write_text('[run]\nstages = 3\nskip = 0.33\nmicrobatches = 2\niterations = 4\nmin_peers = 5\n'
                      'checkpoint_every = 4\n[swarm]\naveraging = "hivemind"\n')
    peer_args = [["--iteration-deadline", "120", "--checkpoint-dir", str(tmp_path / f"ckpt-{i}")] for i in range(5)]
    swarm = LocalSwarm(tmp_path / "run", 5, run_id="hm", coordinator_args=["--config", str(config)],
                       peer_args=peer_args)
    try:
        swarm.start()
        records = swarm.watch(4, timeout=180)
        for proc in swarm.peers:
            proc.wait(timeout=60)
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert not swarm.events("averaging_failed"), swarm.events("averaging_failed")
    by_stage: dict[int, list[dict[str, torch.Tensor]]] = defaultdict(list)
    for i in range(5):
        directory, manifest = resolve_checkpoint(tmp_path / f"ckpt-{i}", PEER_MANIFEST)
        by_stage[manifest["stage"]].append(load_file(str(directory / f"stage-{manifest['stage']}.safetensors")))
    partial = {e["group"] for e in swarm.events("averaging_partial")}
    groups = {stage: g for stage, g in by_stage.items() if len(g) > 1}
    assert groups
    for stage, group in groups.items():
        whole = f"skippipe/hm/stage{stage}/avg" not in partial
        for name, tensor in group[0].items():
            # rounding differences of the butterfly (~1e-7 relative) only show where the group's mean gradient is
            # ~0: AdamW's first steps move such an element by about +-lr whatever its size, so a sign that rounds
            # the other way (rare LM-head rows) costs up to 2 lr per step there; everywhere else the weights agree
            # to float rounding. Without averaging, every element would differ.
            off = ~torch.isclose(tensor, group[1][name], rtol=1e-5, atol=1e-7)
            assert not whole or off.float().mean() < 1e-3, (name, int(off.sum()))
            assert (tensor - group[1][name]).abs().max() <= 4 * 2 * 3e-3, name  # 4 steps at lr <= 3e-3


def test_kill_removes_the_unix_sockets_of_the_process_tree_it_kills(tmp_path):
    """A killed machine cannot clean up: `LocalSwarm.kill` removes the sockets its processes held (found in each
    process's own /proc view, so that peers inside an emulated network namespace are covered as well)."""
    import subprocess
    import sys

    path = tmp_path / "hivemind-test-kill.sock"
    # a p2pd-like socket, and multiprocessing's listener (as its resource sharer opens one) in its temporary directory
    child = (f"import socket, subprocess, sys, time; s = socket.socket(socket.AF_UNIX); s.bind({str(path)!r}); "
             "s.listen(); from multiprocessing.connection import Listener; listener = Listener(family='AF_UNIX'); "
             "print(listener.address, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    listener = Path(proc.stdout.readline().strip())
    assert listener.parent.name.startswith("pymp-") and listener.exists()
    LocalSwarm(tmp_path, 0, run_id="kill").kill(proc)
    assert proc.returncode == -9 and not path.exists()
    assert not listener.exists() and not listener.parent.exists()
