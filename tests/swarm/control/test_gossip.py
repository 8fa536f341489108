"""Gossip control plane between real sidecars on loopback (py-libp2p GossipSub in child processes).

A line of four owners A - B - C - D (each connected only to its neighbours) carries messages over up to three
hops; a hostile libp2p peer and garbage on the owner pipe are dropped with a log line while delivery goes on; every
sidecar is gone after close, and exits by itself when its owner dies.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import psutil
import pytest

from swarm.control.gossip import (
    FRAME_HEADER,
    MAX_FRAME_BYTES,
    MAX_PAYLOAD_BYTES,
    FrameError,
    GossipClient,
    GossipError,
    GossipMessage,
    encode_frame,
    membership_topic,
    schedule_topic,
)
from swarm.net.identity import ensure_identity

RUN = "test-gossip"
SCHEDULE, MEMBERSHIP = schedule_topic(RUN), membership_topic(RUN)
REPO = Path(__file__).resolve().parents[3]


@dataclass
class Owner:
    """One owner process's view: its client, key file, sidecar log, and the peer id hivemind derives from the key."""

    name: str
    client: GossipClient
    key_path: str
    log_path: str
    hivemind_id: str = ""
    callback_inbox: queue.Queue | None = None
    info: object = None

    def get(self, timeout: float) -> GossipMessage:
        if self.callback_inbox is None:
            return self.client.receive(timeout)
        try:
            return self.callback_inbox.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None

    def collect(self, until, timeout: float = 5.0, settle: float = 0.0) -> list[GossipMessage]:
        """Messages received until ``until(messages)`` holds (then ``settle`` seconds more), or ``timeout``."""
        got: list[GossipMessage] = []
        deadline = time.monotonic() + timeout
        while not until(got) and time.monotonic() < deadline:
            try:
                got.append(self.get(max(deadline - time.monotonic(), 0.01)))
            except TimeoutError:
                break
        end = time.monotonic() + settle
        while time.monotonic() < end:
            try:
                got.append(self.get(max(end - time.monotonic(), 0.01)))
            except TimeoutError:
                break
        return got

    def drain(self) -> list[GossipMessage]:
        return self.collect(lambda got: False, timeout=0.05)


@dataclass
class Line:
    owners: list[Owner] = field(default_factory=list)

    def __getitem__(self, name: str) -> Owner:
        return next(owner for owner in self.owners if owner.name == name)


def hivemind_peer_ids(paths: list[str]) -> subprocess.Popen:
    """Peer ids as hivemind derives them from key files, in a child (hivemind and libp2p never share a process)."""
    code = ("import sys; from hivemind.p2p.p2p_daemon_bindings.datastructures import PeerID; "
            "print(' '.join(PeerID.from_identity(open(p, 'rb').read()).to_base58() for p in sys.argv[1:]))")
    return subprocess.Popen([sys.executable, "-c", code, *paths], stdout=subprocess.PIPE, text=True)


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts: reaped here if it is our child)."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return True
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return True


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if not gone(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def read_json_line(proc: subprocess.Popen, timeout: float) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"helper process {proc.pid} printed nothing within {timeout} s"
    line = proc.stdout.readline()
    assert line, f"helper process {proc.pid} exited with code {proc.wait(5)}"
    return json.loads(line)


def stop_helper(proc: subprocess.Popen) -> None:
    if proc.stdin:
        proc.stdin.close()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def line(tmp_path_factory):
    """Owners A - B - C - D on loopback, subscribed to both run topics; D takes messages through a callback."""
    tmp = tmp_path_factory.mktemp("gossip")
    owners = []
    for name in "ABCD":
        inbox = queue.Queue() if name == "D" else None
        client = GossipClient(on_message=inbox.put if inbox is not None else None)
        owners.append(Owner(name, client, str(tmp / f"{name}.key"), str(tmp / f"{name}.log"), callback_inbox=inbox))
    ids = [ensure_identity(owner.key_path) for owner in owners]
    hivemind = hivemind_peer_ids([owner.key_path for owner in owners])
    try:
        with ThreadPoolExecutor(3) as pool:
            infos = list(pool.map(lambda o: o.client.start(o.key_path, log_path=o.log_path), owners[:3]))
        for owner in owners[:3]:
            owner.client.subscribe(SCHEDULE)
            owner.client.subscribe(MEMBERSHIP)
        for left, right in zip(infos[:2], owners[1:3], strict=True):
            assert right.client.connect(left.maddrs[0]) == left.peer_id
        d = owners[3]  # joins through a bootstrap address, as a peer does
        infos.append(d.client.start(d.key_path, log_path=d.log_path, bootstrap=[infos[2].maddrs[0]]))
        d.client.subscribe(SCHEDULE)
        d.client.subscribe(MEMBERSHIP)
        for owner, info, key_id, hivemind_id in zip(owners, infos, ids, hivemind.communicate(timeout=60)[0].split(),
                                                    strict=True):
            owner.info, owner.hivemind_id = info, hivemind_id
            assert info.peer_id == key_id == hivemind_id
        for topic in (SCHEDULE, MEMBERSHIP):
            for owner, neighbours in zip(owners, (1, 2, 2, 1), strict=True):
                owner.client.wait_for_mesh(topic, neighbours, timeout=10)
        yield Line(owners)
    finally:
        pids = [owner.client.pid for owner in owners if owner.client.pid is not None]
        for owner in owners:
            owner.client.close()
        assert wait_gone(pids, 5) == []


@pytest.mark.timeout(30)
def test_every_owner_gets_every_message_with_its_sender(line):
    for owner in line.owners:
        owner.drain()
    for owner in line.owners:  # A's message crosses three hops to D, D's three to A
        owner.client.publish(SCHEDULE, {"epoch": 7, "from": owner.name, "blob": b"\x00\xff" * 100})
    line["B"].client.publish(MEMBERSHIP, {"event": "join", "stage": 1}, wait=False).result(5)
    for owner in line.owners:
        others = {o.name for o in line.owners} - {owner.name}
        expected = len(others) + (owner.name != "B")
        got = owner.collect(lambda got, expected=expected: len(got) >= expected, settle=0.2)
        schedules = sorted((m for m in got if m.topic == SCHEDULE), key=lambda m: m.payload["from"])
        assert [m.payload["from"] for m in schedules] == sorted(others)  # each once, none of its own
        for message in schedules:
            publisher = line[message.payload["from"]]
            assert message.sender == publisher.hivemind_id == publisher.info.peer_id
            assert message.payload == {"epoch": 7, "from": publisher.name, "blob": b"\x00\xff" * 100}
        membership = [m for m in got if m.topic == MEMBERSHIP]
        expected = [] if owner.name == "B" else [({"event": "join", "stage": 1}, line["B"].hivemind_id)]
        assert [(m.payload, m.sender) for m in membership] == expected


HOSTILE_PEER = '''
"""A hostile GossipSub peer: connects to one sidecar and sends it a valid message, then garbage of every kind."""
import json
import sys

import msgpack
import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
from libp2p.tools.anyio_service import background_trio_service


async def main(target_maddr, topic, victim, oversize):
    key_pair = create_new_key_pair()
    host = new_host(key_pair=key_pair)
    gossipsub = GossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                          heartbeat_interval=0.5, spam_protection_enabled=False, adaptive_gossip_enabled=False)
    pubsub = Pubsub(host, gossipsub, strict_signing=False)
    seqnos = iter(range(1, 1000))

    def message(data, sign=True, from_id=None):
        msg = rpc_pb2.Message(data=data, topicIDs=[topic], from_id=from_id or host.get_id().to_bytes(),
                              seqno=next(seqnos).to_bytes(8, "big"))
        if sign:
            msg.signature = key_pair.private_key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
            msg.key = key_pair.public_key.serialize()
        return msg

    target = info_from_p2p_addr(multiaddr.Multiaddr(target_maddr))
    plain_key_pair = create_new_key_pair()
    plain_host = new_host(key_pair=plain_key_pair, sec_opt={PLAINTEXT_PROTOCOL_ID: InsecureTransport(plain_key_pair)})
    async with plain_host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        try:
            with trio.fail_after(10):
                await plain_host.connect(target)
            plaintext = "connected"
        except Exception as e:
            plaintext = type(e).__name__
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        async with background_trio_service(pubsub), background_trio_service(gossipsub):
            await pubsub.wait_until_ready()
            with trio.fail_after(20):
                await host.connect(target)
                await pubsub.subscribe(topic)
                while target.peer_id not in pubsub.peer_topics.get(topic, ()):
                    await trio.sleep(0.02)
            for msg in [
                message(msgpack.packb({"n": "first"})),
                message(msgpack.packb({"n": "unsigned"}), sign=False),
                message(msgpack.packb({"n": "forged"}), from_id=ID.from_base58(victim).to_bytes()),
                message(b"\\xc1 not msgpack"),
                message(msgpack.packb(["not", "a", "map"])),
                message(msgpack.packb({"n": "x" * oversize})),
                message(msgpack.packb({"n": "last"})),
            ]:  # straight onto the wire: our own pubsub would not relay these
                gossipsub.send_rpc(target.peer_id, rpc_pb2.RPC(publish=[msg]))
            await trio.sleep(0.3)
            stream = await host.new_stream(target.peer_id, [PROTOCOL_ID_V11])
            await stream.write(bytes([20]) + b"\\xff" * 20)  # a length-prefixed RPC that is not protobuf
            await trio.sleep(0.3)
            print(json.dumps({"peer_id": host.get_id().to_base58(), "plaintext": plaintext}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)


trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
'''


@pytest.mark.timeout(40)
def test_hostile_peer_is_dropped_and_delivery_goes_on(line, tmp_path):
    a, b, c, d = line.owners
    for owner in line.owners:
        owner.drain()
    script = tmp_path / "hostile_peer.py"
    script.write_text(HOSTILE_PEER)
    hostile = subprocess.Popen([sys.executable, str(script), b.info.maddrs[0], SCHEDULE, a.info.peer_id,
                                str(MAX_PAYLOAD_BYTES)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        report = read_json_line(hostile, timeout=30)
        hostile_id = report["peer_id"]
        assert report["plaintext"] != "connected", "the sidecar accepted an unencrypted, unauthenticated connection"
        for owner in line.owners:  # only the two valid messages, relayed by B to the whole line
            got = owner.collect(lambda got: len(got) >= 2, settle=0.3)
            delivered = sorted((m.sender, m.payload.get("n", repr(m.payload))) for m in got)
            assert delivered == [(hostile_id, "first"), (hostile_id, "last")]
        log = Path(b.log_path).read_text()
        for reason in ["unsigned", "bad signature, or signing key is not the sender's", "payload is not valid msgpack",
                       "payload must be a msgpack map", f"more than MAX_PAYLOAD_BYTES={MAX_PAYLOAD_BYTES}",
                       "dropped the pubsub stream of " + hostile_id]:
            assert reason in log, f"B did not log {reason!r}"
        assert psutil.Process(b.client.pid).is_running()
        a.client.publish(SCHEDULE, {"after": "hostile"})
        d.client.publish(MEMBERSHIP, {"after": "hostile"})
        assert [m.payload for m in d.collect(lambda got: len(got) >= 1)] == [{"after": "hostile"}]
        assert [m.payload for m in a.collect(lambda got: len(got) >= 1)] == [{"after": "hostile"}]
    finally:
        stop_helper(hostile)


@pytest.mark.timeout(30)
@pytest.mark.timeout(60)
def test_messages_near_the_size_limit_cross_every_hop_back_to_back(line):
    """Flow control over several windows' worth: each message is larger than half a yamux window, the point where
    a receiver hands the window back."""
    a, d = line["A"], line["D"]
    for owner in line.owners:
        owner.drain()
    blobs = [bytes([i]) * (MAX_PAYLOAD_BYTES - 4096) for i in range(4)]
    futures = [a.client.publish(SCHEDULE, {"n": i, "blob": blob}, wait=False) for i, blob in enumerate(blobs)]
    for future in futures:
        future.result(10)
    got = d.collect(lambda got: len(got) >= len(blobs), timeout=30)
    assert sorted(m.payload["n"] for m in got) == list(range(len(blobs)))  # three hops away, each once
    assert all(m.payload["blob"] == blobs[m.payload["n"]] and m.sender == a.info.peer_id for m in got)


def test_garbage_on_the_pipe_is_refused_and_delivery_goes_on(line):
    a, b, c, d = line.owners
    for owner in line.owners:
        owner.drain()
    refusals_before = Path(b.log_path).read_text().count("dropped a request from the owner")
    garbage = [
        FRAME_HEADER.pack(5) + b"\xc1\xc1\xc1\xc1\xc1",  # not msgpack
        encode_frame(["not", "a", "map"]),
        encode_frame({"op": "publish", "id": 10**6, "topic": 5, "payload": b""}),
        encode_frame({"op": "publish", "id": 10**6 + 1, "topic": SCHEDULE, "payload": b"\xc1 not msgpack"}),
        encode_frame({"op": "publish", "id": True, "topic": SCHEDULE, "payload": msgpack.packb({"n": "bool id"})}),
        encode_frame({"op": "explode", "id": 10**6 + 2}),
        encode_frame({"op": "connect", "id": 10**6 + 3, "maddr": "/ip4/127.0.0.1/tcp/1", "timeout": 1.0}),
        FRAME_HEADER.pack(0),
        FRAME_HEADER.pack(MAX_FRAME_BYTES + 1) + bytes(MAX_FRAME_BYTES + 1),
    ]
    with b.client._send_lock:  # raw bytes on the owner's end of the pipe, as a buggy owner would send
        for frame in garbage:
            b.client._sock.sendall(frame)
    assert b.client.status()["peer_id"] == b.info.peer_id  # answers again once it has read past the garbage
    deadline = time.monotonic() + 5
    while (refusals := Path(b.log_path).read_text().count("dropped a request from the owner") - refusals_before) \
            < len(garbage) and time.monotonic() < deadline:
        time.sleep(0.05)  # connect requests are served in a task of their own
    assert refusals == len(garbage)
    b.client.publish(SCHEDULE, {"after": "garbage"})
    for owner in (a, c, d):  # the only message that went out is the real one
        assert [m.payload for m in owner.collect(lambda got: False, timeout=0.5)] == [{"after": "garbage"}]
    # the owner-side API refuses bad input before it reaches the pipe
    with pytest.raises(FrameError):
        b.client.publish(SCHEDULE, ["not", "a", "dict"])
    with pytest.raises(FrameError):
        b.client.publish(SCHEDULE, {"big": bytes(MAX_PAYLOAD_BYTES)})
    with pytest.raises(FrameError):
        b.client.subscribe("")
    with pytest.raises(GossipError, match="bad multiaddr"):
        b.client.connect("/ip4/127.0.0.1/tcp/1")


def test_connect_all_dials_together_and_a_silent_peer_costs_one_timeout(line, tmp_path):
    d, c = line["D"], line["C"]
    # listening sockets that never speak: a frozen host's sidecar, as a dial sees it
    silent = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    refused = socket.create_server(("127.0.0.1", 0))
    refused_port = refused.getsockname()[1]
    refused.close()  # nothing listens there: a dead peer whose record outlives it
    ids = [ensure_identity(str(tmp_path / f"k{i}.key")) for i in range(3)]
    maddrs = [c.info.maddrs[0]] + [f"/ip4/127.0.0.1/tcp/{s.getsockname()[1]}/p2p/{ids[i]}"
                                   for i, s in enumerate(silent)] + \
        [f"/ip4/127.0.0.1/tcp/{refused_port}/p2p/{ids[2]}", "/ip4/127.0.0.1/tcp/1"]  # the last one malformed
    try:
        start = time.monotonic()
        linked = d.client.connect_all(maddrs, timeout=2.0)
        took = time.monotonic() - start
    finally:
        for sock in silent:
            sock.close()
    assert linked == {maddrs[0]: c.info.peer_id, **{m: None for m in maddrs[1:]}}
    assert took < 3.5, took  # the two silent ones timed out together (one after the other: 4 s at least)
    with pytest.raises(FrameError):
        d.client.connect_all([maddrs[0], ""])


@pytest.mark.timeout(30)
def test_close_stops_the_sidecar_by_pid(tmp_path):
    key = str(tmp_path / "peer.key")
    ensure_identity(key)
    with GossipClient() as client:
        client.start(key, log_path=str(tmp_path / "sidecar.log"))
        pid = client.pid
        assert pid in [p.pid for p in psutil.Process().children()]
        client.subscribe(SCHEDULE)
    assert wait_gone([pid], 1) == []  # close() waited for it
    with pytest.raises(GossipError):
        client.publish(SCHEDULE, {"too": "late"})
    with pytest.raises(GossipError):
        client.receive(timeout=1)


OWNER = '''
import json, os, sys, time
from swarm.control.gossip import GossipClient
client = GossipClient()
client.start(sys.argv[1], log_path=sys.argv[2])
child = os.fork()  # a forked child inherits the owner's end of the pipe, as hivemind's forked processes do
if child == 0:
    time.sleep(60)
    os._exit(0)
print(json.dumps({"sidecar": client.pid, "child": child}), flush=True)
time.sleep(60)
'''


@pytest.mark.timeout(30)
def test_sidecar_exits_when_its_owner_dies(tmp_path):
    key = str(tmp_path / "peer.key")
    ensure_identity(key)
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(OWNER), key, str(tmp_path / "sidecar.log")],
                             stdout=subprocess.PIPE, text=True, cwd=REPO)
    pids = {}
    try:
        pids = read_json_line(owner, timeout=20)
        os.kill(owner.pid, signal.SIGKILL)  # no atexit, no close(): the sidecar must notice by itself
        owner.wait(5)
        assert wait_gone([pids["sidecar"]], 5) == [], "sidecar outlived its owner"
        assert f"owner {owner.pid} is gone" in (tmp_path / "sidecar.log").read_text()
    finally:
        for pid in (pids.get("child"), pids.get("sidecar")):
            if pid is not None and not gone(pid):
                os.kill(pid, signal.SIGKILL)
        if owner.poll() is None:
            owner.kill()
            owner.wait(5)
        if pids.get("child") is not None:
            wait_gone([pids["child"]], 5)


@pytest.mark.timeout(30)
def test_failed_start_is_fast_and_leaves_nothing(tmp_path):
    key = tmp_path / "garbage.key"
    key.write_bytes(b"\x08\x00\x12\x03abc")  # RSA key type, 3 bytes of "DER"
    client = GossipClient()
    started = time.monotonic()
    with pytest.raises(GossipError, match="exited"):
        client.start(str(key), log_path=str(tmp_path / "bad-key.log"))
    assert time.monotonic() - started < 10
    assert wait_gone([client.pid], 1) == []
    assert "cannot load identity" in (tmp_path / "bad-key.log").read_text()

    good_key, nobody = str(tmp_path / "peer.key"), ensure_identity(str(tmp_path / "nobody.key"))
    ensure_identity(good_key)
    client = GossipClient()
    with pytest.raises(GossipError, match="could not reach any"):  # nothing listens on port 1
        client.start(good_key, bootstrap=[f"/ip4/127.0.0.1/tcp/1/p2p/{nobody}"], log_path=str(tmp_path / "s.log"))
    assert wait_gone([client.pid], 1) == []


@pytest.mark.timeout(30)
def test_import_boundaries():
    """The owner side never loads libp2p; the sidecar never loads hivemind or torch (they cannot share a process),
    nor numpy (a sidecar starts for every peer: the planner's imports are not its to pay)."""
    code = ("import sys; import swarm.control.gossip; a = 'libp2p' in sys.modules; "
            "import swarm.control.gossip_sidecar; "
            "print(a, sorted({'hivemind', 'torch', 'numpy'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=25, cwd=REPO)
    assert out.stdout.split() == ["False", "[]"], out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_hub_reaches_every_peer_linked_only_to_it(tmp_path):
    """The coordinator's sidecar is every joiner's only link until it is admitted: with more such peers than
    GossipSub's usual mesh degree (12), every one of them must still get every message the hub publishes (py-libp2p
    delivers only along mesh links, so a hub that pruned its mesh to 6 reached 6 of 16)."""
    spokes = 14
    inboxes = [queue.Queue() for _ in range(spokes)]
    hub, clients = GossipClient(), [GossipClient(on_message=inbox.put) for inbox in inboxes]
    keys = [str(tmp_path / f"{i}.key") for i in range(spokes + 1)]
    for key in keys:
        ensure_identity(key)
    try:
        info = hub.start(keys[0], log_path=str(tmp_path / "hub.log"))
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: clients[i].start(keys[i + 1], bootstrap=[info.maddrs[0]],
                                                     log_path=str(tmp_path / f"{i}.log")), range(spokes)))
        for client in (hub, *clients):
            client.subscribe(SCHEDULE)
        hub.wait_for_mesh(SCHEDULE, spokes, timeout=60)
        for i in range(3):
            hub.publish(SCHEDULE, {"i": i})
        for n, inbox in enumerate(inboxes):
            got = set()
            end = time.monotonic() + 20
            while len(got) < 3 and time.monotonic() < end:
                try:
                    got.add(inbox.get(timeout=max(0.1, end - time.monotonic())).payload["i"])
                except queue.Empty:
                    break
            assert got == {0, 1, 2}, f"spoke {n} got {sorted(got)} of the hub's 3 messages"
    finally:
        pids = [c.pid for c in (hub, *clients) if c.pid is not None]
        for c in (hub, *clients):
            c.close()
        assert wait_gone(pids, 10) == []
